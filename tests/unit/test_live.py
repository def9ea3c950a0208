"""run's live panel on canned events: the metrics line (progress.py), the state model (observe/live.py),
the supervisor's hook (a metrics line feeds the panel only) and the rendering (cli/panel.py)."""
import json
import subprocess
import sys
from unittest import mock

import pytest

from clusterctl import progress
from clusterctl.launch.bootstrap import MARK
from clusterctl.launch.stall import StallPolicy
from clusterctl.launch.ranklines import Rank, RankLines
from clusterctl.launch.world import WorldCheck
from clusterctl.observe.live import LiveRun


# ---- the metrics line ---------------------------------------------------------------------------

def test_report_prints_one_line_that_parse_reads_back(capsys):
    progress.report(step=10, total_steps=100, loss=2.5, tokens_per_s=1234.5, peak_mem_mb=512)
    out = capsys.readouterr().out
    assert out == 'clusterctl:metrics {"step": 10, "total_steps": 100, "loss": 2.5, "tokens_per_s": 1234.5, ' \
                  '"peak_mem_mb": 512}\n'
    assert progress.parse(out.rstrip("\n")) == {"step": 10, "total_steps": 100, "loss": 2.5, "tokens_per_s": 1234.5,
                                                "peak_mem_mb": 512}


@pytest.mark.parametrize("line", ["step 10 | loss 2.3", "clusterctl:metrics {oops", "clusterctl:metrics [1, 2]",
                                  ' clusterctl:metrics {"step": 1}', 'clusterctl:metrics{"step": 1}'])
def test_other_lines_are_not_metrics(line):
    assert progress.parse(line) is None


def test_unknown_and_non_numeric_fields_are_dropped():
    line = progress.MARKER + json.dumps({"step": 3, "loss": "high", "flag": True, "tokens_per_s": float("nan"),
                                         "peak_mem_mb": True, "lr": 0.1})
    assert progress.parse(line) == {"step": 3}


def test_hostile_metrics_lines_are_dropped_or_refused_never_raised():
    assert progress.parse('clusterctl:metrics {"step": 1' + "0" * 400 + ', "loss": 2}') == {"loss": 2.0}
    assert progress.parse('clusterctl:metrics {"step": 1e400}') == {}
    with pytest.raises(progress.Unreadable, match="nested too deep"):
        progress.parse("clusterctl:metrics " + "[" * 50000)
    with pytest.raises(progress.Unreadable, match="over 65,536"):
        progress.parse('clusterctl:metrics {"step": 1, "pad": "' + "x" * 70000 + '"}')


def test_the_supervisor_drops_an_unreadable_metrics_line_with_one_warning(tmp_path):
    ranks = [Rank(0, "h1", [str(tmp_path / "rank-0.log")])]
    emitted = []
    lines = RankLines(ranks, open(tmp_path / "launcher.log", "a"), WorldCheck(1, "ring"),
                      lambda text, err: emitted.append(text))
    for _ in range(3):
        assert lines.handle(f"{MARK}0 out {progress.MARKER}" + "[" * 50000) is None
    lines.handle(f"{MARK}0 out after")
    ranks[0].close()
    assert emitted == ["warning: rank 0 on h1 printed a metrics line clusterctl does not read (nested too deep): "
                       "dropped, as any more will be", "[rank 0 h1] after"]
    assert (tmp_path / "rank-0.log").read_text() == "after\n"


