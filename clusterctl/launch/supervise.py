"""Supervise a prepared launch (job.py) to its end: one event loop over the launcher's output lines.

    Supervisor(launch, connector, emit=..., settings=Settings(...)).run() -> Outcome
        run it; stream `[rank N host]` lines; per-rank logs; the Outcome's AttemptState says how it ended

Every rank runs under the bootstrap (bootstrap.py), so the supervisor sees tagged lines, heartbeats and exit
codes from each rank whatever the launcher (mlx.launch's own exit status says nothing about the ranks:
docs/facts/launchers.md#mlx-launch-exit-status); ranklines.py routes them and gives the verdicts. It stops the
job — SIGTERM to the launcher's process group, SIGKILL after a grace period, then `pkill -f <run id>` on every
host over SSH — when a rank exits non-zero, on Ctrl-C, when no rank has started within --start-timeout, when a
started rank has been silent (no output, no heartbeat) for --hang-timeout, or when the ranks' first
`mx.distributed.init()` formed another world than the launch's (world.py; the rank's own failure then waits for
that verdict, which says more).

The loop is one dispatch on its phase, as torchrun's agent's (`_invoke_run`) is on its WorkerState:

    Running(since, checked)  lines routed; every CHECK_S the timeouts, the stall watch, the world check, the
                             pre-flight and the launcher's own end are read
      -> Failing(failure, since)  a rank failed: held CAUSE_WAIT_S for the word of a rank lost before it, or,
                                  when it only followed a peer (its collective lost the connection: causes.py),
                                  up to FOLLOWED_WAIT_S for the word of the rank whose own failure came first
      -> Ended(outcome)           the first cause named, with its fix; the ranks that followed from it listed
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, replace

from ..errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STALLED,
    ClusterctlError,
    SignalReceived,
    exit_for_signal,
)
from ..hosts.connector import Connector
from ..hosts.scripts.contract import RUN_TOKEN
from . import causes
from .job import Launch
from .launchers import sweep
from .outcome import AttemptState, Outcome
from .plan import LaunchPlan
from .ranklines import Emit, RankLines, Status, no_status
from .stall import StallPolicy
from .stop import ask_to_stop, ranks_by_host

FINISH_TIMEOUT_S = 30.0
# After a rank fails, how long to listen for the rank starter's word that another rank died without
# reporting its exit (killed, its host gone; hosts/scripts/ranks.py): that one is the cause, not the ranks
# that failed after losing it.
CAUSE_WAIT_S = 0.5
# A rank that failed only because a peer did (its collective lost the connection: causes.PEER_LOST) is held this
# long for the word of the rank whose own failure (a full disk, out of memory) or death came first.
FOLLOWED_WAIT_S = 5.0
PREFLIGHT_WAIT_S = 30.0
PREFLIGHT_DEFER_S = 1.0   # a pre-flight beside the launch starts once the ranks are up, or this long after it
CHECK_S = 0.2             # how often the timeouts and the stall watch are read, whatever the ranks print


@dataclass(frozen=True)
class Settings:
    """What a supervisor shows and how long it waits for a rank."""

    rank0_only: bool = False              # show rank 0's lines only (every rank's are logged)
    start_timeout: float | None = None    # no sign of a rank this long after the launch: stop the job
    hang_timeout: float | None = None     # a started rank silent this long (no output, no heartbeat): stop
    stall: StallPolicy = StallPolicy()    # no rank making progress (stall.py): stop, with every rank's stacks


@dataclass(frozen=True)
class Running:
    """The ranks run: each line is routed, and the periodic checks come at least every CHECK_S."""

    since: float        # the launch (--start-timeout counts from it)
    checked: float      # the periodic checks last ran


@dataclass(frozen=True)
class Failing:
    """A rank failed at `since`: its failure is held CAUSE_WAIT_S for the rank starter's word that another rank
    died before it without reporting its exit (that one is the cause), or FOLLOWED_WAIT_S when it only followed a
    peer's failure; a lost rank's failure is final, and the hold ends once every rank has ended."""

    failure: Outcome
    since: float

    def over(self, now: float, everyone_ended: bool = False) -> bool:
        if self.failure.state is AttemptState.LOST or everyone_ended:
            return True
        return now - self.since > (FOLLOWED_WAIT_S if _strength(self.failure) == 0 else CAUSE_WAIT_S)


@dataclass(frozen=True)
class Ended:
    """The job is over: how, before the pre-flight's last word on it (_Preflight.settles)."""

    outcome: Outcome


Phase = Running | Failing | Ended


