"""The rank starter (hosts/scripts/ranks.py) run as a file on this machine, its ranks plain `sh -c` programs:
output relayed line by line, the first failure stopping the others and named, a rank that never reported its
own exit told as `lost`, a signal stopping every rank; its stdin copied to every rank behind the watchdog."""
import json
import os
import signal
import subprocess
import sys
import time

from clusterctl.hosts.scripts import program
from clusterctl.hosts.quoting import shell_command
from clusterctl.hosts.remote import env_input, remote_command

WAIT = "cat >/dev/null; echo stopped"       # a rank that runs until the starter closes its stdin


def _start(tmp_path, *programs, stdin=subprocess.DEVNULL, watchdog=False, alive=0) -> subprocess.Popen:
    """ranks.py as the backends ship it (program(): its pieces inlined), each program a rank; with `watchdog`,
    behind the watchdog with its environment and standard input in frames, as ranks start in `run` (`alive`:
    with the watchdog's ALIVE and the starter's pulses, as a rank on another host starts)."""
    spec, starter = tmp_path / "spec.json", tmp_path / "ranks.py"
    starter.write_text(program("ranks.py"))
    ranks = [{"rank": i, "host": f"h{i}", "argv": ["sh", "-c", p]} for i, p in enumerate(programs)]
    if watchdog:
        for r in ranks:
            r["argv"][2] = remote_command(shell_command(r["argv"][2]), env=True, stdin=True, alive=alive)
            r["stdin"] = env_input({"RANK": str(r["rank"])}).decode()
            r["alive"] = alive
    spec.write_text(json.dumps({"ranks": ranks}))
    return subprocess.Popen([sys.executable, str(starter), str(spec)], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_its_stdin_reaches_every_rank_whole_then_eof(tmp_path):
    data = b"a\nb  \\ $(x)\n\xff tail"
    read = 'echo "$RANK:$(od -An -tx1 | tr -d " \\n")"'
    p = _start(tmp_path, read, read, read, stdin=subprocess.PIPE, watchdog=True)
    out, err = p.communicate(data, timeout=30)
    assert p.returncode == 0 and err == b""
    assert sorted(out.decode().split()) == [f"{rank}:{data.hex()}" for rank in range(3)]


def test_without_stdin_every_rank_sees_eof_at_once(tmp_path):
    p = _start(tmp_path, "cat; echo eof", "cat; echo eof", watchdog=True)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and out == b"eof\neof\n" and err == b""


def test_every_rank_s_lines_are_relayed_and_a_clean_job_exits_0(tmp_path):
    p = _start(tmp_path, "echo one; printf 'two\\nno newline'", "echo err >&2")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0
    assert sorted(out.split(b"\n")) == [b"", b"no newline", b"one", b"two"] and err == b"err\n"


def test_the_first_failure_stops_the_others_and_a_rank_that_never_reported_is_lost(tmp_path):
    p = _start(tmp_path, WAIT, "sleep 0.3; exit 7")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 7
    assert err == b"rank 1 on h1 exited 7; stopping every rank\n"
    assert sorted(out.split(b"\n")) == [b"", b"\x1eclusterctl 1 lost 7", b"stopped"]


def test_a_rank_that_reported_its_exit_is_not_lost(tmp_path):
    p = _start(tmp_path, WAIT, "printf '\\036clusterctl 1 exit 4 0\\n'; exit 4")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 4 and b" lost " not in out and b"\x1eclusterctl 1 exit 4 0\n" in out


def test_sigterm_stops_every_rank_with_128_plus_the_signal(tmp_path):
    p = _start(tmp_path, WAIT, WAIT)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM and out == b"stopped\nstopped\n" and err == b""


def test_its_pulses_keep_a_rank_on_and_a_starter_that_vanishes_leaves_it_no_more_than_alive_seconds(tmp_path):
    """A rank started with ALIVE 2 (its watchdog) is pulsed by the starter: it runs past 2 s to its end. Then a
    starter frozen with its pipes open (its host asleep, or its power cut: nothing closes) stops pulsing, and
    the rank's watchdog kills the rank within ALIVE seconds, as when the pipe closes."""
    p = _start(tmp_path, "sleep 3; echo ended", watchdog=True, alive=2)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and out == b"ended\n" and err == b""
    rank = f"sleep 30.{os.getpid()}"          # a command line no other test's rank has
    p = _start(tmp_path, rank, watchdog=True, alive=2)
    time.sleep(1.0)
    p.send_signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        while time.monotonic() - began < 10 and _running(rank):
            time.sleep(0.1)
        assert not _running(rank) and time.monotonic() - began < 5, time.monotonic() - began
    finally:
        p.send_signal(signal.SIGCONT)
    p.communicate(timeout=30)


def _running(command: str) -> bool:
    return subprocess.run(["pgrep", "-xf", command], capture_output=True).returncode == 0
