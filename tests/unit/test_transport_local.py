"""LocalTransport and the shell-quoting builders, run through a real /bin/sh."""
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from clusterctl.errors import CommandTimeout
from clusterctl.hosts.local import LocalTransport
from clusterctl.hosts.quoting import quote_path, shell_command
from clusterctl.hosts.remote import env_input, remote_command

HOSTILE = ["$(touch {canary})", "`touch {canary}`", "'; touch {canary}; '", '"; touch {canary}; "',
           "a b\tc", "x\ntouch {canary}", "${{IFS}}touch${{IFS}}{canary}", "\\'; touch {canary} #"]


def test_quote_path_keeps_tilde_as_home_and_quotes_the_rest():
    assert quote_path("~") == '"$HOME"'
    assert quote_path("~/a b/$(x)") == '"$HOME"/' + shlex.quote("a b/$(x)")
    assert quote_path("/abs/path") == "/abs/path"
    assert quote_path("~bob/x") == shlex.quote("~bob/x")   # only our own ~/ is expanded


def test_env_input_rejects_bad_env_names():
    with pytest.raises(ValueError, match=r"^not a valid environment variable name: 'A;B'$"):
        env_input({"A;B": "1"})


@pytest.mark.parametrize("value", ["plain", "two\nlines\n\n", "it's $(x) `y` \\n", ""])
def test_the_environment_arrives_on_stdin_never_on_the_command_line(value):
    """The shell reads the count and the lines first, the command sees the value exactly (newlines too), and
    the watchdog still has the rest of stdin, the channel: it stays open while the command runs, as an SSH
    channel does (closing it ends the command: closed at once, a command still running under load was TERMed)."""
    import os

    script = remote_command(shell_command('printf "%s|" "$V"; cat <&0 >/dev/null; echo done'), env=True)
    assert value == "" or value not in script
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdin.write(env_input({"V": value}))
    proc.stdin.flush()
    out = b""
    while not out.endswith(b"done\n"):
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        out += chunk
    proc.stdin.close()
    assert (proc.wait(timeout=20), out.decode()) == (0, value + "|done\n"), proc.stderr.read()


def test_a_stdin_ending_before_the_environment_does_not_run_the_command():
    script = remote_command(shell_command("echo ran"), env=True)
    for cut in (b"", b"2\nA=1; export A\n"):
        proc = subprocess.run(["/bin/sh", "-c", script], input=cut, capture_output=True, timeout=20)
        assert (proc.returncode, proc.stdout) == (125, b"")


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_env_values_paths_and_args_never_execute(tmp_path, template):
    canary = tmp_path / "pwned"
    value = template.format(canary=canary)
    workdir = tmp_path / value.replace("/", "_").replace("\n", "_")[:60]
    workdir.mkdir()
    t = LocalTransport()
    r = t.run(["printf", "%s|%s", value, "$V"], timeout=10, env={"V": value}, cwd=str(workdir))
    assert r.ok and r.stdout == f"{value}|$V", r     # argv words arrive verbatim, "$V" unexpanded
    r = t.run('printf "%s" "$V"; pwd', timeout=10, env={"V": value}, cwd=str(workdir))
    assert r.ok and r.stdout == value + str(workdir) + "\n"
    assert not canary.exists()


def test_remote_wrapper_preserves_exit_code_and_output_under_plain_sh():
    script = shell_command(["sh", "-c", 'echo out; echo err >&2; exit 7'])
    proc = subprocess.run(["/bin/sh", "-c", remote_command(script)], capture_output=True, text=True,
                          input="")
    assert (proc.returncode, proc.stdout, proc.stderr) == (7, "out\n", "err\n")


