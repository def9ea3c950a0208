"""A third-party MLX program under `clusterctl run`, as a user of another package launches it: a package
installed on the hosts' python with pip (tests/fixtures/mlxdp: `python -m mlxdp train --out DIR --steps N`,
MLX's own data-parallel recipe with nothing of clusterctl), run on 2 loopback hosts with its outputs
fetched home."""
import json
import os
import subprocess
import sys
from functools import partial

import clirun
import pytest

pytestmark = pytest.mark.ssh

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "fixtures", "mlxdp")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The package installed with pip into a directory the hosts' python reads (the inventory's PYTHONPATH)."""
    target = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), PACKAGE],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (target / "mlxdp" / "__main__.py").is_file()
    return str(target)


clusterctl_run = partial(clirun.clusterctl, "run", timeout=300, own_cache=True)


@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_a_module_with_a_subcommand_trains_across_two_hosts_and_its_outputs_come_home(make_cluster, site, tmp_path,
                                                                                     backend):
    cluster = make_cluster(2)
    inventory = cluster.write_inventory(env={"PYTHONPATH": site})
    project = tmp_path / "project"
    project.mkdir()
    # the issue's own line: the module's words, then clusterctl's options at the very end (mlx.launch style)
    r = clusterctl_run("-m", "mlxdp", "train", "--out", "outdir", "--steps", "20", "--hosts", str(inventory),
                       "--fetch", "outdir", "--backend", backend, cwd=project)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.startswith("note: took --hosts") or "\nnote: took --hosts" in r.stderr
    result = json.loads((project / "outdir" / "result.json").read_text())
    assert result["world"] == 2 and result["steps"] == 20 and result["last_loss"] < 0.1 * result["first_loss"]
    assert (project / "outdir" / "weights.safetensors").stat().st_size > 0
    assert "fetched outdir/ (2 file(s)" in r.stderr and "from h1 into ./outdir" in r.stderr
    lines = [line for line in r.stdout.splitlines() if " of 2: loss " in line]
    assert sorted(line.split("]", 1)[0] for line in lines) == ["[rank 0 h1", "[rank 1 h2"]
    # the canonical spelling, clusterctl's options first: the module's own --steps reaches it
    r = clusterctl_run("--hosts", str(inventory), "--backend", backend, "--fetch", "outdir", "-m", "mlxdp", "train",
                       "--out", "outdir", "--steps", "5", cwd=project)
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr
    assert json.loads((project / "outdir" / "result.json").read_text())["steps"] == 5


def test_a_module_missing_on_a_host_is_named_as_missing(make_cluster, site, tmp_path):
    cluster = make_cluster(2)
    inventory = cluster.write_inventory(env={"PYTHONPATH": site})
    r = clusterctl_run("--hosts", str(inventory), "-m", "mlxdp_typo", "train", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "h1: no module named mlxdp_typo for " in r.stderr and "install it on that host" in r.stderr


def test_its_progress_bar_stays_readable_and_its_world_is_checked(make_cluster, site, tmp_path):
    """The same package drawing a \\r bar (2,000 redraws): a few live lines per rank, the final state in both
    the stream and the logs. Asked to init a backend the launch did not start (ring under mpirun), it trains
    each rank alone: run fails, naming both ranks and the cause."""
    cluster = make_cluster(2)
    inventory = cluster.write_inventory(env={"PYTHONPATH": site})
    r = clusterctl_run("--hosts", str(inventory), "--backend", "mpi", "-m", "mlxdp", "train", "--out", "o",
                       "--steps", "20", "--bar", "2000", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    for rank, host in ((0, "h1"), (1, "h2")):
        bar = [line for line in r.stdout.splitlines() if line.startswith(f"[rank {rank} {host}] train ")]
        assert 1 <= len(bar) <= 10 and bar[-1].startswith(f"[rank {rank} {host}] train 100% |####"), bar
    [run_dir] = (tmp_path / "runs").iterdir()
    for rank in (0, 1):
        logged = [line for line in (run_dir / f"rank-{rank}.log").read_text().splitlines() if line.startswith("train ")]
        assert len(logged) == 1 and logged[0].startswith("train 100% |####################| loss"), logged
    r = clusterctl_run("--hosts", str(inventory), "--backend", "mpi", "-m", "mlxdp", "train", "--out", "o",
                       "--steps", "20", "--backend", "ring", cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "rank 0 on h1 and rank 1 on h2 formed a world of 1, not 2" in r.stderr
    assert "asked MLX for the ring backend, but the ranks were started for mpi" in r.stderr
