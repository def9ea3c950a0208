"""The test cluster without any help (tests/sshcluster.py, inventory_only): the hosts listen on a
non-default port, the key has no default name, clusterctl runs with an empty HOME (no ~/.ssh/config, no
known_hosts) and each host's sessions too. Only the inventory says how to connect, exactly the issue's
example: hosts by address; user, port and key in `defaults`. Every command must work from that alone."""
import json
import os
import shlex
import signal
import stat
import subprocess
import time

import clirun
import pytest

pytestmark = pytest.mark.ssh

ALLSUM = """\
import sys
import mlx.core as mx
g = mx.distributed.init(backend=sys.argv[1], strict=True)
x = mx.distributed.all_sum(mx.array([g.rank() + 1.0]), group=g)
print("sum", g.rank(), g.size(), x.item(), flush=True)
"""


def clusterctl(cluster, *args, cwd, timeout=300):
    """clusterctl as the bare cluster's user runs it: with a HOME holding nothing (cluster.client_env())."""
    return clirun.clusterctl(*args, cwd=cwd, timeout=timeout, env=cluster.client_env())


@pytest.fixture
def bare(make_cluster):
    return make_cluster(3, inventory_only=True)


@pytest.mark.parametrize("ssh_config", [None, "empty"])
def test_doctor_is_green_from_the_inventory_alone(bare, tmp_path, ssh_config):
    assert "ssh_config" not in bare.inventory.read_text() and not any(bare.client_home.iterdir())
    if ssh_config:        # the other spelling: an inventory that names an empty ssh_config
        (bare.inventory.parent / "empty_ssh_config").write_text("")
        bare.inventory.write_text("ssh_config: ./empty_ssh_config\n" + bare.inventory.read_text())
    r = clusterctl(bare, "doctor", "--hosts", str(bare.inventory), "--json", cwd=tmp_path)
    report = json.loads(r.stdout)
    failed = [c for c in report["checks"] if c["status"] != "pass"]
    assert r.returncode == 0 and report["ok"], failed
    checks = {c["check"] for c in report["checks"]}
    assert {"ssh", "ssh-mesh", "mpi-smoke", "ring-smoke"} <= checks
    assert sum(c["check"] == "ssh-mesh" for c in report["checks"]) == 6          # every ordered pair


@pytest.mark.parametrize("backend,launch_from", [("mpi", "here"), ("ring", "here"), ("mpi", "first-host"),
                                                 ("ring", "first-host")])
