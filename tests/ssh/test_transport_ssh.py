"""Against real OpenSSH sshd processes on 127.0.0.x (tests/sshcluster.py)."""
import os
import shlex
import subprocess
import time

import pytest
from sshcluster import requires_private_roots

from clusterctl.errors import CommandTimeout, ConnectError, InventoryError
from clusterctl.hosts.connector import Connector
from clusterctl.hosts.fanout import DeadlineExceeded
from clusterctl.inventory import load

pytestmark = pytest.mark.ssh


def connector(cluster, **kwargs):
    return Connector(load(cluster.inventory), **kwargs)


def test_fan_out_hostname_over_eight_hosts_returns_eight_results(make_cluster):
    cluster = make_cluster(8)
    group = connector(cluster).run_everywhere(["sh", "-c", "hostname; echo $SSH_CONNECTION"], timeout=20)
    assert list(group) == [f"h{i}" for i in range(1, 9)]
    assert group.all_ok, {n: o.error for n, o in group.items()}
    hostname = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    for i, (name, outcome) in enumerate(group.items(), 1):
        first, second = outcome.value.stdout.splitlines()
        assert first == hostname
        # the session really arrived on that host's own sshd: its address and port
        assert second.split()[2:] == [cluster.host(i).address, str(cluster.host(i).port)]
    assert all("Accepted publickey" in cluster.log(i) for i in range(1, 9))


def test_one_stopped_host_reports_a_connection_error_and_the_other_seven_return(make_cluster):
    cluster = make_cluster(8)
    cluster.stop_host(5)
    start = time.monotonic()
    group = connector(cluster, connect_timeout=60).run_everywhere(["hostname"], timeout=60, deadline=90)
    elapsed = time.monotonic() - start
    assert len(group.ok) == 7 and list(group.failed) == ["h5"]
    error = group["h5"].error
    assert isinstance(error, ConnectError) and "connection refused" in str(error)
    assert f"{cluster.host(5).address}:{cluster.host(5).port}" in str(error)
    # A refused connection is known at once; a stopped host treated as a silent one would hold the run
    # for the 60 s connect timeout. The bound sits far below that and far above the second or so this
    # takes, so a loaded machine cannot fail it (speed figures belong in benchmarks/).
    assert elapsed < 30, elapsed


def test_a_frozen_host_is_cut_off_by_its_deadline_without_delaying_the_rest(make_cluster):
    cluster = make_cluster(4)
    cluster.freeze(2)      # TCP connects, no banner: the classic hang
    deadline = 6           # room for three healthy hosts to answer on a loaded machine
    try:
        start = time.monotonic()
        group = connector(cluster, connect_timeout=120).run_everywhere(["true"], timeout=120, deadline=deadline)
        elapsed = time.monotonic() - start
    finally:
        cluster.thaw(2)
    assert list(group.failed) == ["h2"] and isinstance(group["h2"].error, DeadlineExceeded)
    assert all(group[n].elapsed_s < deadline for n in ("h1", "h3", "h4"))
    # Without the deadline the frozen host would hold the group for its 120 s connect timeout: the bound
    # sits far below that, not just above the deadline, so a loaded machine cannot fail it.
    assert elapsed < 60, elapsed


def test_frozen_host_with_short_connect_timeout_says_no_banner(make_cluster):
    cluster = make_cluster(2)
    cluster.freeze(1)
    try:
        group = connector(cluster, connect_timeout=1.5).run_everywhere(["true"], timeout=5)
    finally:
        cluster.thaw(1)
    assert group["h2"].ok
    assert isinstance(group["h1"].error, ConnectError)
    assert "no banner" in str(group["h1"].error) or "no answer" in str(group["h1"].error)


def test_a_host_that_refuses_our_key_fails_fast_instead_of_prompting(make_cluster):
    cluster = make_cluster(2)
    cluster.refuse_key(2)
    start = time.monotonic()
    group = connector(cluster, connect_timeout=60).run_everywhere(["true"], timeout=60)
    # A host that sat at a password prompt would hold the run for the 60 s timeouts; a refused key is
    # known at once. The bound sits far below 60 s, so a loaded machine cannot fail it.
    assert time.monotonic() - start < 30
    assert group["h1"].ok
    message = str(group["h2"].error)
    assert isinstance(group["h2"].error, ConnectError)
    assert "refused our keys" in message and "ssh-copy-id" in message and str(cluster.client_key) in message