def test_remote_wrapper_kills_the_process_tree_when_stdin_closes(tmp_path):
    marker = tmp_path / "child.pid"
    script = shell_command(f"sleep 300 & echo $! > {shlex.quote(str(marker))}; wait")
    proc = subprocess.Popen(["/bin/sh", "-c", remote_command(script, grace=0.5)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not (marker.exists() and marker.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.02)     # the shell creates the file before `echo` writes the pid into it
    child = int(marker.read_text())
    time.sleep(0.3)
    assert proc.poll() is None, "the command must keep running while stdin is open"
    proc.stdin.close()   # what sshd does when the channel closes
    assert proc.wait(timeout=5) != 0
    assert _gone(child)


def test_local_run_times_out_and_kills_the_whole_group(tmp_path):
    marker = tmp_path / "pid"
    t = LocalTransport()
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        t.run(f"echo started; sleep 300 & echo $! > {shlex.quote(str(marker))}; wait", timeout=0.5)
    # A run that waited for the group would take the sleep's 300 s: a bound far below that, not a
    # tight figure near the 0.5 s timeout, so that a loaded machine cannot fail it.
    assert time.monotonic() - start < 60
    assert info.value.stdout == "started\n"
    assert _gone(int(marker.read_text()))


def test_local_put_is_atomic_and_keeps_mode(tmp_path):
    src = tmp_path / "src.sh"
    src.write_text("#!/bin/sh\necho hi\n")
    src.chmod(0o750)
    dest = tmp_path / "deep" / "er" / "dest.sh"
    LocalTransport().put(str(src), str(dest))
    assert dest.read_text() == src.read_text()
    assert dest.stat().st_mode & 0o777 == 0o750
    assert [p.name for p in dest.parent.iterdir()] == ["dest.sh"]   # no temporary left behind


def _gone(pid: int, within: float = 20.0) -> bool:
    """True once pid has exited (a zombie awaiting its reaper counts as exited). `within` is generous:
    it returns as soon as the process is gone, and only a process that never goes waits it out."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_read_until_keeps_what_a_stopped_command_printed(tmp_path):
    import queue

    from clusterctl.hosts.transport import read_until

    lines = queue.Queue()
    proc = LocalTransport().stream("echo first; echo oops >&2; sleep 300; echo never", lines)
    out, err, finished = read_until(proc, lines, timeout=1.0)
    assert (out, err, finished) == (["first"], ["oops"], False)
    assert proc.poll() is not None                                       # stopped, not left running
    lines = queue.Queue()
    assert read_until(LocalTransport().stream("echo a; echo b", lines), lines, timeout=30) == (["a", "b"], [], True)


def test_the_watchdog_kills_what_ignores_term_even_when_a_listed_pid_is_already_gone(tmp_path):
    """The watchdog lists the tree with ps, then signals it. A process that exits in between (a rank that
    saw its pipes close) makes `kill -TERM` fail for that pid; the KILL must still follow for the one that
    ignores TERM. A `ps` stand-in first on PATH makes that window certain: it lets the real ps list the
    tree, then tells the short-lived process to exit and waits until it has."""
    real_ps = shutil.which("ps")
    flag, quitter_pid, stubborn_pid = tmp_path / "listed", tmp_path / "quitter.pid", tmp_path / "stubborn.pid"
    fake = tmp_path / "bin" / "ps"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\n{real_ps} "$@"\n: > {flag}\n'
                    f'while kill -0 "$(cat {quitter_pid})" 2>/dev/null; do sleep 0.02; done\n')
    fake.chmod(0o755)
    script = shell_command(
        f"sh -c 'while [ ! -e {flag} ]; do sleep 0.02; done' & echo $! > {quitter_pid}\n"
        f"sh -c \"trap '' TERM; while :; do sleep 0.2; done\" & echo $! > {stubborn_pid}\n"
        "wait")
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["/bin/sh", "-c", remote_command(script, grace=0.5)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 20
    while not all(p.exists() and p.read_text().endswith("\n") for p in (quitter_pid, stubborn_pid)) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    stubborn = int(stubborn_pid.read_text())
    time.sleep(0.3)
    proc.stdin.close()   # the channel closes
    try:
        assert _gone(stubborn, within=10), "the TERM-ignoring process must be KILLed after the grace period"
    finally:
        try:
            os.kill(stubborn, signal.SIGKILL)     # only when the watchdog failed: do not leave it running
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@pytest.mark.parametrize("cap,finished", [(10.0, True), (1.2, False)])
def test_read_until_gives_a_command_that_keeps_printing_more_time_up_to_a_cap(cap, finished):
    """doctor's probes (issue 25 item 10): past its budget a command still printing goes on, up to the cap."""
    import queue

    from clusterctl.hosts.transport import read_until
    lines = queue.Queue()
    proc = LocalTransport().stream("for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.3; done", lines)
    out, _, done = read_until(proc, lines, 0.5, progress_s=1.0, cap=cap)
    assert done is finished and (out == [str(i) for i in range(1, 9)] if finished else 2 <= len(out) < 8), out
    lines = queue.Queue()
    proc = LocalTransport().stream("echo 1; sleep 30", lines)     # silent past the budget: stopped at once
    began = time.monotonic()
    out, _, done = read_until(proc, lines, 0.5, progress_s=1.0, cap=10.0)
    assert (out, done) == (["1"], False) and time.monotonic() - began < 3


def test_a_local_mpirun_starts_after_mlx_formed_an_mpi_world_of_one_in_this_process_or_its_parent(tmp_path):
    """mx.distributed.init() in a process mpirun did not start leaves an MPI singleton's identity in the C
    environment, where os.environ does not see it, and a process it starts has it in os.environ; an mpirun
    that inherits it exits 1 without a word (docs/facts/launchers.md#mpirun-under-an-mpi-singleton). Local
    commands get os.environ less that identity: mpirun starts from both."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed here")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    line = shlex.join([mpirun, *root, "--oversubscribe", "-np", "2", "echo", "hi"])
    child = f"""
from clusterctl.hosts.local import LocalTransport
r = LocalTransport().run({line!r}, timeout=60)
print(r.exit_code, r.stdout.split())
"""
    probe = f"""
import json, subprocess, sys
import mlx.core as mx
from clusterctl.hosts.local import LocalTransport
assert mx.distributed.init().size() == 1
bare = subprocess.run({line!r}, shell=True, capture_output=True, text=True)
ours = LocalTransport().run({line!r}, timeout=60)
inherited = dict(x.split("=", 1) for x in subprocess.run(["env"], capture_output=True, text=True).stdout.splitlines() if "=" in x)
assert inherited.get("OMPI_MCA_ess") == "singleton", sorted(inherited)
below = subprocess.run([sys.executable, "-c", {child!r}], capture_output=True, text=True, env=inherited)
print(json.dumps([bare.returncode, ours.exit_code, ours.stdout.split(), below.stdout.strip(), below.stderr[-500:]]))
"""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "OMPI_"))}   # whatever ran before here
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=clean)
    assert r.returncode == 0, r.stderr
    bare, ours, ours_out, below, below_err = json.loads(r.stdout)
    # the inherited environment fails mpirun (the fact this guards against); ours runs both ranks, here and below
    assert (bare, ours, ours_out) == (1, 0, ["hi", "hi"]), r.stdout
    assert below == "0 ['hi', 'hi']", (below, below_err)
