"""`clusterctl hostfile --print-command`: the printed line, pasted into a shell, runs the job."""
import json
import subprocess

import clirun
import pytest

pytestmark = pytest.mark.ssh

SCRIPT = """\
import json, os, sys
import mlx.core as mx
g = mx.distributed.init(backend=sys.argv[1], strict=True)
x = mx.distributed.all_sum(mx.ones(4), group=g)
mx.eval(x)
if len(sys.argv) > 3:       # a relative path: where the printed line runs the ranks decides what it means
    os.makedirs(os.path.dirname(sys.argv[3]), exist_ok=True)
    open(sys.argv[3] % g.rank(), "w").write("x")
print(json.dumps({"rank": g.rank(), "size": g.size(), "sum": x.tolist(), "arg": sys.argv[2],
                  "cwd": os.getcwd()}), flush=True)
"""


def printed_line(cluster, tmp_path, fmt, output, *program):
    """The line printed for `program`, on hosts whose workdir exists (as after `clusterctl sync`: mpirun's
    -wdir and mlx.launch's --cwd need the directory to be there)."""
    for i in range(1, len(cluster.hosts) + 1):
        assert cluster.ssh(i, f"mkdir -p {cluster.workdir}").returncode == 0
    r = clirun.clusterctl("hostfile", "--hosts", str(cluster.inventory), "--format", fmt,
                          "-o", str(tmp_path / output), "--print-command", "--", *program, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("fmt,backend,output", [("openmpi", "mpi", "hostfile"), ("mlx", "ring", "hosts.json")])
def test_the_printed_command_works_as_printed(make_cluster, tmp_path, fmt, backend, output):
    cluster = make_cluster(2)
    script = tmp_path / "allsum.py"
    script.write_text(SCRIPT)
    odd = "it's a $(touch pwned) test"
    line = printed_line(cluster, tmp_path, fmt, output, str(script), backend, odd)
    # the environment run would give the launcher comes first, as assignments (mpirun gets -x NAME only)
    launcher = next(word for word in line.split() if "=" not in word)
    assert launcher.endswith(("mpirun", "mlx.launch")), line
    run = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    ranks = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["size"] == 2 and r["sum"] == [2.0] * 4 and r["arg"] == odd for r in ranks)
    assert not (tmp_path / "pwned").exists()
    if fmt == "openmpi":
        assert (tmp_path / output).read_text().splitlines()[1:] == ["h1 slots=1", "h2 slots=1"]
        assert "-x LD_LIBRARY_PATH " in line and line.startswith("LD_LIBRARY_PATH=") and "btl_tcp_if_include 127.0.0.0/8" in line


@pytest.mark.parametrize("fmt,backend,output", [("openmpi", "mpi", "hostfile"), ("mlx", "ring", "hosts.json")])
def test_relative_paths_in_the_printed_command_mean_the_hosts_workdir(make_cluster, tmp_path, fmt, backend, output):
    """-wdir (mpirun) / --cwd (mlx.launch): ranks start in the inventory's workdir, as under `run`, so a
    relative path in the program's arguments lands there, not wherever the line was pasted."""
    cluster = make_cluster(2)
    script = tmp_path / "allsum.py"
    script.write_text(SCRIPT)
    line = printed_line(cluster, tmp_path, fmt, output, str(script), backend, "x", "out/rank-%d.txt")
    assert ("-wdir " if fmt == "openmpi" else "--cwd ") + cluster.workdir in line
    run = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    ranks = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
    assert [r["cwd"] for r in ranks] == [cluster.workdir] * 2
    assert not (tmp_path / "out").exists()
    for i in (1, 2):
        assert cluster.ssh(i, f"test -f {cluster.workdir}/out/rank-{i - 1}.txt").returncode == 0
