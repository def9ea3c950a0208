"""The supervisor's loop (launch/supervise.py) as a state machine: its phases' transitions, pure, and the loop
driven through them by canned rank lines (a launcher that is still running, its output already queued)."""
import queue
import time

from clusterctl.launch.bootstrap import MARK
from clusterctl.launch.outcome import AttemptState, Outcome
from clusterctl.launch.ranklines import Rank, RankLines
from clusterctl.launch import causes
from clusterctl.launch.supervise import (
    CAUSE_WAIT_S,
    FOLLOWED_WAIT_S,
    Failing,
    Running,
    Supervisor,
    _Preflight,
    on_failure,
)
from clusterctl.launch.world import WorldCheck


def test_the_first_failure_is_held_and_only_a_lost_ranks_word_replaces_it():
    first = Outcome(1, "rank 1 on h2 exited 1", failed_rank=1)
    failing = on_failure(Running(since=0.0, checked=0.0), first, 10.0)
    assert failing == Failing(first, 10.0) and not failing.over(10.0 + CAUSE_WAIT_S)
    assert failing.over(10.0 + CAUSE_WAIT_S + 0.01)
    later = Outcome(1, "rank 0 on h1 exited 1", failed_rank=0)
    assert on_failure(failing, later, 10.2) is failing              # a rank failing after it: not the cause
    lost = Outcome(137, "rank 0 on h1 was killed by SIGKILL", failed_rank=0, ended_as=AttemptState.LOST)
    assert on_failure(failing, lost, 10.3) == Failing(lost, 10.0)   # the cause; the hold does not start again
    assert on_failure(Running(since=0.0, checked=0.0), lost, 5.0).over(5.0)    # a lost rank's word is final


def test_a_rank_that_followed_a_peer_is_held_longer_and_the_ranks_own_failure_replaces_it():
    peer = causes.Cause(causes.PEER_LOST, "RuntimeError: [ring] connection to a peer was lost")
    followed = Outcome(1, "rank 0 on h1 exited 1", failed_rank=0, cause=peer)
    failing = on_failure(Running(since=0.0, checked=0.0), followed, 10.0)
    assert not failing.over(10.0 + CAUSE_WAIT_S + 0.01) and failing.over(10.0 + FOLLOWED_WAIT_S + 0.01)
    assert failing.over(10.1, everyone_ended=True)                  # no word can come any more
    full = causes.Cause(causes.DISK_FULL, "error: checkpoint at step 300 not written: no space left on device")
    own = Outcome(1, "rank 1 on h2 exited 1", failed_rank=1, cause=full)
    assert on_failure(failing, own, 11.0) == Failing(own, 10.0)     # its own failure came first in cause
    other = Outcome(1, "rank 2 on h3 exited 1", failed_rank=2, cause=peer)
    held = on_failure(failing, own, 11.0)
    assert on_failure(held, other, 11.5) is held                    # a follower never replaces a cause
    assert held.over(10.0 + CAUSE_WAIT_S + 0.01)                    # own failure: the short hold


class Launcher:
    """A launcher still running, whose output is what the queue holds; it exits with `returncode` when waited on."""

    readers = []

    def __init__(self, returncode=None):
        self.returncode = returncode

    def poll(self):
        return self.returncode

    def wait(self, timeout):
        self.returncode = 0 if self.returncode is None else self.returncode


def watch(tmp_path, events, world=2, launcher=None, backend="ring", said=None):
    from clusterctl.launch.backends import get

    ranks = [Rank(r, f"h{r + 1}", [str(tmp_path / f"rank-{r}.log")]) for r in range(world)]
    lines = RankLines(ranks, open(tmp_path / "launcher.log", "a"), WorldCheck(world, backend),
                      lambda text, err: said.append(text) if said is not None else None,
                      exit_is_every_ranks=get(backend).exit_is_every_ranks)
    queued = queue.Queue()
    for event in events:
        queued.put((False, event))
    try:
        return Supervisor(None, None, emit=lambda text, err: None)._watch(lines, launcher or Launcher(), queued,
                                                                         _Preflight(None, None))
    finally:
        lines.close()


