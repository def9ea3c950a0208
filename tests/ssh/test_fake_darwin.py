"""A Mac in the lab: 3 hosts, two of them fake-Darwin (zsh login shell, macOS's tools and their refusals of
GNU-only usage: tests/fakedarwin/README.md) and one Linux. Everything clusterctl sends a host must work on
them, and none of it may lean on a GNU-only tool or flag: every test ends by checking that no stand-in
refused anything."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from functools import partial

import clirun
import pytest
from sshcluster import caffeinates, requires_private_roots
from test_run import ALLSUM, RANK, TOKEN, assert_nothing_left, job_processes, start, wait_for_lines
from test_stall import STALL

pytestmark = pytest.mark.ssh

HOSTILE = ["it's $(touch pwned).txt", "a b;c`x`", "new\nline", "ünï cødé.py", "-starts-with-dash", "star*?[x]"]


@pytest.fixture
def macs(make_cluster):
    requires_private_roots(why="a private /etc/passwd with zsh as the login shell, per fake Mac")
    cluster = make_cluster(3, darwin={1, 2})
    yield cluster
    for i in (1, 2):
        assert cluster.refused(i) == [], f"h{i} refused GNU-only usage: {cluster.refused(i)}"


clusterctl = partial(clirun.clusterctl, timeout=300, own_cache=True)


def test_the_fake_macs_are_macs(macs):
    for i in (1, 2):
        r = macs.ssh(i, 'echo "$ZSH_VERSION"; uname -s; command -v sha256sum timeout setsid nproc flock tac ip; stat -c %s / ')
        lines = r.stdout.splitlines()
        assert lines[0] and lines[1] == "Darwin" and lines[2:] == [], r.stdout     # zsh; no GNU-only tool
        assert r.returncode != 0 and "illegal option -- c" in r.stderr
    assert macs.ssh(3, "uname -s").stdout.strip() == "Linux"
    for i in (1, 2):                                          # the refusals above were this test's own doing
        assert macs.refused(i) == ["stat: refused c in: stat -c %s /"]
        macs.host(i).dir.joinpath("refused.log").unlink()


def test_doctor_is_green_and_names_the_macs_findings(macs, tmp_path):
    r = clusterctl("doctor", "--json", "--hosts", str(macs.inventory), cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] is True, [c for c in doc["checks"] if c["status"] == "fail"]
    macos = sorted((c["host"], c["detail"]) for c in doc["checks"] if c["check"] == "macos")
    # the Local Network prompt on each Mac; no SIP warning: the hosts' python is a venv's, not /usr/bin's
    assert [host for host, _ in macos] == ["h1", "h2"] and all("Local Network" in d for _, d in macos), macos
    workdir = sorted((c["host"], c["status"]) for c in doc["checks"] if c["check"] == "workdir")
    assert workdir == [("h1", "pass"), ("h2", "pass"), ("h3", "pass")]
    mesh = [(c["host"], c["peer"], c["status"]) for c in doc["checks"] if c["check"] == "ssh-mesh"]
    assert len(mesh) == 6 and {s for *_, s in mesh} == {"pass"}                     # zsh to zsh, zsh to bash
    smoke = {c["check"]: c["status"] for c in doc["checks"] if c["check"].endswith("smoke")}
    assert smoke == {"mpi-smoke": "pass", "ring-smoke": "pass"}
    # the fake Macs are Mac minis (tests/fakedarwin/README.md): no battery, woken by network access
    power = sorted((c["host"], c["status"]) for c in doc["checks"] if c["check"] == "power")
    assert power == [("h1", "pass"), ("h2", "pass")], power


def test_doctor_warns_that_a_macbook_on_battery_will_sleep(macs, tmp_path):
    """h2 a MacBook running on battery (its pmset stand-in prints tests/fixtures/macos/pmset-*.macbook*): doctor
    warns, one line each with the fix, and the warnings fail nothing (docs/facts/macos.md#pmset-sleep-settings)."""
    macs.host(2).session_env["FAKE_DARWIN_POWER"] = "macbook-on-battery"
    macs.restart(2)
    r = clusterctl("doctor", "--json", "--no-deep", "--hosts", str(macs.inventory), cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] is True, [c for c in doc["checks"] if c["status"] == "fail"]
    power = [(c["host"], c["status"], c["detail"], c["fix"]) for c in doc["checks"] if c["check"] == "power"]
    assert [(h, s) for h, s, *_ in power] == [("h1", "pass"), ("h2", "warn"), ("h2", "warn"), ("h2", "warn")], power
    details = [d for _, _, d, _ in power[1:]]
    assert details[0].startswith("running on battery now") and details[1].startswith("a laptop: closing its lid")
    assert details[2].startswith("on battery it sleeps after 1 min idle")
    assert power[3][3] == "sudo pmset -b sleep 0 on h2, or keep it on power"
    text = clusterctl("doctor", "--no-deep", "--hosts", str(macs.inventory), cwd=tmp_path).stdout
    assert "sudo pmset -b sleep 0 on h2" in text and "h2" in text


@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_run_works_and_a_crash_ctrl_c_and_a_hang_leave_nothing(macs, tmp_path, backend):
    script = tmp_path / "allsum.py"
    script.write_text(ALLSUM)
    r = clusterctl("run", "--hosts", str(macs.inventory), "--backend", backend, str(script), backend, "x", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(l for l in r.stdout.splitlines() if "world" in l) == \
        [f"[rank {k} h{k + 1}] world 3 sum [3.0, 3.0, 3.0, 3.0] arg x" for k in range(3)]
    # a crash: rank 1 (a Mac) exits 3, the others sleep
    fail = tmp_path / "fail.py"
    fail.write_text(f"import os, sys, time\nrank = {RANK}\nprint('up', flush=True)\n"
                    "if rank == 1:\n    time.sleep(1)\n    sys.exit(3)\ntime.sleep(600)\n")
    r = clusterctl("run", "--hosts", str(macs.inventory), "--backend", backend, str(fail), cwd=tmp_path)
    assert r.returncode == 3 and "rank 1 on h2 exited 3" in r.stderr, r.stderr[-2000:]
    assert_nothing_left(macs, TOKEN.search(r.stderr).group(1))
    # Ctrl-C, then a hang (rank 0, on a Mac, stopped)
    sleepy = tmp_path / "sleepy.py"
    sleepy.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    for how in ("sigint", "hang"):
        extra = ["--hang-timeout", "5"] if how == "hang" else []
        proc = start("--hosts", str(macs.inventory), "--backend", backend, *extra, str(sleepy), cwd=tmp_path)
        lines = wait_for_lines(proc, lambda l: l.rstrip().endswith("] up"), 3)
        run_id = TOKEN.search("".join(lines)).group(1)
        ranks = _ranks(run_id)
        # a caffeinate per rank on a Mac (h1, h2), none on Linux (h3): docs/facts/macos.md#caffeinate-keeps-ranks-awake.
        # Not under this machine's mpirun: as Open MPI started by its path does, it puts its prefix's bin
        # (this machine's /usr/bin) first on the ranks' PATH, where Linux's uname hides the fake Mac's; on a
        # real Mac /usr/bin/uname says Darwin. test_mpirun_where_homebrew_puts_it... covers mpi.
        awake = ["0", "1"] if backend == "ring" else []
        assert sorted(_caffeinated(ranks)) == awake, (ranks, _caffeinated(ranks))
        if how == "sigint":
            proc.send_signal(signal.SIGINT)
        else:
            rank0 = [p for p in job_processes(run_id) if _environ(p).get("CLUSTERCTL_RUN_ID") == run_id
                     and _environ(p).get("MLX_RANK", _environ(p).get("OMPI_COMM_WORLD_RANK")) == "0" and _python(p)]
            assert len(rank0) == 1, rank0
            os.kill(rank0[0], signal.SIGSTOP)
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == (130 if how == "sigint" else 124), out[-2000:]
        assert_nothing_left(macs, run_id)
        deadline = time.monotonic() + 10          # caffeinate -w sees its rank gone (the stand-in: within 0.2 s)
        while _caffeinated(ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _caffeinated(ranks) == {}


def test_a_stall_on_the_macs_is_explained_with_every_ranks_stack(macs, tmp_path):
    """The stall watchdog's stacks come from the hosts over SSH (pid files, ps, the faulthandler dumps): on zsh
    and macOS's ps as on Linux. Rank 1 (a Mac) sleeps instead of joining the all_sum."""
    (tmp_path / "stall.py").write_text(STALL)
    r = clusterctl("run", "--hosts", str(macs.inventory), "--backend", "ring", "--plain", "--stall-timeout", "10",
                   "stall.py", cwd=tmp_path)
    assert r.returncode == 125, r.stdout[-2000:] + r.stderr[-2000:]
    assert "rank 1 is the odd one out: time.sleep(3600) at stall.py:" in r.stderr, r.stderr[-2000:]
    run_id = TOKEN.search(r.stderr).group(1)
    [taken] = os.listdir(tmp_path / "runs" / run_id / "stacks")
    assert sorted(os.listdir(tmp_path / "runs" / run_id / "stacks" / taken)) == ["rank-0.txt", "rank-1.txt", "rank-2.txt",
                                                                                 "stacks.json"]
    assert_nothing_left(macs, run_id)


# A rank that says which caffeinate processes watch it (`caffeinate ... -w <its pid>`): "caffeinate PID N ARGS".
CAFFEINATED = """import os
me = str(os.getpid())
found = []
for entry in os.listdir("/proc"):
    try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\\0") if a]
    except (OSError, ValueError):
        continue
    if any(a.endswith("/caffeinate") for a in argv[:2]) and argv[-2:] == ["-w", me]:
        found.append(argv)
print("caffeinate", me, len(found), *(found[0][-4:] if found else []), flush=True)
"""


def _ranks(run_id):
    """This run's rank processes (the python running the bootstrap): pid -> rank."""
    out = {}
    for pid in job_processes(run_id):
        env = _environ(pid)
        rank = env.get("MLX_RANK", env.get("OMPI_COMM_WORLD_RANK"))
        if env.get("CLUSTERCTL_RUN_ID") == run_id and rank is not None and _python(pid):
            out[pid] = rank
    return out


def _caffeinated(ranks):
    """The ranks (pid -> rank) a caffeinate watches: rank -> caffeinate's pid."""
    return {ranks[pid]: caffeinate for pid, caffeinate in caffeinates(ranks).items()}


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return {k.decode(): v.decode() for k, _, v in (e.partition(b"=") for e in f.read().split(b"\0")) if k}
    except OSError:
        return {}


def _python(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"python" in os.path.basename(f.read().split(b"\0")[0])
    except OSError:
        return False


def _tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_sync_and_data_push_land_byte_exact_with_hostile_names(macs, tmp_path, method):
    project = tmp_path / "project"
    (project / "sub dir").mkdir(parents=True)
    for i, name in enumerate(HOSTILE):
        (project / name).write_bytes(os.urandom(1000 + i))
        (project / "sub dir" / name).write_bytes(name.encode() * 3)
    r = clusterctl("sync", ".", "--hosts", str(macs.inventory), "--method", method, cwd=project)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "pwned").exists() and not (project / "pwned").exists()
    want = {k: v for k, v in _tree(project).items() if not k.startswith(".cache/")}   # clusterctl's own, made meanwhile
    for i in (1, 2, 3):
        listing = macs.ssh(i, f"cd {macs.workdir} && {sys.executable} -c 'import hashlib, os, json, sys\n"
                              "out = {}\nfor d, _, fs in os.walk(\".\"):\n    for f in fs:\n"
                              "        p = os.path.join(d, f)[2:]\n"
                              "        out[p] = hashlib.sha256(open(p, \"rb\").read()).hexdigest()\n"
                              "print(json.dumps(out))'")
        got = {k: v for k, v in json.loads(listing.stdout).items() if not k.startswith((".clusterctl", "data/"))}
        assert got == want, (i, set(got) ^ set(want))
    # data push: host i gets shard i, checked by sha256 on the host (a Mac has no sha256sum)
    prep = clusterctl("data", "prepare", "embedded:60", "--world", "3", "--out", str(tmp_path / "shards"), cwd=tmp_path)
    assert prep.returncode == 0, prep.stderr
    r = clusterctl("data", "push", str(tmp_path / "shards"), "--hosts", str(macs.inventory), "--method", method,
                   cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for i in (1, 2, 3):
        shard = f"shard-{i - 1:05d}-of-00003.bin"
        remote = macs.ssh(i, f"cd {macs.workdir}/data/shards && {sys.executable} -c "
                             f"'import hashlib; print(hashlib.sha256(open(\"{shard}\", \"rb\").read()).hexdigest())'")
        assert remote.stdout.strip() == hashlib.sha256((tmp_path / "shards" / shard).read_bytes()).hexdigest()


def test_exec_bench_and_the_watchdog(macs, tmp_path):
    r = clusterctl("exec", "--hosts", str(macs.inventory), "--", "uname", "-s", cwd=tmp_path)
    assert r.returncode == 0 and sorted(r.stdout.split()) == sorted(
        ["[0", "h1]", "Darwin", "[1", "h2]", "Darwin", "[2", "h3]", "Linux"]), r.stdout
    r = clusterctl("bench", "--hosts", str(macs.inventory), "--backend", "ring", "--sizes", "1K..64K",
                   cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    # the transport's watchdog on a Mac: a command whose channel closes is killed with its whole tree
    marker = "clusterctl-watchdog-probe-" + str(os.getpid())
    pattern = "'clusterctl-watchdog-prob[e]-" + str(os.getpid()) + "'"     # never the pgrep's own shell
    proc = subprocess.Popen([sys.executable, "-c", f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
from clusterctl.hosts.connector import Connector
from clusterctl.inventory_load import load_cluster
import queue
c = load_cluster({str(macs.inventory)!r})
t = Connector(c).transport(c.hosts[0])
p = t.stream("sh -c 'sleep 600; : {marker}' & sleep 600; : {marker}", queue.Queue())
print('started', flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 10
    while not macs.ssh(1, f"pgrep -f {pattern}").stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert macs.ssh(1, f"pgrep -f {pattern}").stdout.strip()
    proc.kill()                                   # the controller dies: its SSH channel closes
    proc.wait()
    deadline = time.monotonic() + 15
    while macs.ssh(1, f"pgrep -f {pattern}").stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert macs.ssh(1, f"pgrep -f {pattern}").stdout.strip() == ""


def test_mpirun_where_homebrew_puts_it_is_found_and_launched_by_its_path(make_cluster, tmp_path):
    """Two fake Macs whose Open MPI is in /opt/homebrew/bin, not on sshd's PATH: the pre-flight finds it
    there, a launch from the first host runs it by its absolute path (so its daemons start from the same
    prefix on the other Mac), and a host without any mpirun is named before anything starts."""
    requires_private_roots(why="/opt/homebrew on the fake Macs only")
    macs = make_cluster(2, darwin={1, 2}, homebrew_mpi=True)
    assert macs.ssh(1, "command -v mpirun || echo none").stdout.strip() == "none"
    script = tmp_path / "allsum.py"
    script.write_text(ALLSUM)
    r = clusterctl("run", "--hosts", str(macs.inventory), "--backend", "mpi", "--launch-from", "first-host",
                   str(script), "mpi", "x", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    launch = json.loads((tmp_path / "runs" / TOKEN.search(r.stderr).group(1) / "launch.json").read_text())
    assert launch["argv"][0] == "/opt/homebrew/bin/mpirun" and "exec /opt/homebrew/bin/mpirun " in launch["remote_command"]
    assert len([l for l in r.stdout.splitlines() if "world 2 sum" in l]) == 2
    # Open MPI from /opt/homebrew puts /opt/homebrew/bin first on the ranks' PATH, as on a Mac: each rank runs
    # under a caffeinate watching its pid, gone when the run is (docs/facts/macos.md#caffeinate-keeps-ranks-awake)
    awake = tmp_path / "awake.py"
    awake.write_text(CAFFEINATED)
    r = clusterctl("run", "--hosts", str(macs.inventory), "--backend", "mpi", "--launch-from", "first-host",
                   str(awake), cwd=tmp_path)
    watched = sorted(l.split("] ", 1)[1] for l in r.stdout.splitlines() if "] caffeinate " in l)
    assert r.returncode == 0 and len(watched) == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert all(line.split()[2:] == ["1", "-i", "-s", "-w", line.split()[1]] for line in watched), watched
    assert caffeinates({int(line.split()[1]) for line in watched}) == {}
    for i in (1, 2):
        assert macs.refused(i) == []
    # a Mac with no Open MPI at all (h2's /opt is empty): the pre-flight names it before anything starts
    empty = tmp_path / "empty-opt"
    empty.mkdir()
    macs.restart(2, binds={"/opt": str(empty)})
    elsewhere = tmp_path / "elsewhere"            # its own plan cache: the pre-flight runs before the launch
    elsewhere.mkdir()
    r = clusterctl("run", "--hosts", str(macs.inventory), "--backend", "mpi", str(script), "mpi", "x", cwd=elsewhere)
    assert r.returncode == 1 and "h2: no mpirun on the PATH a session gets there" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not (elsewhere / "runs").exists()      # nothing launched