def on_failure(phase: Running | Failing, failure: Outcome, now: float) -> Failing:
    """A rank's failure (pure): the first is held from now; later, one that is more of a first cause replaces
    it (a lost rank's word, or a rank's own error over one that followed a peer; the first of equals stays), the
    hold still counted from the first failure."""
    if isinstance(phase, Running):
        return Failing(failure, now)
    if _strength(failure) > _strength(phase.failure):
        return Failing(failure, phase.since)
    return phase


def _strength(failure: Outcome) -> int:
    return causes.rank(failure.cause, failure.state is AttemptState.LOST)


def named(failure: Outcome, host: str, others: tuple[list[str], list[str]]) -> Outcome:
    """The failure that came first in cause, said in one line: its rank's own words, the fix where one is known
    (causes.Cause.fix), the ranks that failed after it because of it ("followed from it") and those that failed
    on their own as well ("also"); their errors stay in their logs."""
    reason = failure.reason
    fix = failure.cause.fix(host) if failure.cause is not None else None
    if fix:
        reason += f" -> {fix}"
    for label, ranks in zip(("followed from it", "also"), others):
        if ranks:
            reason += f"; {label}: " + ", ".join(ranks[:3]) + (f" and {len(ranks) - 3} more" if len(ranks) > 3 else "")
    return replace(failure, reason=reason)


def waiting_together(place: str, heartbeats: dict[str, float], places: int = 1) -> str:
    """A stall where every rank, on several hosts, waits in a collective, at one place or at `places` (Stacks.together,
    in_collectives), said (pure): the ranks wait for each other, which usually means the link between the hosts
    (the data plane) — the hosts themselves still answer when their heartbeats go on (`heartbeats`: host ->
    seconds since its last line)."""
    beats = ", ".join(f"{host} {age:.0f}s ago" for host, age in heartbeats.items())
    where = f"at the same place ({place})" if places == 1 else f"in one of {places} collectives ({place})"
    return (f"every rank waits {where}: in a collective, for each other, which usually means the "
            f"link between the hosts (the data plane): check it with `clusterctl doctor --data-plane`"
            + (f"; the hosts' last heartbeats: {beats}" if beats else ""))


class _Preflight:
    """The pre-flight beside a launch that started from the cached plan. If it fails, the job is stopped and
    its error raised (a missing script or python is named, not just a rank's exit); if it finds the hosts
    changed, the job is stopped and launched again with the fresh plan.

    A pre-flight not yet started (a Deferred) is started once the ranks are up (every one has reported its
    world, or one has exited), or PREFLIGHT_DEFER_S after the launch, whichever comes first, or when the job
    ends: its probes then do not take the CPU the launcher and the ranks' start-up need (on the hosts, and,
    through SSH, here)."""

    def __init__(self, future, plan: LaunchPlan | None):
        self.future, self.plan = future, plan

    def begin(self, lines: RankLines, since: float, now: float) -> None:
        if self.future is None or getattr(self.future, "started", True):
            return
        ranks_up = len(lines.world.reports) >= lines.world.expected or any(r.exit_code is not None for r in lines.ranks)
        if ranks_up or now - since >= PREFLIGHT_DEFER_S:
            self.future.start()

    def verdict(self, wait: float = 0.0) -> Outcome | None:
        if self.future is None or (wait == 0.0 and not getattr(self.future, "started", True)):
            return None
        try:
            fresh = self.future.result(timeout=wait)
        except FutureTimeout:
            return None
        self.future = None
        if fresh != self.plan:
            return Outcome(EXIT_FAILED, "the hosts changed since the plan was cached: launching again",
                           ended_as=AttemptState.REPLAN, fresh_plan=fresh)
        return None

    def settles(self, outcome: Outcome) -> Outcome:
        """The job failed before the pre-flight ended: its verdict still decides what to report (a rank's
        "No such file" is less useful than "host h2: train.py does not exist there") and what to cache."""
        if outcome.state is not AttemptState.REPLAN and self.future is not None and outcome.exit_code != 0:
            return self.verdict(wait=PREFLIGHT_WAIT_S) or outcome
        return outcome


class _Copy:
    """The project's copy beside a launch (run's warm launch: docs/run.md#the-project-copy), a Deferred started
    as soon as the launcher is; the ranks wait for it (the rank bootstrap's gate). A copy that failed stops the
    job and its error is raised; the watch does not end before the copy has (no rsync outlives `run`)."""

    def __init__(self, future):
        self.future = future

    def start(self) -> None:
        if self.future is not None:
            self.future.start()

    def check(self) -> None:
        """Its error, raised, once it has failed."""
        if self.future is not None and self.future.done() and self.future.exception() is not None:
            raise self.future.exception()

    def wait(self) -> None:
        if self.future is not None and getattr(self.future, "started", True):
            self.future.exception()