def test_the_helper_imports_without_mlx_or_anything_but_the_standard_library():
    code = ("import sys; from clusterctl import report; report(step=1); "
            "print(sorted(m for m in ('mlx', 'click', 'rich', 'yaml') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout == 'clusterctl:metrics {"step": 1}\n[]\n'


# ---- the state model ----------------------------------------------------------------------------

def test_states_heartbeat_and_output_rate():
    live = LiveRun(["h1", "h2"], now=100.0)
    rows = live.snapshot(100.5).ranks
    assert [(r.rank, r.host, r.state, r.since_seen_s, r.step) for r in rows] == [
        (0, "h1", "starting", None, None), (1, "h2", "starting", None, None)]
    live.update(0, "start", "", 101.0)
    live.update(1, "hb", "", 101.5)
    for t in range(10):
        live.update(0, "out", "a line", 102.0 + t * 0.5)
    rows = live.snapshot(107.0).ranks
    assert [r.state for r in rows] == ["running", "running"]
    assert rows[0].since_seen_s == pytest.approx(0.5) and rows[1].since_seen_s == pytest.approx(5.5)
    assert rows[0].lines_per_s == pytest.approx(10 / 7.0) and rows[1].lines_per_s == 0
    assert live.snapshot(130.0).ranks[0].lines_per_s == 0           # the window has moved past them
    live.update(0, "exit", 0, 131.0)
    live.update(1, "exit", 3, 131.0)
    assert [r.state for r in live.snapshot(131.0).ranks] == ["finished", "failed"]
    live = LiveRun(["h1"], now=0.0)
    live.update(0, "lost", "-9", 1.0)         # the rank starter saw it die without an exit line
    assert live.snapshot(1.0).ranks[0].state == "failed"


def test_a_straggler_is_behind_until_it_progresses_again():
    live = LiveRun(["h1", "h2"], now=0.0)
    live.update(1, "start", "", 1.0)
    live.update(1, "straggler", 30.0, 40.0)           # the stall watchdog's warning: not a sign of life
    row = live.snapshot(41.0).ranks[1]
    assert row.state == "behind" and row.since_seen_s == pytest.approx(40.0)
    live.update(1, "hb", "", 42.0)                    # a heartbeat is no progress
    assert live.snapshot(42.0).ranks[1].state == "behind"
    live.update(1, "metrics", {"step": 12}, 43.0)
    assert live.snapshot(43.0).ranks[1].state == "running"
    live.update(1, "exit", 0, 44.0)
    live.update(1, "straggler", 1.0, 45.0)            # too late to matter
    assert live.snapshot(45.0).ranks[1].state == "finished"


def test_metrics_give_each_rank_its_row_and_the_job_its_eta_and_global_rate():
    live = LiveRun(["h1", "h2"], now=0.0)
    job = live.snapshot(1.0).job
    assert (job.elapsed_s, job.step, job.eta_s, job.tokens_per_s) == (1.0, None, None, None)
    for t, step in ((10.0, 10), (20.0, 20)):
        live.update(0, "metrics", {"step": step, "total_steps": 100, "loss": 3.0, "tokens_per_s": 500.0,
                                   "peak_mem_mb": 64.0}, t)
        live.update(1, "metrics", {"step": step, "total_steps": 100, "loss": 3.1, "tokens_per_s": 400.0,
                                   "peak_mem_mb": 60.0}, t + 0.1)
    snap = live.snapshot(21.0)
    assert [(r.step, r.total_steps, r.loss, r.tokens_per_s, r.peak_mem_mb) for r in snap.ranks] == [
        (20, 100, 3.0, 500.0, 64.0), (20, 100, 3.1, 400.0, 60.0)]
    assert (snap.job.step, snap.job.total_steps, snap.job.tokens_per_s) == (20, 100, 900.0)
    # 10 steps in 10.0 s (each step counts once the slowest rank has it), 80 to go, 0.9 s since the last
    assert snap.job.eta_s == pytest.approx(80 * 1.01 - 0.9)


def test_the_job_step_is_the_slowest_reporting_rank_and_a_rank_without_metrics_waits():
    live = LiveRun(["h1", "h2", "h3"], now=0.0)
    live.update(0, "metrics", {"step": 30}, 5.0)
    live.update(1, "metrics", {"step": 20}, 5.0)
    live.update(2, "out", "no metrics here", 5.0)
    snap = live.snapshot(6.0)
    assert snap.job.step == 20 and snap.job.total_steps is None and snap.job.eta_s is None
    assert snap.ranks[2].step is None and snap.ranks[2].state == "running"
    live.update(7, "metrics", {"step": 1}, 6.0)       # a rank the launch does not have: ignored


# ---- the supervisor's hook ----------------------------------------------------------------------

def test_a_metrics_line_feeds_the_panel_and_is_neither_shown_nor_logged(tmp_path):
    ranks = [Rank(0, "h1", [str(tmp_path / "rank-0.log")])]
    emitted, heard = [], []
    launcher_log = open(tmp_path / "launcher.log", "a")

    lines = RankLines(ranks, launcher_log, WorldCheck(1, "ring"), lambda text, err: emitted.append(text),
                      status=lambda rank, kind, value, now: heard.append((rank, kind, value)))

    def handle(line):
        return lines.handle(line)

    handle(f"{MARK}0 start")
    handle(f"{MARK}0 out step 1 | loss 2.0")
    handle(f'{MARK}0 out {progress.MARKER}{{"step": 1, "loss": 2.0}}')
    handle(f"{MARK}0 out {progress.MARKER}not json")
    handle(f"{MARK}0 exit 0 1")
    ranks[0].close()
    assert emitted == ["[rank 0 h1] step 1 | loss 2.0", f"[rank 0 h1] {progress.MARKER}not json"]
    assert (tmp_path / "rank-0.log").read_text() == f"step 1 | loss 2.0\n{progress.MARKER}not json\n"
    assert list(ranks[0].tail) == ["step 1 | loss 2.0", f"{progress.MARKER}not json"]
    assert heard == [(0, "start", ""), (0, "out", "step 1 | loss 2.0"), (0, "metrics", {"step": 1, "loss": 2.0}),
                     (0, "out", f"{progress.MARKER}not json"), (0, "exit", 0)]


def test_the_supervisors_lines_feed_the_stall_watch(tmp_path):
    """Heartbeats are not progress, output lines and metrics lines are, quiet_s announces a quiet phase, and a
    straggler is warned of on the screen, in launcher.log and to the panel."""
    ranks = [Rank(r, f"h{r + 1}", [str(tmp_path / f"rank-{r}.log")]) for r in range(2)]
    emitted, heard = [], []
    lines = RankLines(ranks, open(tmp_path / "launcher.log", "a"), WorldCheck(2, "ring"),
                      lambda text, err: emitted.append(text), status=lambda *event: heard.append(event[:2]),
                      stall=StallPolicy.parse(10))
    clock = iter(range(1000))
    with mock.patch("clusterctl.launch.supervise.time.monotonic", lambda: float(next(clock))):
        for r in (0, 1):
            lines.handle(f"{MARK}{r} start")              # t 0, 1: armed at 1 (every rank started)
        lines.handle(f'{MARK}1 out {progress.MARKER}{{"step": 1}}')      # t 2
        for _ in range(15):
            lines.handle(f"{MARK}1 hb")                   # t 3..17: heartbeats only
        assert lines.stall(18.0) is not None and lines.stall(11.0) is None
        lines.handle(f'{MARK}0 out {progress.MARKER}{{"step": 1, "quiet_s": 60}}')   # t 18
        assert lines.stall(70.0) is None and lines.stall(79.0) is not None
        for _ in range(12):
            lines.handle(f'{MARK}0 out {progress.MARKER}{{"step": 2}}')                # t 19..30: rank 0 only
        lines.lagging(30.0)
    assert emitted == ["warning: rank 1 on h2 is behind: no progress for 28s while other ranks progress "
                       "(a stall if they stop too)"]
    assert (1, "straggler") in heard
    assert "rank 1 on h2 is behind" in (tmp_path / "launcher.log").read_text()


def test_a_failing_status_hook_is_dropped_with_one_warning_and_the_job_goes_on(tmp_path):
    ranks = [Rank(0, "h1", [str(tmp_path / "rank-0.log")])]
    emitted, calls = [], []

    def broken(rank, kind, value, now):
        calls.append(kind)
        raise OverflowError("a panel bug")

    lines = RankLines(ranks, open(tmp_path / "launcher.log", "a"), WorldCheck(1, "ring"),
                      lambda text, err: emitted.append(text), status=broken)
    lines.handle(f'{MARK}0 out {progress.MARKER}{{"step": 1}}')
    lines.handle(f"{MARK}0 out still here")
    assert lines.handle(f"{MARK}0 exit 0 0").exit_code == 0
    ranks[0].close()
    assert calls == ["metrics"]           # asked once, then no more
    assert emitted == ["warning: the live panel failed (OverflowError: a panel bug); the run goes on without it",
                       "[rank 0 h1] still here"]


# ---- the rendering ------------------------------------------------------------------------------

def test_the_panel_renders_a_row_per_rank_and_the_job_line():
    from rich.console import Console

    from clusterctl.cli.panel import clock, render

    live = LiveRun(["h1", "h2"], now=0.0)
    live.update(0, "metrics", {"step": 10, "total_steps": 100, "loss": 2.34567, "tokens_per_s": 1500.0,
                               "peak_mem_mb": 12.25}, 5.0)
    live.update(0, "metrics", {"step": 20, "total_steps": 100}, 10.0)
    live.update(1, "metrics", {"step": 20}, 10.0)
    live.update(1, "exit", 1, 11.0)
    console = Console(width=120, record=True, color_system=None)
    console.print(render(live.snapshot(12.0)))
    text = console.export_text()
    assert "job: elapsed 0:12  step 20/100  ETA 0:38  1,500 tok/s" in text     # 2 steps/s, 80 to go, 2 s since
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert rows == [["0", "h1", "running", "20/100", "2.3457", "1,500", "12.2", "MB", "2.0s", "ago", "0.0"],
                    ["1", "h2", "failed", "20", "-", "-", "-", "1.0s", "ago", "0.0"]]
    assert (clock(59), clock(61), clock(3725)) == ("0:59", "1:01", "1:02:05")
    live.update(1, "metrics", {"step": 20, "share": 0.25}, 11.5)      # the bundled trainer's balancing: a column
    console = Console(width=120, record=True, color_system=None)
    console.print(render(live.snapshot(12.0)))
    text = console.export_text()
    assert "SHARE" in text.splitlines()[1]
    assert [line.split()[6] for line in text.splitlines() if line.strip()[:1].isdigit()] == ["-", "25%"]


def test_no_panel_without_a_terminal_or_with_plain():
    from clusterctl.cli.printedrun import panel_wanted

    assert panel_wanted(plain=True) is False
    assert panel_wanted(plain=False) is (sys.stdout.isatty() and sys.stderr.isatty())


# ---- a stop with the work kept (launch/stop.py, docs/run.md#ctrl-c-and-sigterm) ---------------------------

def test_the_ranks_offer_to_stop_with_their_work_kept_and_say_when_they_did(tmp_path):
    """Every live rank must have offered (stop_s) for run to ask; the longest offer is how long it waits; an offer
    withdrawn (0) or a rank that never made one means a stop at once. Once a rank says it stopped, its exit is a
    stop, not a failure, and the launcher's complaints about the ranks' exits are logged, not shown."""
    ranks = [Rank(r, f"h{r + 1}", [str(tmp_path / f"rank-{r}.log")]) for r in range(2)]
    emitted = []
    lines = RankLines(ranks, open(tmp_path / "launcher.log", "a"), WorldCheck(2, "ring"),
                      lambda text, err: emitted.append(text))
    for r in (0, 1):
        lines.handle(f"{MARK}{r} start")
    assert lines.stop_bound() is None
    lines.handle(f'{MARK}0 out {progress.MARKER}{{"step": 1, "stop_s": 70.5}}')
    assert lines.stop_bound() is None                           # rank 1 has not offered
    lines.handle(f'{MARK}1 out {progress.MARKER}{{"stop_s": 64}}')
    assert lines.stop_bound() == 70.5
    lines.handle(f'{MARK}0 out {progress.MARKER}{{"stop_s": 0}}')
    assert lines.stop_bound() is None                           # withdrawn: the loop has ended
    lines.handle(f'{MARK}0 out {progress.MARKER}{{"stop_s": 61}}')
    lines.handle("mpirun: a complaint before the stop")
    assert lines.stopped_step is None and lines.stop_bound() == 64
    lines.handle(f'{MARK}1 out {progress.MARKER}{{"stopped": 37}}')
    lines.handle("mpirun: a complaint about an exit code after it")
    ended = lines.handle(f"{MARK}1 exit 143 1")
    assert lines.stopped_step == 37 and ended.exit_code == 143 and ended.state.value == "stopped"
    assert "wrote a checkpoint at step 37" in ended.reason
    assert emitted == ["[launcher] mpirun: a complaint before the stop"]
    assert "after it" in (tmp_path / "launcher.log").read_text()


def test_watching_a_stop_ends_with_every_rank_or_says_why_the_checkpoint_is_not_written(tmp_path):
    import queue
    import time

    from clusterctl.launch.supervise import _watch_stop

    class Launcher:             # still running, its output read as the queue gives it
        readers = []

        def poll(self):
            return None

    def watch(events, within=5.0):
        ranks = [Rank(r, f"h{r + 1}", [str(tmp_path / f"rank-{r}.log")]) for r in range(2)]
        lines = RankLines(ranks, open(tmp_path / "launcher.log", "a"), WorldCheck(2, "ring"), lambda text, err: None)
        queued = queue.Queue()
        for event in [f"{MARK}0 start", f"{MARK}1 start", *events]:
            queued.put((False, event))
        started = time.monotonic()
        why = _watch_stop(lines, Launcher(), queued, started + within, within)
        return why, lines.stopped_step, time.monotonic() - started

    stopped = f'out {progress.MARKER}{{"stopped": 12}}'
    assert watch([f"{MARK}0 {stopped}", f"{MARK}1 {stopped}", f"{MARK}1 exit 130 1", f"{MARK}0 exit 130 1"])[:2] == (None, 12)
    why, step, _ = watch([f"{MARK}0 out step 11", f"{MARK}1 exit 1 0"])
    assert why == "rank 1 on h2 exited 1 before it was written" and step is None
    why, step, took = watch([f"{MARK}0 hb"], within=1.0)
    assert why == "the ranks did not stop within 1s" and step is None and 1.0 <= took < 5
