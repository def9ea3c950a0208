"""hosts/scripts/watchdog.sh run as the file it is (`sh watchdog.sh GRACE null|frames SCRIPT`), under each
shell a host's /bin/sh may be: dash, bash in POSIX mode (macOS's, with a UTF-8 locale), zsh's sh emulation.
tests/unit/test_watchdog.py runs it as hosts/remote.py sends it."""
import os
import shlex
import shutil
import subprocess
import time

import pytest

from clusterctl.hosts.scripts.frames import STDIN_END, stdin_frames

WATCHDOG = os.path.join(os.path.dirname(__file__), "..", "..", "clusterctl", "hosts", "scripts", "watchdog.sh")
SHELLS = [pytest.param(["sh"], id="sh")] + [
    pytest.param(argv, id=name, marks=pytest.mark.skipif(shutil.which(argv[0]) is None, reason=f"no {argv[0]}"))
    for name, argv in (("bash-posix", ["bash", "--posix"]), ("zsh-sh", ["zsh", "--emulate", "sh"]))]
UTF8 = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}


def _gone(pid: int, within: float = 20.0) -> bool:
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


@pytest.mark.parametrize("shell", SHELLS)
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


@pytest.mark.parametrize("shell", SHELLS)
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
    tree = [int(p) for p in pids.read_text().split()]
    try:
        assert len(tree) == 2 and proc.poll() is None
        proc.stdin.close()
        proc.wait(timeout=20)
        assert all(_gone(p) for p in tree)
    finally:
        for pid in tree:      # only when the watchdog failed: leave nothing running
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("mode", ["", "stdin", "NULL"])
def test_the_file_refuses_a_stdin_mode_it_does_not_know_and_runs_nothing(tmp_path, mode):
    ran = tmp_path / "ran"
    proc = subprocess.run(["sh", WATCHDOG, "1", mode, f": > {shlex.quote(str(ran))}"], input=b"",
                          capture_output=True, timeout=20)
    assert (proc.returncode, proc.stdout, proc.stderr) == (125, b"", b"usage: watchdog.sh GRACE null|frames SCRIPT\n")
    assert not ran.exists()