class Supervisor:
    """Watches one launch to its end: `run()` starts it and returns its Outcome, whose state says how it
    ended (what `run` does next follows from that state: launch/restart.py)."""

    def __init__(self, launch: Launch, connector: Connector | None, *, emit: Emit, settings: Settings = Settings(),
                 status: Status = no_status):
        self.launch, self.connector, self.emit, self.settings, self.status = launch, connector, emit, settings, status

    def run(self, preflight=None, plan: LaunchPlan | None = None, copy=None) -> Outcome:
        """Run the launcher and watch every rank until the job ends one way or another. `preflight` (a
        Future of discover()) verifies, while the job starts, the cached `plan` it was launched from; `copy`
        (a Deferred, started with the launcher) copies the project the ranks wait for. The `status` hook given
        at construction hears every rank's events (observe/live.py lists them)."""
        check, copying = _Preflight(preflight, plan), _Copy(copy)
        lines = RankLines.open(self.launch, self.emit, self.status, rank0_only=self.settings.rank0_only,
                               stall=self.settings.stall)
        queued: queue.Queue = queue.Queue()
        proc = self.launch.start(queued)
        copying.start()
        outcome: Outcome | None = None
        try:
            with signals_stop():
                try:
                    outcome = self._watch(lines, proc, queued, check, copying)
                except (KeyboardInterrupt, SignalReceived) as e:
                    outcome = self._stop_asked(lines, proc, queued, getattr(e, "signum", signal.SIGINT))
        except (KeyboardInterrupt, SignalReceived) as e:     # as the handlers were being put back
            outcome = _stopped_now(getattr(e, "signum", signal.SIGINT), "stopped every rank")
        finally:  # also when the pre-flight or the copy failed (ClusterctlError): the job is stopped, then the error raised
            outcome = self._stop(proc, outcome)
            lines.close()
            copying.wait()
        if outcome.state is not AttemptState.STOPPED:    # a stop by the user also stops the copy: not its fault
            copying.check()   # a copy that failed is why the ranks did not run
        tail = lines.ranks[outcome.failed_rank].tail if outcome.failed_rank is not None else outcome.tail
        return replace(outcome, tail=list(tail), rank0_wrote=lines.ranks[0].wrote if lines.ranks else None)

    def _watch(self, lines: RankLines, proc, queued: queue.Queue, check: _Preflight,
               copying: _Copy | None = None) -> Outcome:
        copying = copying or _Copy(None)
        now = time.monotonic()
        phase: Phase = Running(since=now, checked=now)
        while True:
            match phase:
                case Running():
                    copying.check()
                    phase = self._running(phase, lines, proc, queued, check)
                case Failing():
                    phase = self._failing(phase, lines, proc, queued)
                case Ended(outcome):
                    return check.settles(outcome)

    def _running(self, phase: Running, lines: RankLines, proc, queued: queue.Queue, check: _Preflight) -> Phase:
        line = _next_line(queued, 0.2)
        if line is not None:
            after = self._routed(phase, lines.handle(line), lines, proc, queued)
            # many ranks' heartbeats may leave no quiet moment: the checks below still come every CHECK_S
            if not isinstance(after, Running) or time.monotonic() - phase.checked < CHECK_S:
                return after
        return self._checks(phase, lines, proc, queued, check)

    def _failing(self, phase: Failing, lines: RankLines, proc, queued: queue.Queue) -> Phase:
        if phase.over(time.monotonic(), all(r.exit_code is not None for r in lines.ranks)):
            failed = phase.failure.failed_rank
            host = lines.ranks[failed].host if failed is not None else "its host"
            return Ended(named(phase.failure, host, lines.followers(phase.failure)))
        line = _next_line(queued, 0.05)
        return phase if line is None else self._routed(phase, lines.handle(line), lines, proc, queued)

    def _routed(self, phase: Running | Failing, ended: Outcome | None, lines: RankLines, proc,
                queued: queue.Queue) -> Phase:
        """The phase after a line was routed; `ended`: what it ended (a rank's failure, or every rank's success)."""
        if ended is not None and lines.world.wrong:     # the world check's line names the cause
            verdict = lines.world_verdict(force=ended.exit_code == 0)
        elif ended is not None and ended.exit_code != 0:
            return on_failure(phase, ended, time.monotonic())
        elif ended is not None and isinstance(phase, Running):
            return Ended(self._finish(lines, proc, queued))
        else:
            verdict = lines.world_verdict()
        return phase if verdict is None else Ended(verdict)

    def _checks(self, phase: Running, lines: RankLines, proc, queued: queue.Queue, check: _Preflight) -> Phase:
        """The periodic checks: the launcher's end, the pre-flight, the world check, the timeouts, the stall."""
        now = time.monotonic()
        check.begin(lines, phase.since, now)
        lines.heard()
        lines.lagging(now)
        lines.outlived(now)
        if proc.poll() is not None and not any(t.is_alive() for t in proc.readers) and queued.empty():
            return Ended(lines.world_verdict(force=True) or lines.launcher_ended(proc.returncode))
        settings = self.settings
        verdict = (check.verdict() or lines.world_verdict()
                   or lines.timed_out(phase.since, settings.start_timeout, settings.hang_timeout) or self._stalled(lines))
        return Ended(verdict) if verdict is not None else replace(phase, checked=now)

    def _stop_asked(self, lines: RankLines, proc, queued: queue.Queue, signum: int) -> Outcome:
        """Ctrl-C, SIGTERM or SIGHUP: ranks that said they can stop with their work kept (the bundled trainer,
        in a metrics line) are asked to (stop.py) and watched to their end for as long as they said they may
        need; they finish the step they are in, write a checkpoint and exit. Otherwise, at a second signal, or
        past that time, every rank is stopped at once (by run()'s finally), as it always was."""
        within = lines.stop_bound() if self.connector is not None else None
        if within is None:
            return _stopped_now(signum, "stopped every rank")
        what, again = _what_stopped(signum), "Ctrl-C" if signum == signal.SIGINT else "the signal"
        try:
            asked = ask_to_stop(self.connector, self.launch.run_id,
                                signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM,
                                ranks_of=ranks_by_host(self.launch.rank_hosts))
            if not asked.ranks:
                why = "; ".join(f"{h}: {e}" for h, e in asked.errors.items()) or "none was found on its host"
                return _stopped_now(signum, f"no rank could be asked to write a checkpoint ({why}): stopped every rank")
            self.emit(f"{what}: every rank finishes its step, writes a checkpoint and stops (up to {within:.0f}s; "
                      f"{again} again stops at once)", True)
            why = _watch_stop(lines, proc, queued, time.monotonic() + within, within)
        except (KeyboardInterrupt, SignalReceived):
            why = f"{again} again, at once"
        step = lines.stopped_step
        if step is not None:
            return Outcome(exit_for_signal(signum), f"{what}: every rank wrote a checkpoint at step {step} and stopped",
                           ended_as=AttemptState.STOPPED)
        if why is None and all(r.exit_code == 0 for r in lines.ranks):
            return Outcome(EXIT_OK, f"all {len(lines.ranks)} ranks finished")
        return _stopped_now(signum, f"{why or 'the ranks ended without saying it was written'}: stopped every rank; "
                                    "the checkpoint was not written")

    def _stalled(self, lines: RankLines) -> Outcome | None:
        """No rank has progressed for the stall timeout: every rank's stacks are taken and saved, the odd one
        out named, one screen printed; the Outcome is STALLED (restarted like a failure)."""
        stall = lines.stall(time.monotonic())
        if stall is None:
            return None
        reason = (f"stalled: the endpoint has not answered a health request for {stall.silent_s:.0f}s while its ranks "
                  "run" if lines.watch.policy.health else f"stalled: no progress from any rank for {stall.silent_s:.0f}s")
        failed, folder, cause = None, None, None
        if self.connector is not None:
            try:
                from .stacks import collect as collect_stacks      # a stall only: not on every launch
                taken = collect_stacks(self.connector, self.launch.run_id)
                folder = taken.save(self.launch.run_dir)
            except (OSError, ClusterctlError) as e:     # the stall is reported (and stopped) all the same
                reason += f"; the stacks could not be taken: {e}"
                self.emit(reason, True)
                return Outcome(EXIT_STALLED, reason, ended_as=AttemptState.STALLED)
            odd, together, apart = taken.odd_one_out(), taken.together(), taken.in_collectives()
            if together is not None or apart is not None:      # before the odd one out: it waits like the others
                said = waiting_together(together or apart, lines.heartbeats(time.monotonic()),
                                        1 if together is not None else len(taken.groups()))
                reason += "; " + said
                cause = causes.Cause(causes.DATA_PLANE, said)
            elif odd is not None:
                failed = odd[0]
                reason += f"; rank {odd[0]} is the odd one out: {odd[1]}"
            for text in [reason] + taken.screen():
                self.emit(text, True)
            reason += f" (stacks: {os.path.relpath(folder)})"
        return Outcome(EXIT_STALLED, reason, failed_rank=failed, ended_as=AttemptState.STALLED, stacks=folder,
                       cause=cause)

    def _finish(self, lines: RankLines, proc, queued: queue.Queue) -> Outcome:
        """Every rank reported success: let the launcher shut down in order, keep its last words, and hold it
        to its exit status (mpirun complains, and fails, when a rank skipped MPI_Finalize:
        docs/facts/mlx-distributed.md#mpi-world-of-one-not-finalized)."""
        try:
            proc.wait(timeout=FINISH_TIMEOUT_S)
        except TimeoutError:
            return Outcome(EXIT_FAILED, f"every rank finished but the launcher did not exit within "
                           f"{FINISH_TIMEOUT_S:g}s")
        for t in proc.readers:
            t.join(5)
        while not queued.empty():
            lines.handle(queued.get()[1])
        if proc.returncode != 0:
            return Outcome(proc.returncode, f"every rank finished but the launcher exited {proc.returncode} "
                           f"(see {lines.launcher_log.name})")
        return Outcome(EXIT_OK, f"all {len(lines.ranks)} ranks finished")

    def _stop(self, proc, outcome: Outcome | None) -> Outcome | None:
        """Whatever ended the watch: a job still running, or one that failed, is stopped everywhere; the
        outcome, with a word of the processes that may be left."""
        if proc.poll() is None or outcome is None or outcome.exit_code != 0:
            proc.stop()    # mpirun then stops its daemons and ranks
            connector, run_id = self.connector, self.launch.run_id
            leftover = sweep(connector, run_id) if connector is not None else []
            if leftover and outcome is not None:
                return replace(outcome, reason=f"{outcome.reason}; could not confirm that every process of the run "
                               f"is gone on {', '.join(leftover)} (look for {RUN_TOKEN}{run_id} there)")
        return outcome


