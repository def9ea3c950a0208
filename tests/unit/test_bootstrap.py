"""The bootstrap's pure parts, run from the very files whose text every rank runs (hosts/scripts/lines.py,
worldwatch.py, awake.py, inlined into launch.bootstrap.BOOTSTRAP): splitting output into lines and progress-bar
redraws, reporting the world MLX formed, and keeping a Mac awake while the rank lives."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.hosts.scripts import script_text
from clusterctl.hosts.scripts.awake import caffeinate_argv
from clusterctl.hosts.scripts.lines import BAR_EVERY_S, MAX_LINE, SPLIT, Lines
from clusterctl.launch.bootstrap import BOOTSTRAP
from sshcluster import caffeinates

LINES, WORLD, AWAKE = (script_text(name) for name in ("lines.py", "worldwatch.py", "awake.py"))
FAKE_DARWIN_BIN = Path(__file__).resolve().parents[1] / "fakedarwin" / "bin"


def feed_all(chunks, every=1.0, step=0.01):
    """Feed `chunks` (bytes) one by one, `step` seconds apart; every item out, then the end."""
    lines, out = Lines(every), []
    for i, chunk in enumerate(chunks):
        out += lines.feed(chunk, i * step)
    return out + lines.end()


def test_the_snippets_are_the_bootstrap_s_own():
    assert LINES in BOOTSTRAP and WORLD in BOOTSTRAP and AWAKE in BOOTSTRAP and "Lines(BAR_EVERY_S)" in BOOTSTRAP
    assert f"BAR_EVERY_S = {BAR_EVERY_S!r}" in BOOTSTRAP and BAR_EVERY_S == 1.0


def test_plain_lines_pass_through_as_they_are():
    assert feed_all([b"one\ntw", b"o\n\nthree"]) == [("line", b"one"), ("line", b"two"), ("line", b""),
                                                     ("line", b"three")]
    assert feed_all([b"  indented  \n"]) == [("line", b"  indented  ")]
    assert feed_all([]) == [] and feed_all([b""]) == []


def test_crlf_is_a_line_end_even_split_across_reads():
    assert feed_all([b"a\r\nb\r", b"\nc\r\n"]) == [("line", b"a"), ("line", b"b"), ("line", b"c")]
    # a trailing \r waits for what follows: no bar update for "b" before its \n arrives
    lines = Lines(0.0)
    assert lines.feed(b"b\r", 0.0) == [] and lines.feed(b"\n", 5.0) == [("line", b"b")]


def test_a_bar_shows_its_first_state_then_at_most_one_update_a_second_and_always_its_final_state():
    chunks = [b"\r%3d%%|%s|" % (i, b"#" * (i // 10)) for i in range(101)] + [b"\n"]
    out = feed_all(chunks, every=1.0, step=0.03)      # 101 redraws over 3 s
    bars = [text for kind, text in out if kind == "bar"]
    assert out[-1] == ("line", b"100%|##########|")
    assert [kind for kind, _ in out].count("line") == 1
    assert bars[0] == b"  0%||" and 3 <= len(bars) <= 5, bars


def test_the_final_state_is_the_last_non_blank_redraw():
    assert feed_all([b"\r 50%\r100%\r    \r\n"]) == [("line", b"100%")]
    assert feed_all([b"working...\rdone      \n"]) == [("line", b"done      ")]
    assert feed_all([b"\r\r\n"]) == [("line", b"")]


def test_a_bar_then_lines_then_another_bar():
    out = feed_all([b"\rA 1/2", b"\rA 2/2\nlog line\n\rB 1/3\rB 3/3", b"\nend"], every=100.0)
    assert [x for x in out if x[0] == "line"] == [("line", b"A 2/2"), ("line", b"log line"), ("line", b"B 3/3"),
                                                  ("line", b"end")]
    assert [x for x in out if x[0] == "bar"] == [("bar", b"A 1/2")]    # one update per 100 s here


def test_a_bar_split_mid_state_shows_the_partial_state_live_but_ends_whole():
    lines = Lines(0.0)
    assert lines.feed(b"\r 10%|#", 0.0) == [("bar", b" 10%|#")]
    assert lines.feed(b"#  |", 1.0) == [("bar", b" 10%|##  |")]
    assert lines.feed(b"\r 20%|###|", 2.0) == [("bar", b" 20%|###|")]
    assert lines.feed(b"\r 20%|###|", 3.0) == []                       # the same state is not shown again
    assert lines.end() == [("line", b" 20%|###|")]                    # the stream ended mid-bar


def test_tick_shows_a_stalled_bar_s_latest_state_once():
    lines = Lines(1.0)
    assert lines.feed(b"\r1%", 0.0) == [("bar", b"1%")]
    assert lines.feed(b"\r2%\r3%", 0.5) == []                          # too soon
    assert lines.tick(1.0) == [("bar", b"3%")] and lines.tick(5.0) == []
    assert lines.tick(6.0) == [] and Lines(1.0).tick(9.0) == []


def test_a_bar_s_memory_stays_bounded():
    lines = Lines(1.0)
    for i in range(20000):
        lines.feed(b"\r%d%%|%s|" % (i, b"#" * 40), i * 0.001)
    assert len(lines.rest) < 100 and lines.end() == [("line", b"19999%|" + b"#" * 40 + b"|")]


def _under_watch(program: str) -> subprocess.CompletedProcess:
    code = WORLD + "import sys\nwatch_world(lambda size, backend: print('REPORT', size, backend, flush=True))\n" + program
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_world_is_reported_once_whichever_way_init_is_called():
    pytest.importorskip("mlx.core")
    r = _under_watch("import mlx.core as mx\n"
                     "g = mx.distributed.init(False, 'ring')\n"
                     "from mlx.core.distributed import init\n"
                     "assert init is mx.distributed.init and init.__name__ == 'init' and init.__doc__\n"
                     "h = init(backend='any')\n"
                     "print(type(g).__module__, type(g).__name__, g.size(), h.size())\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["REPORT 1 ring", "mlx.core.distributed Group 1 1"]


def test_the_wrapper_is_in_place_for_a_from_import_before_any_call():
    pytest.importorskip("mlx.core")
    r = _under_watch("from mlx.core.distributed import init\nprint(init(backend='ring').size())\n")
    assert r.returncode == 0 and r.stdout.splitlines() == ["REPORT 1 ring", "1"], r.stderr


def test_a_program_without_mlx_never_loads_it_and_a_failed_init_reports_nothing():
    r = _under_watch("import json\nprint(sorted(m for m in sys.modules if m.startswith('mlx')))\n")
    assert r.returncode == 0 and r.stdout.splitlines() == ["[]"], r.stderr
    pytest.importorskip("mlx.core")
    r = _under_watch("import mlx.core as mx\ntry:\n    mx.distributed.init(strict=True, backend='ring')\n"
                     "except RuntimeError:\n    print('raised')\n")
    assert r.stdout.splitlines() == ["raised"], r.stderr


def test_an_mpi4py_world_is_reported_as_mpi4py_s():
    """Issue 42: mpi4py started by no MPI launcher is a world of one per rank that the program never notices; the
    watch reports the world its import formed, so the world check can name it."""
    pytest.importorskip("mpi4py")
    r = _under_watch("from mpi4py import MPI\nprint('size', MPI.COMM_WORLD.Get_size())\n")
    assert r.returncode == 0 and r.stdout.splitlines() == ["REPORT 1 mpi4py", "size 1"], r.stdout + r.stderr


def test_the_run_id_sits_in_the_first_bytes_of_every_ranks_command_line():
    """pgrep -f on macOS <= 13 (and toybox) matches only the first 2,048 bytes of a command line; the sweep
    finds ranks by their run id, so it must come before the ~3 KB bootstrap (docs/facts/macos.md#pgrep-2048-bytes)."""
    from clusterctl.inventory import parse
    from clusterctl.launch.job import rank_program

    cluster = parse("hosts: [{name: h1, python: /opt/homebrew/bin/python3}, {name: h2}]\n", "i.yaml")
    argv = rank_program(cluster, "20260101-abcdef", "train.py", ["--lr", "3e-4"])
    line = " ".join(argv)
    assert 0 <= line.find("clusterctl-run-20260101-abcdef") < 200 and len(line) > 2048
    assert argv[:2] == ["/opt/homebrew/bin/python3", "-c"] and argv[-3:] == ["train.py", "--lr", "3e-4"]


def test_the_bootstrap_raises_the_open_file_soft_limit(tmp_path):
    """launchd gives a Mac's sshd sessions a soft limit of 256 open files; Open MPI with btl_tcp_links 8 and 31
    peers needs about 250 sockets. The bootstrap raises the soft limit towards the hard one before the program
    runs (docs/facts/macos.md#open-file-limit-256). Here under `ulimit -n 256` in sh."""
    from clusterctl.inventory import parse
    from clusterctl.launch.job import rank_program

    script = tmp_path / "limits.py"
    script.write_text("import resource\nprint('NOFILE', *resource.getrlimit(resource.RLIMIT_NOFILE))\n")
    cluster = parse(f"hosts: [{{name: h1, python: {sys.executable}, workdir: {tmp_path}}}]\n", "i.yaml")
    argv = rank_program(cluster, "1-x", str(script), [])
    r = subprocess.run(["sh", "-c", 'ulimit -S -n 256 && exec "$@"', "sh", *argv], capture_output=True, text=True,
                       timeout=60)
    out = [line.split(" ", 3)[3] for line in r.stdout.splitlines() if " out NOFILE " in line]
    assert r.returncode == 0 and len(out) == 1, r
    soft, hard = (int(x) for x in out[0].split()[1:])
    assert soft == min(hard, 65536) and soft >= 4096 or hard < 4096 and soft == hard


def test_on_a_mac_a_rank_runs_under_caffeinate_watching_its_pid_and_nowhere_else():
    """caffeinate(8): -i no idle sleep, -s no system sleep (on AC power only), -w PID: ends when PID has exited
    (docs/facts/macos.md#caffeinate-keeps-ranks-awake)."""
    assert caffeinate_argv("Darwin", "/usr/bin/caffeinate", 4242) == ["/usr/bin/caffeinate", "-i", "-s", "-w", "4242"]
    assert caffeinate_argv("Linux", "/usr/bin/caffeinate", 4242) is None       # Ubuntu's caffeine has another one
    assert caffeinate_argv("Darwin", None, 4242) is None
    assert caffeinate_argv("", "/usr/bin/caffeinate", 4242) is None            # uname said nothing


def _rank_with_path(tmp_path, path_dirs, program):
    from clusterctl.inventory import parse
    from clusterctl.launch.job import rank_program

    script = tmp_path / "rank.py"
    script.write_text(program)
    cluster = parse(f"hosts: [{{name: h1, python: {sys.executable}, workdir: {tmp_path}}}]\n", "i.yaml")
    env = {**os.environ, "PATH": os.pathsep.join([*path_dirs, os.environ["PATH"]]),
           "FAKE_DARWIN_LOG": str(tmp_path / "refused.log")}
    return subprocess.Popen(rank_program(cluster, "1-x", str(script), []), stdout=subprocess.PIPE, text=True, env=env)


def test_a_rank_on_a_fake_mac_has_caffeinate_while_it_runs_and_none_after_even_killed(tmp_path):
    """The fake-Darwin stand-ins (a `uname` printing Darwin, a `caffeinate` that waits for -w's pid) first on
    PATH: the bootstrap starts caffeinate for the rank's own pid, stops it when the program ends, and a rank
    killed with SIGKILL (no chance to stop it) leaves none either: -w sees the pid gone."""
    for how in ("ends", "killed"):
        rank = _rank_with_path(tmp_path, [str(FAKE_DARWIN_BIN)], "import os, time\nprint('pid', os.getpid())\n"
                               "time.sleep(600 if %r == 'killed' else 2)\n" % how)
        pid = int(next(l for l in rank.stdout if " out pid " in l).split()[-1])
        assert pid == rank.pid and len(caffeinates({pid})) == 1
        if how == "killed":
            rank.kill()
        rank.wait(30)
        rank.stdout.close()
        deadline = time.monotonic() + 5
        while caffeinates({pid}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert caffeinates({pid}) == {}
    assert not (tmp_path / "refused.log").exists()            # caffeinate took every flag we gave it


def test_off_a_mac_no_caffeinate_is_started_even_when_one_is_on_path(tmp_path):
    """Only the stand-in caffeinate, not its uname: this is Linux, whose `caffeinate` (if any) is not Apple's."""
    alone = tmp_path / "bin"
    alone.mkdir()
    (alone / "caffeinate").symlink_to(FAKE_DARWIN_BIN / "caffeinate")
    rank = _rank_with_path(tmp_path, [str(alone)], "import os, time\nprint('pid', os.getpid())\ntime.sleep(1)\n")
    pid = int(next(l for l in rank.stdout if " out pid " in l).split()[-1])
    assert caffeinates({pid}) == {}
    assert rank.wait(30) == 0
    rank.stdout.close()


def test_a_line_longer_than_the_bound_is_cut_into_pieces_that_say_so():
    """Issue 25 item 6: a 2 MB line without a newline is never held whole (here, in the rank starter, in run)."""
    lines, out = Lines(1.0), []
    data = b"x" * (2 * 1024 * 1024 + 5)
    for i in range(0, len(data), 65536):          # as the pump reads it
        out += lines.feed(data[i:i + 65536], 0.0)
        assert len(lines.rest) <= MAX_LINE
    out += lines.feed(b"\nnext\n", 0.0)
    texts = [t for kind, t in out if kind == "line"]
    assert texts[-1] == b"next" and all(len(t) <= MAX_LINE + len(SPLIT) for t in texts)
    assert all(t.endswith(SPLIT) for t in texts[:-2]) and not texts[-2].endswith(SPLIT)
    assert b"".join(t.replace(SPLIT, b"") for t in texts[:-1]) == data          # nothing lost
    assert [len(t) for kind, t in Lines(1.0).feed(b"a" * 200000 + b"\nb\n", 0.0)] == \
        [MAX_LINE + len(SPLIT)] * 3 + [200000 - 3 * MAX_LINE, 1]


@pytest.mark.parametrize("read", [MAX_LINE, 4096, 65537])
def test_a_line_cuts_the_same_however_its_bytes_arrive(read):
    """A line of exactly 32 pieces: 32 lines, the note on 31, no empty line, whatever the read size (a read
    ending on a piece boundary used to cut all 32 with the note and leave an empty line for the newline)."""
    lines, out = Lines(1.0), []
    data = b"y" * (32 * MAX_LINE) + b"\nafter\n"
    for i in range(0, len(data), read):
        out += lines.feed(data[i:i + read], 0.0)
    texts = [t for kind, t in out if kind == "line"]
    assert len(texts) == 33 and texts[-1] == b"after" and sum(t.endswith(SPLIT) for t in texts) == 31
    assert texts[-2] == b"y" * MAX_LINE


def test_a_rank_started_before_its_host_s_stdin_relay_waits_for_its_fifo(tmp_path):
    """The relay starts beside the launcher (launch/stdinrelay.py), so a rank may come first: it waits for its
    attempt's FIFO, never opening one an earlier attempt left behind (a relay killed before it could remove it)."""
    from clusterctl.hosts.scripts import program
    from clusterctl.hosts.scripts.stackdump import rank_paths
    from clusterctl.hosts.scripts.stdinpump import fifo_path

    folder = rank_paths(str(tmp_path), "run1", "0")[0]
    os.makedirs(folder)
    os.mkfifo(fifo_path(folder, "0", "oldtag"))          # an earlier attempt's, nobody writes it
    rank = subprocess.Popen(
        [sys.executable, "-c", "import sys; from clusterctl.hosts.scripts.bootstrap import relayed_stdin; "
         f"relayed_stdin({str(tmp_path)!r}, '0'); print(sys.stdin.buffer.read().decode(), end='')"],
        env={**os.environ, "CLUSTERCTL_STDIN_RELAY": "newtag", "CLUSTERCTL_RUN_ID": "run1"},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    relay = subprocess.run([sys.executable, "-c", program("stdinrelay.py"), folder, "newtag", "0"],
                           input=b"for this attempt\n", capture_output=True, timeout=30)
    assert relay.returncode == 0 and relay.stdout == b"ready\n", relay.stderr
    out, err = rank.communicate(timeout=30)
    assert (out, err) == ("for this attempt\n", "")
    assert sorted(os.listdir(folder)) == ["rank-0.oldtag.stdin"]        # its own FIFO removed once opened


def test_a_rank_launched_beside_the_copy_runs_its_program_only_once_its_hosts_copy_is_marked(tmp_path):
    """run's warm launch copies the project beside the launcher: every rank's bootstrap waits for the mark of
    the copy's token (CLUSTERCTL_COPY_GATE) in <workdir>/.clusterctl/copies/ before the program starts, while its
    start line and heartbeats already flow (the supervisor sees a live rank)."""
    from clusterctl.inventory import parse
    from clusterctl.launch.job import rank_program
    from clusterctl.transfer.stage import COPIES_DIR, COPY_GATE_ENV

    (tmp_path / "job.py").write_text("print('ran', open('version.txt').read())\n")
    (tmp_path / "version.txt").write_text("old")
    cluster = parse(f"hosts: [{{name: h1, python: {sys.executable}, workdir: {tmp_path}}}]\n", "i.yaml")
    argv = rank_program(cluster, "1-x", "job.py", [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, COPY_GATE_ENV: "t0k3n", "PYTHONUNBUFFERED": "1"})
    try:
        first = proc.stdout.readline()
        assert " start " in first
        time.sleep(1.5)       # a heartbeat a second, nothing of the program's: it waits
        assert proc.poll() is None
        (tmp_path / "version.txt").write_text("new")       # the copy lands, then its end is marked
        (tmp_path / COPIES_DIR).mkdir(parents=True)
        (tmp_path / COPIES_DIR / "t0k3n").write_text("")
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert [line.split(" ", 3)[3] for line in out.splitlines() if " out " in line] == ["ran new"]