def test_hostile_env_values_and_paths_never_execute_on_the_host(make_cluster, tmp_path):
    cluster = make_cluster(2)
    canary = f"{cluster.workdir}/pwned"
    hostile = f"$(touch {canary}); `touch {canary}`; ' \" ; touch {canary}"
    odd_dir = f"{cluster.workdir}/dir with 'quotes' and $(touch {canary})"
    inventory = cluster.inventory.read_text().replace(
        "hosts:", f"  env: {{EVIL: {_yaml(hostile)}}}\nhosts:")
    cluster.inventory.write_text(inventory)
    conn = connector(cluster)
    env = conn.cluster.hosts[0].env_dict
    with conn.transport(conn.cluster.hosts[0]) as t:
        assert t.run(["mkdir", "-p", "--", odd_dir], timeout=10).ok
        r = t.run(["printf", "%s", hostile], timeout=10)
        assert r.stdout == hostile
        r = t.run('printf "%s" "$EVIL"; echo; pwd', timeout=10, env=env, cwd=odd_dir)
        assert r.ok and r.stdout == f"{hostile}\n{odd_dir}\n", r
        assert t.run(["test", "-e", canary], timeout=10).exit_code == 1


def test_a_hostile_host_name_is_never_run_by_a_shell(make_cluster, tmp_path):
    """Validation refuses such names; this smuggles one past it to prove the layers below quote too."""
    import dataclasses

    cluster = make_cluster(1)
    canary = tmp_path / "pwned"
    name = f"h1;touch${{IFS}}{canary}"
    inventory = load(cluster.inventory)
    smuggled = dataclasses.replace(inventory, hosts=(dataclasses.replace(inventory.hosts[0], name=name),))
    with pytest.raises(InventoryError) as info:
        Connector(smuggled, connect_timeout=3)
    line = 1 + cluster.inventory.read_text().splitlines().index("  - name: h1")     # the host's own line
    assert str(info.value).startswith(f"{cluster.inventory}:{line}: ssh cannot use host")
    assert "invalid characters" in str(info.value)
    assert not canary.exists()


def unique_sleeps() -> tuple[str, str]:
    """Two sleep durations no other process on this machine uses, so pgrep finds exactly ours."""
    n = f"{os.getpid()}{time.monotonic_ns() % 10**9}"
    return f"300.{n}", f"301.{n}"


def leftover(*durations: str, within: float = 30.0) -> list[str]:
    """PIDs of `sleep D` processes still alive after `within` seconds (empty once they are all gone: it
    returns as soon as they are, so the generous limit costs only a failing test)."""
    deadline = time.monotonic() + within
    while True:
        left = []
        for d in durations:
            left += subprocess.run(["pgrep", "-f", f"sleep {d}"], capture_output=True, text=True).stdout.split()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_timeout_kills_the_remote_process_tree(make_cluster):
    cluster = make_cluster(1)
    conn = connector(cluster)
    a, b = unique_sleeps()
    with conn.transport(conn.cluster.hosts[0]) as t:
        with pytest.raises(CommandTimeout):
            t.run(["sh", "-c", f"sh -c 'sleep {a}' & sleep {b}"], timeout=1.5)
    assert not leftover(a, b), "processes left on the host"


def test_put_lands_on_that_host_only_atomically(make_cluster, tmp_path):
    cluster = make_cluster(3)
    requires_private_roots(cluster, "without it the hosts share one filesystem")
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(3 << 20))
    src.chmod(0o640)
    conn = connector(cluster)
    dest = f"{cluster.workdir}/sub dir/payload.bin"
    with conn.transport(conn.cluster.hosts[1]) as t:
        t.put(str(src), dest)
    digest = subprocess.run(["sha256sum", str(src)], capture_output=True, text=True).stdout.split()[0]
    on2 = cluster.ssh(2, f"sha256sum {shlex.quote(dest)}; stat -c %a {shlex.quote(dest)}; "
                         f"ls -A {shlex.quote(os.path.dirname(dest))}")
    assert on2.returncode == 0, on2.stderr
    assert on2.stdout.split() == [digest, dest.split()[0], "dir/payload.bin", "640", "payload.bin"]
    for other in (1, 3):
        assert cluster.ssh(other, f"test -e {shlex.quote(dest)}").returncode == 1


def test_put_to_home_relative_path(make_cluster, tmp_path):
    cluster = make_cluster(1)
    src = tmp_path / "f.txt"
    src.write_text("hello")
    conn = connector(cluster)
    name = f"clusterctl-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        with conn.transport(conn.cluster.hosts[0]) as t:
            t.put(str(src), f"~/{name}/f.txt")
            assert t.run(["cat", f"{os.path.expanduser('~')}/{name}/f.txt"], timeout=10).stdout == "hello"
    finally:
        subprocess.run(["rm", "-rf", os.path.expanduser(f"~/{name}")])