def test_run_over_both_backends_here_and_from_the_first_host(bare, tmp_path, backend, launch_from):
    (tmp_path / "allsum.py").write_text(ALLSUM)
    r = clusterctl(bare, "run", "allsum.py", backend, "--hosts", str(bare.inventory), "--backend", backend,
                   "--launch-from", launch_from, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    sums = sorted(line.split()[-4:] for line in r.stdout.splitlines() if " sum " in line)
    assert sums == [["sum", str(i), "3", "6.0"] for i in range(3)], r.stdout


def test_sync_data_push_exec_and_bench(bare, tmp_path):
    inv = str(bare.inventory)
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text("print('a')\n")
    r = clusterctl(bare, "sync", str(project), "--hosts", inv, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [h["files"] for h in json.loads(r.stdout)["hosts"]] == [1, 1, 1]
    assert [h["method"] for h in json.loads(r.stdout)["hosts"]] == ["rsync"] * 3    # rsync's ssh found them too
    r = clusterctl(bare, "data", "prepare", "embedded:60", "--world", "3", "--out", str(tmp_path / "d"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = clusterctl(bare, "data", "push", str(tmp_path / "d"), "--hosts", inv, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [len(h["sent"]) for h in json.loads(r.stdout)["hosts"]] == [3, 3, 3]      # shard, val.bin, manifest
    r = clusterctl(bare, "exec", "--hosts", inv, "--json", "--", "sh", "-c", "echo $SSH_CONNECTION", cwd=tmp_path)
    ports = {h["stdout"].split()[-1] for h in json.loads(r.stdout)["hosts"]}
    assert r.returncode == 0 and ports == {str(bare.hosts[0].port)}
    r = clusterctl(bare, "bench", "--hosts", inv, "--backend", "mpi", "--sizes", "4K", "--ops", "all_sum",
                   "--no-mpi4py", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["world"] == 3


@pytest.mark.parametrize("fmt,backend", [("openmpi", "mpi"), ("mlx", "ring")])
def test_printed_launch_lines_work_as_printed(bare, tmp_path, fmt, backend):
    (tmp_path / "allsum.py").write_text(ALLSUM)
    # the hosts' workdir exists, as after `clusterctl sync` (the lines start ranks there: -wdir / --cwd)
    assert clusterctl(bare, "exec", "--hosts", str(bare.inventory), "--", "mkdir", "-p", bare.workdir,
                      cwd=tmp_path).returncode == 0
    r = clusterctl(bare, "hostfile", "--hosts", str(bare.inventory), "--format", fmt, "-o", str(tmp_path / "hf"),
                   "--print-command", "--", str(tmp_path / "allsum.py"), backend, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    run = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                         env=bare.client_env())
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(line.split()[1] for line in run.stdout.splitlines() if line.startswith("sum ")) == ["0", "1", "2"]
    # the line reaches the hosts through the rendering, not through anything in a HOME
    assert "-F" in (shlex.split(line) + open(tmp_path / "hf.ssh" / "ssh" / "ssh").read().split() if fmt == "mlx"
                    else shlex.split(line[line.index("plm_rsh_agent"):])[1].split())


def test_a_wrong_port_in_the_inventory_is_named_as_the_inventorys(bare, tmp_path):
    """h2's entry says a port nothing listens on: the controller's check and every host's mesh check fail
    on it, and the fix points at the inventory's `port:`, not at sshd or Remote Login."""
    text = bare.inventory.read_text()
    second = bare.hosts[1].address
    text = text.replace(f"  - name: {second}\n", f"  - name: {second}\n    port: 1\n")
    bare.inventory.write_text(text)
    r = clusterctl(bare, "doctor", "--hosts", str(bare.inventory), "--json", cwd=tmp_path)
    assert r.returncode == 1
    mesh = [c for c in json.loads(r.stdout)["checks"] if c["check"] == "ssh-mesh" and c["peer"] == second]
    assert len(mesh) == 2 and all(c["status"] == "fail" for c in mesh)
    assert all("refused port 1, which the inventory's `port:` sets" in c["fix"] for c in mesh), mesh
    assert not any("Remote Login" in c["fix"] for c in mesh)


def masters(paths):
    """The multiplexing master processes serving these sockets (their command line names the socket)."""
    found = subprocess.run(["pgrep", "-af", r"ssh: .*\[mux\]"], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if any(p in line for p in paths)]


def test_connections_are_reused_replaced_when_dead_and_closed_by_ssh_close(bare, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text("a\n")
    inv = str(bare.inventory)
    assert clusterctl(bare, "sync", str(project), "--hosts", inv, cwd=tmp_path).returncode == 0
    config = next((bare.client_home / ".cache" / "clusterctl" / "ssh").glob("*.config"))
    paths = [next(line.split(" ", 1)[1] for line in subprocess.run(
        ["ssh", "-G", "-F", str(config), h.address], capture_output=True, text=True).stdout.splitlines()
        if line.startswith("controlpath ")) for h in bare.hosts]
    directory = os.path.dirname(paths[0])
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700 and os.stat(directory).st_uid == os.getuid()
    assert all(stat.S_ISSOCK(os.stat(p).st_mode) for p in paths) and len(masters(paths)) == 3
    # a master that died leaves a stale socket: the next command replaces it, and says nothing about it
    os.kill(int(masters(paths[:1])[0].split()[0]), signal.SIGKILL)
    r = clusterctl(bare, "sync", str(project), "--hosts", inv, cwd=tmp_path)
    assert r.returncode == 0 and "ontrol" not in r.stderr, r.stderr
    assert len(masters(paths)) == 3
    r = clusterctl(bare, "ssh-close", "--hosts", inv, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "closed 3 connection(s)"
    deadline = time.monotonic() + 10
    while masters(paths) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert masters(paths) == [] and not any(os.path.exists(p) for p in paths)


def test_doctor_is_green_with_a_stock_sshd(make_cluster, tmp_path):
    """sshd with OpenSSH's defaults (its post-quantum key exchange: ~100 ms of CPU a login on this shared
    machine) and nothing tuned on the client: the probe's time grows with the peers it logs in to. The 16-host
    figure is benchmarks/bench_doctor.py's."""
    cluster = make_cluster(6, stock_sshd=True)
    r = clusterctl(cluster, "doctor", "--hosts", str(cluster.inventory), "--json", cwd=tmp_path)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"], [c for c in report["checks"] if c["status"] != "pass"]
    assert sum(c["check"] == "ssh-mesh" and c["status"] == "pass" for c in report["checks"]) == 30


def test_a_probe_out_of_time_is_reported_slow_with_what_it_finished(bare, monkeypatch):
    """Every host answers SSH, but the probes get far too little time to finish their logins: each host is
    reported as reached, its unfinished checks as slow, never as unreachable."""
    from clusterctl.doctor import DOCTOR_CONNECT_TIMEOUT_S, DoctorOptions, diagnose
    from clusterctl.hosts.connector import Connector
    from clusterctl.inventory_load import load_cluster

    for key, value in bare.client_env().items():
        monkeypatch.setenv(key, value)
    # far below what the probe needs (its python alone imports mlx, a few tenths of a second)
    monkeypatch.setattr(diagnose, "probe_limits", lambda connect_timeout, peers: (0.05, 0.0, 0.05))
    report = diagnose.run_doctor(Connector(load_cluster(str(bare.inventory)), connect_timeout=DOCTOR_CONNECT_TIMEOUT_S),
                                 DoctorOptions(deep=False))
    by_check = {}
    for f in report.findings:
        by_check.setdefault(f.check, []).append(f)
    assert [f.status for f in by_check["ssh"]] == ["pass"] * 3                      # every host was reached
    assert [f.status for f in by_check["probe"]] == ["warn"] * 3 and "answered SSH" in by_check["probe"][0].detail
    unfinished = [f for f in by_check["ssh-mesh"] if f.status == "fail"]
    assert unfinished and all("slow, not refused" in f.detail for f in unfinished)
    assert not any("powered on" in (f.fix or "") or "Remote Login" in (f.fix or "") for f in report.findings)


def test_a_python_under_each_hosts_home_is_found_at_launch(bare, tmp_path):
    """`python: ~/venv/bin/python` (issue 25 item 8): each host's own home, as the pre-flight finds it. The
    rank starter expands it per host; mpirun execs one path on every host without a shell, so where the
    homes differ (here each host has its own) run says so at once instead of failing on the hosts."""
    for host in bare.hosts:
        venv = host.dir / "home" / "venv" / "bin"
        venv.mkdir(parents=True, exist_ok=True)
        (venv / "python").write_text(f"#!/bin/sh\nexec {shlex.quote(os.sys.executable)} \"$@\"\n")
        (venv / "python").chmod(0o755)
    inventory = bare.write_inventory(python="~/venv/bin/python")
    (tmp_path / "allsum.py").write_text(ALLSUM)
    r = clusterctl(bare, "run", "allsum.py", "ring", "--hosts", str(inventory), "--backend", "ring", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(line.split()[-4:] for line in r.stdout.splitlines() if " sum " in line) == [
        ["sum", str(i), "3", "6.0"] for i in range(3)], r.stdout
    r = clusterctl(bare, "run", "allsum.py", "mpi", "--hosts", str(inventory), "--backend", "mpi", cwd=tmp_path)
    [line] = r.stderr.strip().splitlines()[-1:]
    assert r.returncode != 0 and "`python:` with ~ is a different path on each host" in line, r.stderr
    assert f"{bare.hosts[0].address}: {bare.hosts[0].dir}/home/venv/bin/python" in line
