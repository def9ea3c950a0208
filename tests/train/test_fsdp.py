"""FSDP against data parallel in real multi-process runs: mpirun -np 2 (mpi backend), `clusterctl run` (2
ranks, ring backend, clusterctl's rank starter), and mpirun -np 4 with hybrid fsdp x dp groups. Each run takes a few seconds; the worker
(fsdp_worker.py) trains both ways from the same weights and data and reports the differences.

Tolerance: without max_norm FSDP must match DP bit for bit on 2 ranks (the gradient sums are the same
a+b, AdamW is elementwise). With max_norm the global norm's squares are summed in a different order
(per-shard partial sums, then all_sum), so the clip factor may differ in the last bit and parameters by a
few float32 ulps after 10 steps: measured <= 7e-7 absolute on weights of order 0.1-1, so 1e-5 absolute
catches any real error (a wrong shard or a missing 1/N is off by 1e-2 or more) with margin.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from clusterctl.launch.backends.rankstarter import free_port_block


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATOL = 1e-5


def mpirun(np_: int) -> list[str]:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (tests/run.sh installs openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "--oversubscribe", "-np", str(np_), "-x", "CLUSTERCTL_WORLD_SIZE", "-x", "PYTHONPATH"]


def launch(argv, world: int, tmp_path) -> list[dict]:
    env = {**os.environ, "CLUSTERCTL_WORLD_SIZE": str(world), "PYTHONPATH": REPO}
    r = subprocess.run(argv + [str(tmp_path)] + (["--hybrid"] if world == 4 else []), capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    reports = [json.load(open(tmp_path / f"rank-{rank}.json")) for rank in range(world)]
    assert [rep["world"] for rep in reports] == [world] * world
    return reports


def check_equivalence(reports, state_fraction: float):
    for rep in reports:
        assert all(rep["reduce_scatter"].values()), rep["reduce_scatter"]
        assert len(rep["runs"]) == 4
        for name, run in rep["runs"].items():
            assert run["max_abs"] <= ATOL, (rep["rank"], name, run)
            if "max_norm=None" in name:
                assert run["max_abs"] == 0.0, (rep["rank"], name, run)
                assert run["fsdp_norms"] == [] and run["dp_norms"] == []
            else:
                assert len(run["fsdp_norms"]) == 10
                assert run["fsdp_norms"] == pytest.approx(run["dp_norms"], rel=1e-5)
                assert max(run["dp_norms"]) > 0.1       # the clip really clipped
            # AdamW's m and v: 472 parameters -> 944 floats in DP; each FSDP rank holds its padded share.
            assert run["dp_state_bytes"] == 2 * 4 * 118
            ratio = run["fsdp_state_bytes"] / run["dp_state_bytes"]
            assert state_fraction <= ratio <= state_fraction + 0.03, ratio
    assert len({rep["param_checksum"] for rep in reports}) == 1


def test_fsdp_matches_dp_on_two_mpi_ranks(tmp_path):
    reports = launch(mpirun(2) + [sys.executable, WORKER, "mpi"], 2, tmp_path)
    assert {rep["method"] for rep in reports} == {"mpi4py"}     # MPI_Reduce_scatter_block via mpi4py
    check_equivalence(reports, 0.5)


def test_fsdp_matches_dp_on_two_ring_ranks(tmp_path):
    # started as users start it: `clusterctl run` on this machine (2 ranks, clusterctl's rank starter)
    argv = [sys.executable, "-m", "clusterctl", "run", "--no-sync", "--no-preflight", "--runs-dir",
            str(tmp_path / "runs"), WORKER, "ring"]
    reports = launch(argv, 2, tmp_path)
    assert {rep["method"] for rep in reports} == {"all_sum"}    # ring has no sum_scatter in mlx 0.32.4
    check_equivalence(reports, 0.5)


def test_hybrid_fsdp_and_dp_groups_on_four_mpi_ranks(tmp_path):
    reports = launch(mpirun(4) + [sys.executable, WORKER, "mpi"], 4, tmp_path)
    for rep in reports:
        rank = rep["rank"]
        assert rep["fsdp_group"] == [rank % 2, 2, "mpi4py"]     # the split communicator was mirrored
        assert rep["dp_group"] == [rank // 2, 2]
    check_equivalence(reports, 0.5)


def test_init_world_fails_loudly_when_mlx_cannot_load_libmpi(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("from clusterctl.train.collectives import init_world\ninit_world('any')\nprint('trained alone')\n")
    env = {**os.environ, "CLUSTERCTL_WORLD_SIZE": "2", "PYTHONPATH": REPO,
           "MLX_MPI_LIBNAME": str(tmp_path / "no-such-libmpi.so")}
    r = subprocess.run(mpirun(2) + ["-x", "MLX_MPI_LIBNAME", sys.executable, str(script)], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode != 0
    assert "trained alone" not in r.stdout
    assert "could not form the world of 2 the launcher started" in r.stderr
    assert "MLX_MPI_LIBNAME" in r.stderr


@pytest.mark.parametrize("world", [2, 3])
def test_ring_reduce_scatter_with_send_and_recv_sums_like_all_sum(world):
    """Above 1 MiB, reduce_scatter on ring passes running sums around the ring (collectives.ring_reduce_scatter);
    it must give every rank its block of the all_sum (to float rounding: the sums are added in another
    order; bfloat16 rounds each partial sum), on an even and an odd number of ranks."""
    launch = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    # ports of its own: mlx.launch's default block (32323 up) is every local mlx.launch's, and tests run side by side
    port = free_port_block(world)
    # in a session of its own: a timeout ends mlx.launch's ranks too (they would spin on, orphaned, for ever)
    proc = subprocess.Popen([launch, "-n", str(world), "--backend", "ring", "--starting-port", str(port), sys.executable,
                             os.path.join(os.path.dirname(WORKER), "reduce_scatter_worker.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    reports = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert sorted(rep["rank"] for rep in reports) == list(range(world))
    for rep in reports:
        paths = {v["path"] for v in rep["results"].values()}
        assert paths == {"all_sum", "sendrecv"}, rep
        for name, v in rep["results"].items():
            assert v["shape_ok"], (rep["rank"], name)
            # largest difference / largest value: float32 ~1e-7; bfloat16 keeps 8 bits (2^-8 = 0.004 a rounding)
            assert v["relative"] <= (0.02 if "bfloat16" in name else 1e-5), (rep["rank"], name, v)