def test_accept_new_records_the_key_and_a_changed_key_is_refused(make_cluster):
    cluster = make_cluster(1)
    assert not cluster.known_hosts.exists()
    conn = connector(cluster)
    assert conn.run_everywhere(["true"], timeout=10).all_ok
    recorded = cluster.known_hosts.read_text()
    assert f"[{cluster.host(1).address}]:{cluster.host(1).port} ssh-ed25519 " in recorded
    # OpenSSH agrees with what we recorded: strict ssh now connects without a prompt
    ok = subprocess.run(["ssh", "-F", str(cluster.ssh_config), "-o", "StrictHostKeyChecking=yes", "h1", "true"],
                        capture_output=True, text=True, timeout=20)
    assert ok.returncode == 0, ok.stderr
    # the machine is "reinstalled": a new host key
    key = cluster.host(1).dir / "host_ed25519"
    key.unlink()
    key.with_suffix(".pub").unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cluster.restart(1)
    group = connector(cluster).run_everywhere(["true"], timeout=10)
    message = str(group["h1"].error)
    assert "HOST KEY CHANGED" in message and "ssh-keygen -R" in message
    assert cluster.known_hosts.read_text() == recorded      # never silently replaced


def test_strict_refuses_an_unknown_host(make_cluster):
    cluster = make_cluster(1)
    group = connector(cluster, host_key_checking="strict").run_everywhere(["true"], timeout=10)
    assert "unknown" in str(group["h1"].error) and "strict" in str(group["h1"].error)
    assert not cluster.known_hosts.exists()


def test_fault_injector_path_without_mpirun(make_cluster):
    cluster = make_cluster(2)
    if os.path.isfile(os.path.expanduser("~/.bashrc")):
        requires_private_roots(cluster, "~/.bashrc sets PATH for ssh sessions unless a host has its own")
    cluster.set_session_path(2, cluster.path_without("mpirun"))
    group = connector(cluster).run_everywhere("command -v mpirun", timeout=10)
    assert group["h1"].ok and group["h1"].value.stdout.strip().endswith("mpirun")
    assert group["h2"].value.exit_code != 0


def _yaml(value: str) -> str:
    import json
    return json.dumps(value)


def test_fault_injector_another_python_on_path(make_cluster, tmp_path):
    cluster = make_cluster(2)
    if os.path.isfile(os.path.expanduser("~/.bashrc")):
        requires_private_roots(cluster, "~/.bashrc sets PATH for ssh sessions unless a host has its own")
    other = tmp_path / "python3-other"
    other.write_text("#!/bin/sh\necho 'Python 2.7.18 (the other one)'\n")
    other.chmod(0o755)
    cluster.python_on_path(2, str(other))
    group = connector(cluster).run_everywhere("python3 --version 2>&1", timeout=10)
    assert group["h1"].ok and group["h1"].value.stdout.startswith("Python 3.")
    assert group["h2"].value.stdout == "Python 2.7.18 (the other one)\n"


def test_ctrl_c_during_exec_leaves_nothing_running_on_any_host(make_cluster):
    import signal
    import sys

    cluster = make_cluster(3)
    a, b = unique_sleeps()
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "exec", "--hosts", str(cluster.inventory),
                             "--sh", f"sh -c 'sleep {a}' & sleep {b}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    running: list[str] = []
    while time.monotonic() < deadline and len(running) < 6:   # two sleeps on each of three hosts
        running = subprocess.run(["pgrep", "-f", f"^sleep ({a}|{b})$"], capture_output=True,
                                 text=True).stdout.split()
        time.sleep(0.1)
    assert len(running) == 6, running
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert not leftover(a, b), "left running on a host"


def _ours(token):
    """The processes on this machine (every test host lives here) whose command line holds `token`."""
    out = subprocess.run(["ps", "-ww", "-A", "-o", "pid=", "-o", "args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if token in line]


def test_nothing_of_the_watchdog_is_left_on_the_host_when_a_command_ends(make_cluster):
    """The watcher ends with its command: no `sh` (and no `cat`) of ours lingers on the host after run()
    returns, nor after a streamed command ends while its channel is still open."""
    import queue

    from clusterctl.hosts.transport import read_until
    cluster = make_cluster(2)
    conn = connector(cluster)
    token = f"wd{os.getpid()}x{time.monotonic_ns()}"
    group = conn.run_everywhere(f": {token}; echo ok", timeout=20)
    assert group.all_ok and [o.value.stdout for o in group.values()] == ["ok\n", "ok\n"]
    assert _ours(token) == []          # at once, not after a grace period
    with conn.transport(conn.cluster.hosts[1]) as t:
        lines = queue.Queue()
        proc = t.stream(f": {token}; echo streamed", lines)
        out, err, finished = read_until(proc, lines, timeout=20)
        assert finished and out == ["streamed"] and err == []
        assert _ours(token) == [], "the watcher must not wait for the channel to close"
        assert proc.poll() == 0
