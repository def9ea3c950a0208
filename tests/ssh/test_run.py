"""`clusterctl run` on the real loopback cluster with real mpirun and real mlx.launch."""
import json
import os
import re
import signal
import subprocess
import time
from functools import partial

import clirun
import pytest

pytestmark = pytest.mark.ssh

ALLSUM = """\
import os, sys
import mlx.core as mx
g = mx.distributed.init(backend=sys.argv[1], strict=True)
x = mx.distributed.all_sum(mx.ones(4), group=g)
mx.eval(x)
assert g.size() == int(os.environ["CLUSTERCTL_WORLD_SIZE"]), "the silent size-1 trap"
print(f"world {g.size()} sum {x.tolist()} arg {sys.argv[2]}", flush=True)
"""
RANK = "int(os.environ.get('OMPI_COMM_WORLD_RANK') or os.environ['MLX_RANK'])"
TOKEN = clirun.TOKEN


# Each test its own plan cache (own_cache): which launches start from a cached plan is then up to the test.
run = partial(clirun.clusterctl, "run", timeout=180, own_cache=True)
start = partial(clirun.start, "run", own_cache=True)


def wait_for_lines(proc, predicate, count, limit=60.0):
    seen, lines, deadline = 0, [], time.monotonic() + limit
    while seen < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        seen += predicate(line)
    assert seen >= count, "".join(lines)
    return lines


