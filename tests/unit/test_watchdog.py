"""The host-side watchdog (hosts/scripts/watchdog.sh, as hosts/remote.py's remote_command sends it) through a
real /bin/sh: it ends with its command, signals nothing after a normal end, and still kills a whole tree when
the channel (here: a pipe) closes; the standard-input frames it decodes for a command that reads the data after
the environment; and the file itself, run directly under each shell a host's /bin/sh may be."""
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from functools import partial

import pytest

from clusterctl.hosts.scripts.frames import PULSE, STDIN_END, stdin_frames
from clusterctl.hosts.quoting import shell_command
from clusterctl.hosts.remote import env_input, remote_command


def _ours(token: str) -> list[str]:
    """Every process whose command line holds `token` (the watchdog's shells carry the whole script)."""
    out = subprocess.run(["ps", "-ww", "-A", "-o", "pid=", "-o", "args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if token in line]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(path, within: float = 20.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


@pytest.mark.parametrize("stdin", [False, True])
def test_no_watchdog_process_outlives_a_normal_end_and_nothing_is_signalled(tmp_path, stdin):
    token = uuid.uuid4().hex
    log = tmp_path / "signals"
    # the command leaves a process behind that would note any signal: after a normal end, none must come,
    # not even when the channel closes afterwards
    keeper = f"trap 'echo TERM >> {shlex.quote(str(log))}; exit' TERM; sleep 3; echo done >> {shlex.quote(str(log))}"
    script = shell_command(f": {token}; (sh -c {shlex.quote(keeper)} &) ; echo ok")
    proc = subprocess.Popen(["/bin/sh", "-c", remote_command(script, grace=0.3, env=True, stdin=stdin)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(env_input({}) + (STDIN_END if stdin else b""))
    proc.stdin.flush()
    assert proc.wait(timeout=20) == 0
    # the channel is still open: the watcher must be gone all the same (it used to wait for the channel)
    assert [line for line in _ours(token) if "/bin/sh -c" in line and "exec 3<&0" in line] == []
    proc.stdin.close()
    assert proc.stdout.read() == b"ok\n" and proc.stderr.read() == b""
    deadline = time.monotonic() + 20
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text() == "done\n"


@pytest.mark.parametrize("stdin", [False, True])
def test_closing_the_channel_kills_the_whole_tree_grandchild_and_term_ignorer_included(tmp_path, stdin):
    pids = tmp_path / "pids"
    # a child, and a grandchild that ignores TERM: the KILL round after the grace period must find it
    inner = f"trap '' TERM; sleep 300 & echo $! >> {shlex.quote(str(pids))}; wait"
    script = shell_command(f"sh -c {shlex.quote(inner)} & echo $! >> {shlex.quote(str(pids))}; wait")
    proc = subprocess.Popen(["/bin/sh", "-c", remote_command(script, grace=0.5, env=True, stdin=stdin)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(env_input({}))
    proc.stdin.flush()
    deadline = time.monotonic() + 20
    while len((pids.read_text() if pids.exists() else "").split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    tree = [int(p) for p in pids.read_text().split()]
    assert len(tree) == 2 and all(_alive(p) for p in tree)
    proc.stdin.close()     # what sshd does when the channel closes
    proc.wait(timeout=20)
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in tree)


def test_the_command_reads_the_same_bytes_then_eof_while_the_channel_stays_open():
    data = [b"plain\n", b"  lead and trail  \n", b"back\\slash \\n $(x) `y` 'q' \"d\"\n", b"cr\r\n", b"\xff\xfe latin\n",
            b"\n", b"partial", b" tail"]
    script = shell_command("od -An -c | tr -s ' \\n' ' '; echo; echo status $?")
    proc = subprocess.Popen(["/bin/sh", "-c", remote_command(script, env=True, stdin=True)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(env_input({}) + b"".join(stdin_frames(chunk) for chunk in data) + STDIN_END)
    proc.stdin.flush()
    assert proc.wait(timeout=20) == 0      # EOF reached the command although the channel is still open
    proc.stdin.close()
    expected = subprocess.run(script, shell=True, input=b"".join(data), capture_output=True).stdout
    assert proc.stdout.read() == expected


SHELLS = [pytest.param("/bin/sh", id="sh")] + [
    # macOS's /bin/sh is bash in POSIX mode, and a login may bring a UTF-8 locale with it
    pytest.param("/bin/bash --posix", id="bash-posix-utf8", marks=pytest.mark.skipif(
        not os.path.exists("/bin/bash"), reason="no /bin/bash"))]


@pytest.mark.parametrize("shell", SHELLS)
def test_every_byte_passes_as_sent(shell):
    """Binary data with NUL bytes, backslashes and printf's own escapes (`\\c` would end %b's output, `%`
    a format) arrive byte for byte, in chunks cut anywhere."""
    rnd = os.urandom(300_000)
    data = rnd + b"\0\\c %s %b \\0101 \\x41 \\\n\n\0\0\\" + rnd[:1000] + b"tail\0"
    cuts = [0, 1, 7, 4096, 65537, 100_000, 200_001, len(data)]
    chunks = [data[a:b] for a, b in zip(cuts, cuts[1:])]
    script = shell_command("cat")
    text = remote_command(script, env=True, stdin=True).replace("/bin/sh", shell)
    proc = subprocess.run(shlex.split(shell) + ["-c", text], capture_output=True, timeout=60,
                          input=env_input({}) + b"".join(stdin_frames(c) for c in chunks) + STDIN_END,
                          env={**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data


def test_frames_escape_only_nul_and_backslash():
    assert stdin_frames(b"a\0b\\\nc%") == b"da\\0000b\\0134\npc%\n"


def test_a_rank_that_never_reads_stdin_is_still_killed_when_the_channel_closes(tmp_path):
    """A plain command that never reads would leave the watcher blocked on a full pipe; a rank's bootstrap
    drains its stdin (scripts/stdinpump.py), so the watcher keeps reading the channel."""
    pid = tmp_path / "pid"
    rank = ("import os, sys, time; from clusterctl.hosts.scripts.stdinpump import drain_stdin; drain_stdin(); "
            f"open({str(pid)!r}, 'w').write('%d\\n' % os.getpid()); time.sleep(300)")
    script = shell_command([sys.executable, "-c", rank])
    proc = subprocess.Popen(["/bin/sh", "-c", remote_command(script, grace=0.3, env=True, stdin=True)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(env_input({}))
    proc.stdin.flush()
    command = int(_wait_for(pid))
    # far more than a pipe holds: the watcher is blocked writing to a command that never reads ...
    writer = os.fork()
    if writer == 0:
        try:
            proc.stdin.write(stdin_frames(b"x" * 4096 + b"\n") * 256)
            proc.stdin.flush()
        finally:
            os._exit(0)
    time.sleep(0.5)
    os.kill(writer, 9)
    os.waitpid(writer, 0)
    proc.stdin.close()     # ... and the channel closes
    proc.wait(timeout=20)
    deadline = time.monotonic() + 20
    while _alive(command) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(command), "a watcher blocked on a full pipe no longer sees the channel close"


def test_a_terminal_is_read_only_in_the_foreground():
    """A terminal whose foreground process group is not ours (here: a pty that is nobody's controlling
    terminal) is left alone: no SIGTTIN, and a line typed there stays for whoever owns it."""
    import pty

    from clusterctl.hosts.stdinfeed import StdinFeed

    master, slave = pty.openpty()
    sent = []
    try:
        with open(slave, "rb", buffering=0, closefd=False) as source:
            StdinFeed(source).attach(sent.append)
            os.write(master, b"meant for the shell\n")
            time.sleep(1.0)
            assert sent == []
            assert os.read(slave, 100) == b"meant for the shell\n"      # still there, unread
    finally:
        os.close(master)
        os.close(slave)


LISTING_1 = """\
  101 MAIN Thu Nov 26 01:00:00 2026
  102  101 Thu Nov 26 01:00:01 2026
  103  102 Thu Nov  6 01:00:02 2026
  104    1 Thu Nov 26 01:00:03 2026
"""
LISTING_2 = """\
  102  777 Thu Nov 26 02:00:00 2026
  103    1 Thu Nov  6 01:00:02 2026
  105  103 Thu Nov 26 02:00:01 2026
"""


@pytest.mark.parametrize("listing, c, t, expected", [
    # the first round: the command's tree, while its pid is still the main shell's child
    (LISTING_1, "101", "", {"101", "102", "103"}),
    # its pid no longer the main shell's child (it exited, the pid went to another): nothing
    (LISTING_1.replace("101 MAIN", "101    1"), "101", "", set()),
    # the KILL round: 102 is another process now (another start time): spared; 103, orphaned when its
    # parent died, is the same one (pid and start time): killed, with the child it made since
    (LISTING_2, "101", "101 Thu Nov 26 01:00:00 2026\n102 Thu Nov 26 01:00:01 2026\n103 Thu Nov 6 01:00:02 2026",
     {"103", "105"}),
])
def test_the_watchdog_signals_only_processes_it_has_just_confirmed(tmp_path, listing, c, t, expected):
    """The ps listing the watchdog's rounds read, canned (a `ps` first on PATH), through its real awk: the
    file's own our_tree function."""
    import re

    from clusterctl.hosts.scripts import script_text

    our_tree = re.search(r"^our_tree\(\) \{\n.*?^\}\n", script_text("watchdog.sh"), re.M | re.S).group()
    (tmp_path / "listing").write_text(listing)
    ps = tmp_path / "ps"
    ps.write_text(f'#!/bin/sh\nsed "s/MAIN/$MAINPID/" {shlex.quote(str(tmp_path / "listing"))}\n')
    ps.chmod(0o755)
    script = f'MAINPID=$$; export MAINPID; PATH={shlex.quote(str(tmp_path))}:$PATH; c={c}; t={shlex.quote(t)}\n{our_tree}our_tree'
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert {line.split()[0] for line in out.splitlines()} == expected, out


# ---- the file itself: `sh watchdog.sh GRACE null|frames SCRIPT` ------------------------------------------
# under each shell a host's /bin/sh may be: dash, bash in POSIX mode (macOS's, here with a UTF-8 locale), zsh's
# sh emulation (the command itself runs under this machine's /bin/sh, as the file says)

WATCHDOG = os.path.join(os.path.dirname(__file__), "..", "..", "clusterctl", "hosts", "scripts", "watchdog.sh")
FILE_SHELLS = [pytest.param(["sh"], id="sh")] + [
    pytest.param(argv, id=name, marks=pytest.mark.skipif(shutil.which(argv[0]) is None, reason=f"no {argv[0]}"))
    for name, argv in (("bash-posix", ["bash", "--posix"]), ("zsh-sh", ["zsh", "--emulate", "sh"]))]
UTF8 = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}


@pytest.mark.parametrize("shell", FILE_SHELLS)
def test_the_file_passes_the_commands_bytes_status_and_output_and_ends_with_it(shell):
    """STDIN `frames`: the command reads the data byte for byte, sees EOF at the end frame while the channel
    stays open, and the watchdog exits with the command's status, its own watcher gone with it."""
    data = b"line\n\0 \\c %s \\0101 \xff\xfe\nlast without newline"
    script = "od -An -c | tr -s ' \\n' ' '; echo; echo err >&2; exit 7"
    proc = subprocess.Popen([*shell, WATCHDOG, "0.3", "frames", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=UTF8)
    proc.stdin.write(stdin_frames(data) + STDIN_END)
    proc.stdin.flush()
    try:
        assert proc.wait(timeout=20) == 7        # ended with the command: the channel is still open
    finally:
        proc.stdin.close()
    expected = subprocess.run(["sh", "-c", script], input=data, capture_output=True).stdout
    assert (proc.stdout.read(), proc.stderr.read()) == (expected, b"err\n")


@pytest.mark.parametrize("shell", FILE_SHELLS)
@pytest.mark.parametrize("mode", ["null", "frames"])
def test_the_file_kills_the_commands_tree_when_its_stdin_closes(tmp_path, shell, mode):
    """A child, and a grandchild that ignores TERM: closing the watchdog's stdin (the channel) ends both, the
    grandchild by the KILL round after the grace period."""
    pids = tmp_path / "pids"
    inner = f"trap '' TERM; sleep 300 & echo $! >> {shlex.quote(str(pids))}; wait"
    script = f"sh -c {shlex.quote(inner)} & echo $! >> {shlex.quote(str(pids))}; wait"
    proc = subprocess.Popen([*shell, WATCHDOG, "0.3", mode, script], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=UTF8)
    deadline = time.monotonic() + 20
    while len((pids.read_text() if pids.exists() else "").split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    left = tree = [int(p) for p in pids.read_text().split()]
    try:
        assert len(tree) == 2 and proc.poll() is None
        proc.stdin.close()
        proc.wait(timeout=20)
        deadline = time.monotonic() + 20
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [p for p in left if _alive(p)]
        assert left == []
    finally:
        for pid in [p for p in left if _alive(p)]:      # what the watchdog failed to end: leave nothing running
            os.kill(pid, 9)


@pytest.mark.parametrize("mode, alive", [("", []), ("stdin", []), ("NULL", []), ("null", ["3s"]), ("null", ["-1"])])
def test_the_file_refuses_a_stdin_mode_or_alive_it_does_not_know_and_runs_nothing(tmp_path, mode, alive):
    ran = tmp_path / "ran"
    proc = subprocess.run(["sh", WATCHDOG, "1", mode, f": > {shlex.quote(str(ran))}", *alive], input=b"",
                          capture_output=True, timeout=20)
    assert (proc.returncode, proc.stdout, proc.stderr) == \
        (125, b"", b"usage: watchdog.sh GRACE null|frames SCRIPT [ALIVE]\n")
    assert not ran.exists()


@pytest.mark.parametrize("stdin", [False, True])
def test_alive_a_channel_that_goes_silent_after_a_pulse_is_taken_as_closed(tmp_path, stdin):
    """ALIVE 2: a command whose channel stays open but brings no pulse for 2 s (its sender vanished without
    closing it: a power cut) is killed, tree and all, as when the channel closes; one whose pulses come on runs
    to its end; and before the first pulse nothing is counted (a sender that pulses only once its stdin ended).
    The three side by side."""
    token = uuid.uuid4().hex
    script = shell_command(f": {token}; sleep 4; echo ended")
    head = env_input({}) + (STDIN_END if stdin else b"")
    started = {}
    for case, first in (("kept", PULSE), ("unarmed", b""), ("cut", PULSE)):
        proc = subprocess.Popen(["/bin/sh", "-c", remote_command(script, grace=0.3, env=True, stdin=stdin, alive=2)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "TMPDIR": str(tmp_path)})
        proc.stdin.write(head + first)
        proc.stdin.flush()
        started[case] = proc
    began = time.monotonic()
    kept = started["kept"]
    while kept.poll() is None and time.monotonic() - began < 20:      # pulses every 0.5 s
        kept.stdin.write(PULSE)
        kept.stdin.flush()
        time.sleep(0.5)
    for case in ("kept", "unarmed"):          # both to their end, the silent one never armed
        assert started[case].wait(timeout=20) == 0 and started[case].stdout.read() == b"ended\n", case
    cut = started["cut"]                       # one pulse, then silence with the channel open: killed at ~2 s
    assert cut.wait(timeout=20) != 0 and cut.stdout.read() == b""
    deadline = time.monotonic() + 10
    while _ours(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ours(token) == [] and not list(tmp_path.glob(".clusterctl-alive.*"))     # nothing left, mark gone
    for proc in started.values():
        proc.stdin.close()