def test_the_loop_ends_in_the_state_its_phases_lead_to(tmp_path):
    started = [f"{MARK}0 start", f"{MARK}1 start"]
    done = watch(tmp_path, started + [f"{MARK}0 exit 0 0", f"{MARK}1 exit 0 1"])
    assert (done.state, done.reason) == (AttemptState.SUCCEEDED, "all 2 ranks finished")
    first = watch(tmp_path, started + [f"{MARK}1 exit 3 0", f"{MARK}0 exit 1 0"])
    assert (first.state, first.exit_code, first.failed_rank) == (AttemptState.FAILED, 3, 1)
    cause = watch(tmp_path, started + [f"{MARK}1 exit 3 0", f"{MARK}0 lost -9"])
    assert (cause.state, cause.failed_rank) == (AttemptState.LOST, 0)
    assert cause.reason == "rank 0 on h1 was killed by SIGKILL; followed from it: rank 1 on h2 (exited 3)"
    # rank 0 exits first, on a lost peer; rank 1's own failure, a full disk, is named, with its fix
    full = watch(tmp_path, started + [f"{MARK}0 err RuntimeError: [ring] connection to a peer was lost",
                                      f"{MARK}0 exit 1 0",
                                      f"{MARK}1 err error: checkpoint at step 300 not written: no space left on "
                                      f"device in /w/runs/x/checkpoints (0 B free)", f"{MARK}1 exit 1 0"])
    assert full.failed_rank == 1 and full.cause.kind == causes.DISK_FULL and not full.restartable[0]
    assert full.reason.startswith("rank 1 on h2 exited 1: error: checkpoint at step 300 not written: no space left on "
                                  "device in /w/runs/x/checkpoints (0 B free) -> free space on h2"), full.reason
    assert full.reason.endswith("; followed from it: rank 0 on h1 (RuntimeError: [ring] connection to a peer was "
                                "lost)"), full.reason
    gone = watch(tmp_path, started + [f"{MARK}0 exit 0 0"], launcher=Launcher(returncode=1))
    assert gone.reason.startswith("the launcher exited 1 before rank 1 on h2 reported an exit") and gone.failed_rank == 1
    # the rank starter (ring) exiting 0 says nothing of a rank that did not report; mpirun's 0 is every rank's 0
    silent = watch(tmp_path, started + [f"{MARK}0 exit 0 0"], launcher=Launcher(returncode=0))
    assert silent.state != AttemptState.SUCCEEDED and silent.failed_rank == 1
    said = []
    dropped = watch(tmp_path, started + [f"{MARK}0 exit 0 0"], launcher=Launcher(returncode=0), backend="mpi",
                    said=said)
    assert (dropped.state, dropped.exit_code, dropped.reason) == (AttemptState.SUCCEEDED, 0, "all 2 ranks finished")
    assert said == ["warning: mpirun says every rank exited 0, but the last output of rank 1 on h2 never reached this "
                    "machine (Open MPI's output forwarding dropped it); its log here ends early"]
    failed = watch(tmp_path, started + [f"{MARK}0 exit 0 0"], launcher=Launcher(returncode=2), backend="mpi")
    assert failed.exit_code == 2 and failed.failed_rank == 1       # mpirun's non-zero: that rank failed


def test_a_rank_left_running_after_another_finished_is_said_once_with_its_last_line(tmp_path, monkeypatch):
    from clusterctl.launch import ranklines

    ranks = [Rank(r, f"h{r + 1}", [str(tmp_path / f"rank-{r}.log")]) for r in range(3)]
    said = []
    lines = RankLines(ranks, open(tmp_path / "launcher.log", "a"), WorldCheck(3, "ring"),
                      lambda t, err: said.append(t) if t.startswith("warning") else None)
    for event in (f"{MARK}0 start", f"{MARK}1 start", f"{MARK}2 start", f"{MARK}1 out saving the cache",
                  f"{MARK}0 exit 0 0"):
        lines.handle(event)
    done = ranks[0].finished_at
    lines.outlived(done + ranklines.OUTLIVED_S - 1)
    assert said == []                                              # not yet a minute
    lines.outlived(done + ranklines.OUTLIVED_S + 0.4)
    assert said == ["warning: rank 1 on h2, rank 2 on h3 still running 60s after rank 0 on h1 finished (its last "
                    "line: saving the cache); the run waits for every rank (clusterctl stacks shows where it is)"]
    lines.outlived(done + 600)
    assert len(said) == 1                                          # once
    lines.close()
    assert "rank 1 on h2, rank 2 on h3 still running 60s" in (tmp_path / "launcher.log").read_text()
    # a failed rank is not "finished": nothing is said of the others (the failure is the run's word)
    failed = [Rank(r, f"h{r + 1}", [str(tmp_path / f"f-{r}.log")]) for r in range(2)]
    quiet = []
    lines = RankLines(failed, open(tmp_path / "launcher.log", "a"), WorldCheck(2, "ring"), lambda t, e: quiet.append(t))
    lines.handle(f"{MARK}0 exit 3 0")
    lines.outlived(time.monotonic() + 3600)
    lines.close()
    assert quiet == []
    # the supervisor's periodic checks say it while the launcher runs on
    monkeypatch.setattr(ranklines, "OUTLIVED_S", 0.3)

    class EndsLater(Launcher):
        def __init__(self):
            super().__init__()
            self.until = time.monotonic() + 1.5

        def poll(self):
            return 0 if time.monotonic() > self.until else None

    heard = []
    ended = watch(tmp_path, [f"{MARK}0 start", f"{MARK}1 start", f"{MARK}0 exit 0 0"], launcher=EndsLater(),
                  said=heard)
    assert ended.failed_rank == 1 and any(t.startswith("warning: rank 1 on h2 still running") for t in heard), heard


def test_a_deferred_preflight_starts_once_the_ranks_are_up_or_a_second_after_the_launch():
    """The pre-flight beside a launch from the cached plan waits for the ranks' start-up (its probes would take
    the CPU it needs): it starts when every rank has reported its world, when one has exited, or
    PREFLIGHT_DEFER_S after the launch; a verdict asked meanwhile (no wait) does not start it."""
    from types import SimpleNamespace

    from clusterctl.hosts.fanout import Deferred
    from clusterctl.launch.supervise import PREFLIGHT_DEFER_S

    def lines(reported, exited=()):
        world = SimpleNamespace(reports={r: ("h", 2, "mpi") for r in reported}, expected=2)
        return SimpleNamespace(world=world, ranks=[SimpleNamespace(exit_code=0 if r in exited else None) for r in (0, 1)])

    def check():
        return _Preflight(Deferred(lambda: None), None)

    c = check()
    c.begin(lines([0]), since=100.0, now=100.5)
    assert c.verdict() is None and not c.future.started            # one rank up of two, half a second in
    c.begin(lines([0, 1]), since=100.0, now=100.5)
    assert c.future.started                                          # every rank reported its world
    c = check()
    c.begin(lines([], exited=[1]), since=100.0, now=100.1)
    assert c.future.started                                          # a rank exited (a program with no init)
    c = check()
    c.begin(lines([]), since=100.0, now=100.0 + PREFLIGHT_DEFER_S)
    assert c.future.started                                          # the time is up