def job_processes(run_id):
    """PIDs of this run's rank processes anywhere on this machine (every simulated host lives here)."""
    out = subprocess.run(["pgrep", "-f", f"clusterctl-run-{run_id}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def assert_nothing_left(cluster, run_id):
    assert_nothing_left_on(cluster, run_id, range(1, len(cluster.hosts) + 1))


def assert_nothing_left_on(cluster, run_id, hosts):
    assert job_processes(run_id) == []
    for i in hosts:                                      # and `ps` over SSH on every host agrees
        ps = cluster.ssh(i, "ps -eo args")
        assert ps.returncode == 0 and f"clusterctl-run-{run_id}" not in ps.stdout


def launcher_args(backend):
    """"ring/mlx.launch": the ring backend started by mlx.launch, the fallback, instead of clusterctl."""
    backend, _, launcher = backend.partition("/")
    return backend, ["--backend", backend] + (["--launcher", launcher] if launcher else [])


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("backend", ["mpi", "ring", "ring/mlx.launch"])
def test_all_sum_on_every_rank_with_prefixes_and_logs(make_cluster, tmp_path, size, backend):
    cluster = make_cluster(size)
    script = tmp_path / "allsum.py"
    script.write_text(ALLSUM)
    odd = "it's $(touch pwned) a `test`"
    backend, flags = launcher_args(backend)
    r = run(str(script), backend, odd, "--hosts", str(cluster.inventory), *flags, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [l for l in r.stdout.splitlines() if "world" in l]
    expected = {f"[rank {k} h{k + 1}] world {size} sum {[float(size)] * 4} arg {odd}" for k in range(size)}
    assert set(lines) == expected, r.stdout
    run_id = TOKEN.search(r.stderr).group(1)
    run_dir = tmp_path / "runs" / run_id
    for k in range(size):
        assert f"world {size} sum" in (run_dir / f"rank-{k}.log").read_text()
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["rank_env"]["CLUSTERCTL_WORLD_SIZE"] == str(size) and launch["backend"] == backend
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("backend", ["mpi", "ring", "ring/mlx.launch"])
def test_a_failing_rank_stops_the_job_and_is_named(make_cluster, tmp_path, backend):
    cluster = make_cluster(4)
    script = tmp_path / "fail.py"
    script.write_text(f"import os, sys, time\nrank = {RANK}\nprint('up', flush=True)\n"
                      "if rank == 1:\n    time.sleep(1)\n    print('rank 1 gives up', flush=True)\n    sys.exit(3)\n"
                      "time.sleep(600)\n")
    started = time.monotonic()
    r = run(str(script), "--hosts", str(cluster.inventory), *launcher_args(backend)[1], cwd=tmp_path)
    # The other ranks sleep 600 s: a job not stopped at the first failure would run into run()'s 180 s
    # timeout. The bound sits far below that and far above a normal start-up and stop (pre-flight
    # included), so a loaded machine cannot fail it.
    assert time.monotonic() - started < 90
    assert r.returncode == 3, r.stdout + r.stderr
    assert "failed: rank 1 on h2 exited 3" in r.stderr and "could not confirm" not in r.stderr
    assert "rank 1 gives up" in r.stderr.split("last lines of")[1]
    assert_nothing_left(cluster, TOKEN.search(r.stderr).group(1))


@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_sigint_stops_every_rank_with_exit_130(make_cluster, tmp_path, backend):
    cluster = make_cluster(3)
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    proc = start(str(script), "--hosts", str(cluster.inventory), "--backend", backend, cwd=tmp_path)
    lines = wait_for_lines(proc, lambda l: l.rstrip().endswith("] up"), 3)
    run_id = TOKEN.search("".join(lines)).group(1)
    assert len(job_processes(run_id)) >= 3
    t = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    # The ranks sleep 600 s: a Ctrl-C that did not stop them would leave run waiting for minutes. The
    # bound sits far below that, not near the few seconds a stop takes, so a loaded machine cannot fail it.
    assert time.monotonic() - t < 60
    assert proc.returncode == 130 and "interrupted" in out and "Traceback" not in out
    assert "could not confirm" not in out
    assert_nothing_left(cluster, run_id)


@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_a_stopped_rank_trips_the_hang_timeout_and_is_named(make_cluster, tmp_path, backend):
    cluster = make_cluster(3)
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    proc = start(str(script), "--hosts", str(cluster.inventory), "--backend", backend, "--hang-timeout", "5",
                 cwd=tmp_path)
    lines = wait_for_lines(proc, lambda l: l.rstrip().endswith("] up"), 3)
    run_id = TOKEN.search("".join(lines)).group(1)
    rank2 = [p for p in job_processes(run_id) if _rank_of(p) == 2 and _is_python(p)]
    assert len(rank2) == 1
    os.kill(rank2[0], signal.SIGSTOP)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 124, out
    assert "hang timeout: no output and no heartbeat from rank 2 on h3 for 5s" in out
    assert_nothing_left(cluster, run_id)


def test_dry_run_and_preflight(make_cluster, tmp_path):
    cluster = make_cluster(2)
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    r = run(str(script), "--hosts", str(cluster.inventory), "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["argv"][0].endswith("mpirun") and plan["rank_hosts"] == ["h1", "h2"]
    assert job_processes(plan["run_id"]) == []
    r = run(str(tmp_path / "missing.py"), "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 1 and "h1: " in r.stderr and "missing.py does not exist there" in r.stderr
    cluster.stop_host(2)
    # clusterctl's options first (the canonical spelling: no note about options taken from the end)
    r = run("--hosts", str(cluster.inventory), "--connect-timeout", "3", str(script), cwd=tmp_path)
    # a host not reached: exit 3 whichever step finds it (here the project's copy, there the pre-flight)
    assert r.returncode == 3 and "could not copy the project" in r.stderr and "h2: " in r.stderr
    assert "Connection refused" in r.stderr and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1
    r = run("--hosts", str(cluster.inventory), "--connect-timeout", "3", "--no-sync", str(script), cwd=tmp_path)
    assert r.returncode == 3 and "h2: connection refused" in r.stderr and "Traceback" not in r.stderr


def test_launching_from_the_cached_plan_while_the_preflight_runs(make_cluster, tmp_path):
    """After one verified launch the next starts at once from the cached plan, the pre-flight running
    beside it: a failing pre-flight still stops the job and names the host, and a plan that no longer
    matches the hosts makes run launch again with the fresh one."""
    cluster = make_cluster(2)
    script = tmp_path / "t.py"
    # long enough that the pre-flight's verdict comes first, as it does for any real training job
    script.write_text("import os, time\ntime.sleep(2)\nprint('env', os.environ.get('STALE', '-'))\n")
    cache = tmp_path / ".cache" / "clusterctl" / "plans"
    r = run(str(script), "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    [cached] = list(cache.iterdir())
    # the plan cached is the one the verified launch gave its ranks: the hosts' libmpi, for MLX to load
    env = json.loads(cached.read_text())["env"]
    launch = json.loads((tmp_path / "runs" / TOKEN.search(r.stderr).group(1) / "launch.json").read_text())
    assert env.items() <= launch["rank_env"].items(), (env, launch["rank_env"])
    assert os.path.isfile(env["MLX_MPI_LIBNAME"]) and env["LD_LIBRARY_PATH"] == os.path.dirname(env["MLX_MPI_LIBNAME"])
    # a stale plan: the job starts with it, the pre-flight finds the hosts say otherwise, run launches again
    stale = json.loads(cached.read_text())
    cached.write_text(json.dumps({**stale, "env": {**stale["env"], "STALE": "1"}}))
    r = run(str(script), "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "the hosts changed since the plan was cached: launching again" in r.stderr
    assert r.stdout.count("] env -") == 2 and "env 1" not in r.stdout   # only the relaunched job ran to the end
    assert json.loads(cached.read_text()) == stale              # and the fresh plan is cached again
    r = run(str(tmp_path / "missing.py"), "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 1 and "missing.py does not exist there" in r.stderr, r.stderr
    assert job_processes(TOKEN.search(r.stderr).group(1)) == []
    cluster.stop_host(2)
    r = run(str(script), "--hosts", str(cluster.inventory), "--connect-timeout", "3", "--no-sync", cwd=tmp_path)
    assert r.returncode == 3 and "h2: connection refused" in r.stderr and "Traceback" not in r.stderr
    assert_nothing_left_on(cluster, TOKEN.search(r.stderr).group(1), [1])


def _rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    except OSError:
        return None
    value = env.get(b"OMPI_COMM_WORLD_RANK") or env.get(b"MLX_RANK")
    return int(value) if value else None


def _is_python(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"python" in f.read().split(b"\0")[0]
    except OSError:
        return False


@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_launching_from_the_first_host(make_cluster, tmp_path, backend):
    """The launcher runs on h1 over SSH (as when this machine has no mpirun / mlx.launch); output, exit
    codes and cleanup are the same."""
    cluster = make_cluster(3)
    script = tmp_path / "allsum.py"
    script.write_text(ALLSUM)
    r = run(str(script), backend, "x", "--hosts", str(cluster.inventory), "--backend", backend,
            "--launch-from", "first-host", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    expected = "mpirun" if backend == "mpi" else "clusterctl's rank starter"
    assert f"launching {expected} from h1" in r.stderr
    assert sorted(l for l in r.stdout.splitlines() if "world" in l) == \
        [f"[rank {k} h{k + 1}] world 3 sum [3.0, 3.0, 3.0, 3.0] arg x" for k in range(3)]
    launch = json.loads((tmp_path / "runs" / TOKEN.search(r.stderr).group(1) / "launch.json").read_text())
    assert launch["launcher_host"] == "h1" and "/.clusterctl/runs/" in launch["remote_command"]
    there = re.search(r"(/\S*/\.clusterctl/runs/[^/]+)/", launch["remote_command"]).group(1)
    assert cluster.ssh(1, f"test -d {there}").returncode == 0
    # a dry run launching from h1 writes nothing there
    r = run(str(script), "--hosts", str(cluster.inventory), "--backend", backend, "--launch-from", "first-host",
            "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    dry_id = json.loads(r.stdout)["run_id"]
    assert cluster.ssh(1, f"test -e {there.rsplit('/', 1)[0]}/{dry_id}").returncode == 1
    fail = tmp_path / "fail.py"
    fail.write_text(f"import os, sys, time\nrank = {RANK}\nif rank == 2:\n    sys.exit(5)\ntime.sleep(600)\n")
    r = run(str(fail), "--hosts", str(cluster.inventory), "--backend", backend, "--launch-from", "first-host",
            cwd=tmp_path)
    assert r.returncode == 5 and "rank 2 on h3 exited 5" in r.stderr and "could not confirm" not in r.stderr
    assert_nothing_left(cluster, TOKEN.search(r.stderr).group(1))


def test_a_world_of_one_over_mpirun(make_cluster, tmp_path):
    """mpirun -np 1 fails any MLX script on its own (MLX 0.32 never finalises an MPI world of one); the
    bootstrap finalises it, so a one-host inventory runs like any other
    (docs/facts/mlx-distributed.md#mpi-world-of-one-not-finalized)."""
    cluster = make_cluster(1)
    script = tmp_path / "one.py"
    script.write_text("import mlx.core as mx\ng = mx.distributed.init(backend='mpi')\n"
                      "mx.eval(mx.distributed.all_sum(mx.ones(2), group=g))\nprint('world', g.size())\n")
    r = run(str(script), "--hosts", str(cluster.inventory), "--backend", "mpi", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[rank 0 h1] world 1" in r.stdout and "exiting improperly" not in r.stdout + r.stderr


ALONE = """\
import os, sys, time
if sys.argv[1] == "no-libmpi":          # MLX cannot load libmpi: a world of one per rank, no error
    os.environ["MLX_MPI_LIBNAME"] = "/nonexistent/libmpi.so"
if sys.argv[1] == "no-hostfile":        # the ring backend finds no peers: the same
    os.environ.pop("MLX_HOSTFILE", None)
import mlx.core as mx
g = mx.distributed.init(backend=sys.argv[2])
print("alone in a world of", g.size(), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("backend, how, asked, cause", [
    ("mpi", "no-libmpi", "mpi", "MLX could not join the ranks: under mpirun it could not load libmpi"),
    ("mpi", "as-is", "ring", "the program asked MLX for the ring backend, but the ranks were started for mpi"),
    ("ring", "no-hostfile", "any", "MLX could not join the ranks: its ring backend found no peers"),
])
def test_ranks_that_each_form_a_world_of_one_fail_the_job_naming_every_rank(make_cluster, tmp_path, backend, how,
                                                                           asked, cause):
    """MLX falls back to a world of one without an error (docs/facts/mlx-distributed.md#world-of-one-fallback):
    every rank would train alone and exit 0. The bootstrap reports the world the program's init formed and
    run stops the job at once, naming the ranks and the cause."""
    cluster = make_cluster(2)
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    started = time.monotonic()
    r = run(str(script), how, asked, "--hosts", str(cluster.inventory), "--backend", backend, cwd=tmp_path)
    assert time.monotonic() - started < 90      # the ranks sleep 600 s: they were stopped, not waited for
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"failed: rank 0 on h1 and rank 1 on h2 formed a world of 1, not 2: {cause}" in r.stderr, r.stderr
    assert_nothing_left(cluster, TOKEN.search(r.stderr).group(1))


MPI4PY = """\
import time
from mpi4py import MPI
print("mpi4py world of", MPI.COMM_WORLD.Get_size(), flush=True)
time.sleep(600)
"""


def test_an_mpi4py_program_under_ring_is_stopped_in_one_line_naming_the_mpi_backend(make_cluster, tmp_path):
    """Issue 42: under a launcher that is not MPI's, each rank's mpi4py is a world of one of its own, and the job
    would run as silent singletons; the bootstrap reports mpi4py's world and run stops the job, naming mpi."""
    pytest.importorskip("mpi4py")
    cluster = make_cluster(2)
    (tmp_path / "mpi.py").write_text(MPI4PY)
    started = time.monotonic()
    r = run("mpi.py", "--hosts", str(cluster.inventory), "--backend", "ring", cwd=tmp_path)
    assert time.monotonic() - started < 90 and r.returncode == 1, r.stdout + r.stderr
    assert ("rank 0 on h1 and rank 1 on h2 formed a world of 1, not 2: the program uses mpi4py, whose MPI world only "
            "an MPI launcher forms: each rank ran alone (run it with --backend mpi)") in r.stderr, r.stderr
    assert_nothing_left(cluster, TOKEN.search(r.stderr).group(1))


def test_ring_on_an_inventory_of_ssh_aliases_uses_the_addresses_ssh_reaches(make_cluster, tmp_path):
    """Issue 42: hosts named by their ssh_config alias only (HostName there, no `address:`): the ring's ranks reach
    each other where ssh reaches them, said in a note, instead of a refusal after doctor passed."""
    cluster = make_cluster(2)
    inventory = tmp_path / "aliases.yaml"
    inventory.write_text("".join(line for line in cluster.inventory.read_text().splitlines(keepends=True)
                                 if not line.lstrip().startswith("address:")).replace(
                         "ssh_config: ssh_config", f"ssh_config: {cluster.ssh_config}"))
    assert "address" not in inventory.read_text()
    (tmp_path / "allsum.py").write_text(ALLSUM)
    r = run("allsum.py", "ring", "x", "--hosts", str(inventory), "--backend", "ring", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (f"note: h1, h2 have no `address` in the inventory: the ring backend's ranks reach them where ssh does "
            f"(h1 {cluster.hosts[0].address}, h2 {cluster.hosts[1].address})") in r.stderr, r.stderr
    assert sorted(line for line in r.stdout.splitlines() if "world" in line) == [
        "[rank 0 h1] world 2 sum [2.0, 2.0, 2.0, 2.0] arg x", "[rank 1 h2] world 2 sum [2.0, 2.0, 2.0, 2.0] arg x"]


BAR = """\
import sys, time
print("before the bar", flush=True)
n = 2000
for i in range(n + 1):
    sys.stderr.write("\\r%3d%%|%-20s| %d/%d" % (i * 100 // n, "#" * (i * 20 // n), i, n))
    sys.stderr.flush()
    time.sleep(3 / n)
sys.stderr.write("\\n")
print("after the bar", flush=True)
"""


@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_a_progress_bar_stays_a_few_lines_live_and_one_in_the_log(make_cluster, tmp_path, backend):
    """2000 `\\r` redraws over ~3 s on every rank: a few updates live (at most one a second per rank), the
    final state live and in each rank's log, every other line untouched."""
    cluster = make_cluster(2)
    script = tmp_path / "bar.py"
    script.write_text(BAR)
    r = run(str(script), "--hosts", str(cluster.inventory), "--backend", backend, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / TOKEN.search(r.stderr).group(1)
    final = "100%|####################| 2000/2000"
    for k in range(2):
        live = [l for l in r.stderr.splitlines() if l.startswith(f"[rank {k} h{k + 1}] ") and "%|" in l]
        assert 1 <= len(live) <= 10 and live[-1] == f"[rank {k} h{k + 1}] {final}", live
        log = (run_dir / f"rank-{k}.log").read_text().splitlines()
        # stdout and stderr are separate pipes: their lines may interleave either way
        assert sorted(log) == sorted(["before the bar", final, "after the bar"]), log
        assert f"[rank {k} h{k + 1}] before the bar" in r.stdout and f"[rank {k} h{k + 1}] after the bar" in r.stdout