EXITED_WAIT_S = 10.0      # once a stop's checkpoint is written, how long the ranks have to exit by themselves


def _watch_stop(lines: RankLines, proc, queued: queue.Queue, deadline: float, within: float) -> str | None:
    """The ranks asked to stop, watched (their lines shown and logged as ever) until each has exited, or the
    launcher has with its output read; None then, else why not: the time ran out, or a rank failed before the
    checkpoint was written (the others would wait for it in a collective)."""
    written_at = None
    while True:
        now = time.monotonic()
        if lines.stopped_step is not None:
            written_at = written_at or now
            if now - written_at > EXITED_WAIT_S:
                return None                 # written: what has not exited yet is stopped as usual
        elif now > deadline:
            return f"the ranks did not stop within {within:.0f}s"
        line = _next_line(queued, 0.2)
        if line is not None:
            lines.handle(line)
        if all(r.exit_code is not None for r in lines.ranks):
            return None
        if proc.poll() is not None and not any(t.is_alive() for t in proc.readers) and queued.empty():
            return None
        failed = next((r for r in lines.ranks if r.exit_code not in (None, 0) and r.stopped is None), None)
        if failed is not None and lines.stopped_step is None:
            return f"rank {failed.rank} on {failed.host} exited {failed.exit_code} before it was written"


def _what_stopped(signum: int) -> str:
    return "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"{signal.Signals(signum).name} received"


def _stopped_now(signum: int, how: str) -> Outcome:
    return Outcome(exit_for_signal(signum), f"{_what_stopped(signum)}: {how}", ended_as=AttemptState.STOPPED)


@contextmanager
def signals_stop():
    """SIGTERM and SIGHUP raise SignalReceived inside (as Ctrl-C raises KeyboardInterrupt): in a job, and for
    what `run` does between attempts (the restart delay, the re-check), so a stop there is as orderly."""
    previous = _stop_on_signals()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stopped(e: BaseException) -> Outcome:
    """The outcome of a stop by the user (Ctrl-C, SIGTERM, SIGHUP) outside a job."""
    if isinstance(e, SignalReceived):
        return Outcome(exit_for_signal(e.signum), f"{signal.Signals(e.signum).name} received",
                       ended_as=AttemptState.STOPPED)
    return Outcome(EXIT_INTERRUPTED, "interrupted (Ctrl-C)", ended_as=AttemptState.STOPPED)


def _stop_on_signals() -> dict:
    """SIGTERM and SIGHUP (a closed terminal) stop the job like Ctrl-C does, instead of leaving it running."""
    def handler(signum, frame):
        raise SignalReceived(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, handler)
    return previous


def _next_line(queued: queue.Queue, wait: float) -> str | None:
    try:
        return queued.get(timeout=wait)[1]
    except queue.Empty:
        return None
