"""Supervise a prepared launch (job.py) to its end: one event loop over the launcher's output lines.

    Supervisor(launch, connector, emit=..., settings=Settings(...)).run() -> Outcome
        run it; stream `[rank N host]` lines; per-rank logs; the Outcome's AttemptState says how it ended

Every rank runs under the bootstrap (bootstrap.py), so the supervisor sees tagged lines, heartbeats and exit
codes from each rank whatever the launcher (mlx.launch's own exit status says nothing about the ranks:
docs/facts/launchers.md#mlx-launch-exit-status). It stops the job — SIGTERM to the launcher's process group,
SIGKILL after a grace period, then `pkill -f <run id>` on every host over SSH — when a rank exits non-zero,
on Ctrl-C, when no rank has started within --start-timeout, when a started rank has been silent (no
output, no heartbeat) for --hang-timeout, or when the ranks' first `mx.distributed.init()` formed another
world than the launch's (world.py; the rank's own failure then waits for that verdict, which says more).
Progress-bar updates (`bar` lines) are shown live; only each bar's final state, an ordinary line, is logged.
Every rank event also goes to the `status` hook (the live panel's model, observe/live.py); a metrics line
(progress.py) goes only there: it is neither shown nor logged.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections import deque
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, TextIO

from ..errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STALLED,
    EXIT_TIMEOUT,
    ClusterctlError,
    SignalReceived,
    exit_for_signal,
)
from ..hosts.connector import Connector
from ..progress import Unreadable
from ..progress import parse as parse_metrics
from .bootstrap import parse_line
from .job import Launch
from .launchers import sweep
from .plan import LaunchPlan
from .stacks import collect as collect_stacks
from .stall import StallPolicy, StallWatch
from .stop import ask_to_stop, ranks_by_host
from .world import WorldCheck

FINISH_TIMEOUT_S = 30.0
TAIL_LINES = 10
# After a rank fails, how long to listen for the rank starter's word that another rank died without
# reporting its exit (killed, its host gone; hosts/scripts/ranks.py): that one is the cause, not the ranks
# that failed after losing it.
CAUSE_WAIT_S = 0.5
PREFLIGHT_WAIT_S = 30.0
CHECK_S = 0.2             # how often the timeouts and the stall watch are read, whatever the ranks print

Emit = Callable[[str, bool], None]                     # (text, is_err): what the user sees
Status = Callable[[int, str, object, float], None]     # (rank, kind, value, time.monotonic())


def _no_status(rank: int, kind: str, value: object, now: float) -> None:
    pass


class AttemptState(Enum):
    """How an attempt ended (as torchrun's WorkerState): what `run` does next follows from it alone."""

    SUCCEEDED = "succeeded"   # every rank finished, and the launcher with them
    FAILED = "failed"         # a rank or the launcher failed, a rank never started or went silent
    LOST = "lost"             # the failed rank died without reporting its exit (the rank starter said)
    STALLED = "stalled"       # every rank alive, none making progress for the stall timeout (stall.py)
    STOPPED = "stopped"       # Ctrl-C, SIGTERM or SIGHUP: never restarted
    REPLAN = "replan"         # the pre-flight found other hosts than the cached plan: launch again


@dataclass
class Outcome:
    exit_code: int
    reason: str                       # one line: what happened
    failed_rank: int | None = None
    tail: list[str] = field(default_factory=list)
    state: AttemptState | None = None         # None: SUCCEEDED for exit code 0, else FAILED
    fresh_plan: LaunchPlan | None = None      # REPLAN: the plan the pre-flight found, to launch again from
    rank0_wrote: bool | None = None   # rank 0 left files in its run directory (None: it did not say)
    stacks: str | None = None         # STALLED: where every rank's stacks were saved (runs/<id>/stacks/<time>)

    def __post_init__(self):
        if self.state is None:
            self.state = AttemptState.SUCCEEDED if self.exit_code == 0 else AttemptState.FAILED


@dataclass(frozen=True)
class Settings:
    """What a supervisor shows and how long it waits for a rank."""

    rank0_only: bool = False              # show rank 0's lines only (every rank's are logged)
    start_timeout: float | None = None    # no sign of a rank this long after the launch: stop the job
    hang_timeout: float | None = None     # a started rank silent this long (no output, no heartbeat): stop
    stall: StallPolicy = StallPolicy()    # no rank making progress (stall.py): stop, with every rank's stacks


class _Preflight:
    """The pre-flight running beside a launch that started from the cached plan. If it fails, the job
    is stopped and its error raised (a missing script or python is named, not just a rank's exit); if it
    finds the hosts changed, the job is stopped and launched again with the fresh plan."""

    def __init__(self, future, plan: LaunchPlan | None):
        self.future, self.plan = future, plan

    def verdict(self, wait: float = 0.0) -> Outcome | None:
        if self.future is None:
            return None
        try:
            fresh = self.future.result(timeout=wait)
        except FutureTimeout:
            return None
        self.future = None
        if fresh != self.plan:
            return Outcome(EXIT_FAILED, "the hosts changed since the plan was cached: launching again",
                           state=AttemptState.REPLAN, fresh_plan=fresh)
        return None


class _Rank:
    def __init__(self, rank: int, host: str, log_paths: list[str]):
        self.rank, self.host = rank, host
        self.logs = [open(p, "a", encoding="utf-8", errors="replace") for p in log_paths]
        self.started = False
        self.exit_code: int | None = None
        self.wrote: bool | None = None        # left files in its run directory (reported at its exit)
        self.last_seen = time.monotonic()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.bar_shown: dict[str, str] = {}   # stream -> the bar update last shown (its final line repeats it)
        self.stop_s = 0.0                     # it stops with its work kept within this long when asked (0: it cannot)
        self.stopped: int | None = None       # asked, it stopped at this step, its checkpoint written (stop.py)

    def write(self, line: str) -> None:
        for log in self.logs:
            log.write(line + "\n")
            log.flush()

    def close(self) -> None:
        for log in self.logs:
            log.close()


class _Lines:
    """One attempt's ranks and logs: every line the launcher prints goes to its rank (log, tail, screen,
    status hook) or to launcher.log; the verdicts read from the ranks' state are here too."""

    def __init__(self, ranks: list[_Rank], launcher_log: TextIO, world: WorldCheck, emit: Emit, *,
                 rank0_only: bool = False, status: Status = _no_status, stall: StallPolicy | None = None):
        self.ranks, self.launcher_log, self.world = ranks, launcher_log, world
        self.emit, self.rank0_only, self._status = emit, rank0_only, status
        self.watch = StallWatch(stall or StallPolicy())
        self.unreadable: set[int] = set()      # ranks warned of an unreadable metrics line
        self.answered: float | None = None     # a service's last health answer already given to the watch

    @classmethod
    def open(cls, launch: Launch, emit: Emit, settings: Settings, status: Status) -> _Lines:
        # an attempt's logs (run --max-restarts: runs/<id>/attempt-K/), and the run's, which hold every attempt
        log_dirs = list(dict.fromkeys([launch.log_dir, launch.run_dir]))
        ranks = [_Rank(r, h, [os.path.join(d, f"rank-{r}.log") for d in log_dirs])
                 for r, h in enumerate(launch.rank_hosts)]
        world = WorldCheck(len(ranks), launch.backend)
        launcher_log = open(os.path.join(launch.log_dir, "launcher.log"), "a", encoding="utf-8", errors="replace")
        return cls(ranks, launcher_log, world, emit, rank0_only=settings.rank0_only, status=status,
                   stall=settings.stall)

    def close(self) -> None:
        for r in self.ranks:
            r.close()
        self.launcher_log.close()

    def handle(self, line: str) -> Outcome | None:
        """Route one line; an Outcome when it ends the job (a rank's failure, or every rank's success)."""
        parsed = parse_line(line)
        if parsed is None or not 0 <= parsed[0] < len(self.ranks):
            self.launcher_log.write(line + "\n")
            self.launcher_log.flush()
            if line.strip() and self.stopped_step is None:   # once the ranks stopped on request: expected, only logged
                self.emit(f"[launcher] {line}", True)
            return None
        rank, kind, payload = parsed
        r = self.ranks[rank]
        r.last_seen = time.monotonic()
        try:
            metrics = parse_metrics(payload) if kind == "out" else None
        except Unreadable as e:
            if rank not in self.unreadable:
                self.unreadable.add(rank)
                self.emit(f"warning: rank {rank} on {r.host} printed a metrics line clusterctl does not read "
                          f"({e}): dropped, as any more will be", True)
            return None
        if metrics is not None:
            r.stop_s = metrics.get("stop_s", r.stop_s)
            r.stopped = int(metrics["stopped"]) if "stopped" in metrics else r.stopped
            self.watch.progress(rank, r.last_seen, structured=True)
            if metrics.get("quiet_s"):
                self.watch.quiet(rank, r.last_seen, metrics["quiet_s"])
            self.status(rank, "metrics", metrics, r.last_seen)
            return None
        self.status(rank, kind, _exit_code(payload) if kind == "exit" else payload, r.last_seen)
        shown = not self.rank0_only or rank == 0
        if kind in ("out", "err", "bar"):
            self.watch.progress(rank, r.last_seen)
        if kind == "start":
            r.started = True
            if all(x.started for x in self.ranks):
                self.watch.started(r.last_seen)
        elif kind in ("out", "err"):
            r.write(payload)
            r.tail.append(payload)
            if shown and r.bar_shown.pop(kind, None) != payload:
                self.emit(f"[rank {rank} {r.host}] {payload}", kind == "err")
        elif kind == "bar":        # "<out|err> <the bar's latest state>": shown, never logged
            stream, _, text = payload.partition(" ")
            r.bar_shown[stream] = text
            if shown:
                self.emit(f"[rank {rank} {r.host}] {text}", stream == "err")
        elif kind == "world":
            self.world.report(rank, r.host, payload, time.monotonic())
        elif kind in ("lost", "exit"):
            self.watch.ended(rank)
            return self._ended(r, kind, payload)
        return None

    def _ended(self, r: _Rank, kind: str, payload: str) -> Outcome | None:
        if kind == "lost":       # the rank starter: the rank died, status <code>, without its own exit line
            code = int(payload) if payload.lstrip("-").isdigit() else 1
            r.exit_code = 128 - code if code < 0 else code
            return Outcome(r.exit_code, f"rank {r.rank} on {r.host} {_lost(code)}", failed_rank=r.rank,
                           state=AttemptState.LOST)
        # "<code> <1 if the rank left files in its run directory, else 0>"
        r.exit_code = _exit_code(payload)
        r.wrote = payload.partition(" ")[2] == "1"
        if r.exit_code != 0 and self.stopped_step is not None:    # asked from outside: `clusterctl kill`, a signal
            return Outcome(r.exit_code, f"the ranks were asked to stop (clusterctl kill, or a signal to a rank) and wrote "
                           f"a checkpoint at step {self.stopped_step}", state=AttemptState.STOPPED)
        if r.exit_code != 0:
            return Outcome(r.exit_code, f"rank {r.rank} on {r.host} exited {r.exit_code}", failed_rank=r.rank)
        if all(x.exit_code == 0 for x in self.ranks):
            return Outcome(EXIT_OK, f"all {len(self.ranks)} ranks finished")
        return None

    def stop_bound(self) -> float | None:
        """How long the ranks still running said a stop with their work kept may take (the longest), None when one
        of them cannot stop so (it never said, or no longer does: docs/run.md#ctrl-c-and-sigterm)."""
        live = [r for r in self.ranks if r.exit_code is None]
        if not live or any(not r.started or r.stop_s <= 0 for r in live):
            return None
        return max(r.stop_s for r in live)

    @property
    def stopped_step(self) -> int | None:
        """The step a stop with the work kept ended at: one rank's word is every rank's, since it comes after the
        checkpoint's last barrier (train/checkpoint.py save)."""
        return next((r.stopped for r in self.ranks if r.stopped is not None), None)

    def world_verdict(self, force: bool = False) -> Outcome | None:
        world = self.world
        reason = world.verdict({r.rank for r in self.ranks if r.exit_code is not None}, time.monotonic(), force)
        if reason is None:
            return None
        return Outcome(EXIT_FAILED, reason,
                       failed_rank=min(r for r, rep in world.reports.items() if rep[1] != world.expected))

    def launcher_ended(self, code: int) -> Outcome:
        ranks = self.ranks
        if code == 0 and all(r.exit_code == 0 for r in ranks):
            return Outcome(EXIT_OK, f"all {len(ranks)} ranks finished")
        missing = [r for r in ranks if r.exit_code is None]
        who = ", ".join(f"rank {r.rank} on {r.host}" for r in missing[:4])
        return Outcome(code or EXIT_FAILED, f"the launcher exited {code} before {who} reported an exit"
                       f" (see {self.launcher_log.name})", failed_rank=missing[0].rank if missing else None)

    def status(self, rank: int, kind: str, value, now: float) -> None:
        """The status hook (the live panel), guarded: if it fails, the job goes on without it."""
        try:
            self._status(rank, kind, value, now)
        except Exception as e:      # noqa: BLE001 - a display's bug must never stop the ranks
            self._status = _no_status
            self.emit(f"warning: the live panel failed ({type(e).__name__}: {e}); the run goes on without it", True)

    def lagging(self, now: float) -> None:
        """Warn of ranks that fell behind the others (stall.py): on the screen and in the live panel."""
        for rank, behind in self.watch.stragglers(now):
            r = self.ranks[rank]
            self.emit(f"warning: rank {rank} on {r.host} is behind: no progress for {behind:.0f}s while other ranks "
                      f"progress (a stall if they stop too)", True)
            self.launcher_log.write(f"clusterctl: rank {rank} on {r.host} is behind: no progress for {behind:.0f}s\n")
            self.launcher_log.flush()
            self.status(rank, "straggler", behind, now)

    def heard(self) -> None:
        """A service's progress: its endpoint's health answers (stall.py), read from the prober."""
        health = self.watch.policy.health
        answered = health() if health is not None else None
        if answered is not None and (self.answered is None or answered > self.answered):
            self.answered = answered
            self.watch.answered(answered)

    def stall(self, now: float):
        return self.watch.check(now, live=sum(1 for r in self.ranks if r.started and r.exit_code is None))

    def timed_out(self, started_at: float, settings: Settings) -> Outcome | None:
        now, start_timeout, hang_timeout = time.monotonic(), settings.start_timeout, settings.hang_timeout
        if start_timeout and now - started_at > start_timeout:
            silent = [r for r in self.ranks if not r.started]
            if silent:
                names = ", ".join(f"rank {r.rank} on {r.host}" for r in silent)
                return Outcome(EXIT_TIMEOUT, f"start timeout: no sign of {names} after {start_timeout:g}s",
                               failed_rank=silent[0].rank)
        if hang_timeout:
            hung = [r for r in self.ranks if r.started and r.exit_code is None and now - r.last_seen > hang_timeout]
            if hung:
                names = ", ".join(f"rank {r.rank} on {r.host}" for r in hung)
                return Outcome(EXIT_TIMEOUT, f"hang timeout: no output and no heartbeat from {names} for "
                               f"{hang_timeout:g}s", failed_rank=hung[0].rank)
        return None


class Supervisor:
    """Watches one launch to its end: `run()` starts it and returns its Outcome, whose state says how it
    ended (what `run` does next follows from that state: launch/restart.py)."""

    def __init__(self, launch: Launch, connector: Connector | None, *, emit: Emit, settings: Settings = Settings(),
                 status: Status = _no_status):
        self.launch, self.connector, self.emit, self.settings, self.status = launch, connector, emit, settings, status

    def run(self, preflight=None, plan: LaunchPlan | None = None) -> Outcome:
        """Run the launcher and watch every rank until the job ends one way or another. `preflight` (a
        Future of discover()) verifies, while the job starts, the cached `plan` it was launched from. The
        `status` hook given at construction hears every rank's events (observe/live.py lists them)."""
        check = _Preflight(preflight, plan)
        lines = _Lines.open(self.launch, self.emit, self.settings, self.status)
        queued: queue.Queue = queue.Queue()
        proc = self.launch.start(queued)
        outcome: Outcome | None = None
        try:
            with signals_stop():
                try:
                    outcome = self._watch(lines, proc, queued, check)
                except (KeyboardInterrupt, SignalReceived) as e:
                    outcome = self._stop_asked(lines, proc, queued, getattr(e, "signum", signal.SIGINT))
        except (KeyboardInterrupt, SignalReceived) as e:     # as the handlers were being put back
            outcome = _stopped_now(getattr(e, "signum", signal.SIGINT), "stopped every rank")
        finally:  # also when the pre-flight failed (ClusterctlError): the job is stopped, then its error raised
            self._stop(proc, outcome)
            lines.close()
        if outcome.failed_rank is not None:
            outcome.tail = list(lines.ranks[outcome.failed_rank].tail)
        outcome.rank0_wrote = lines.ranks[0].wrote if lines.ranks else None
        return outcome

    def _watch(self, lines: _Lines, proc, queued: queue.Queue, check: _Preflight) -> Outcome:
        started_at = time.monotonic()
        outcome: Outcome | None = None
        failed: Outcome | None = None           # a rank's failure, held CAUSE_WAIT_S for a rank lost before it
        failed_at = 0.0
        checked = started_at                    # the timeouts and the stall watch are read at least every CHECK_S
        while outcome is None:
            if failed is not None and (failed.state is AttemptState.LOST or time.monotonic() - failed_at > CAUSE_WAIT_S):
                outcome = failed
                break
            try:
                _, line = queued.get(timeout=0.05 if failed is not None else 0.2)
            except queue.Empty:
                line = None
            if line is not None:
                ended = lines.handle(line)
                if ended is not None and lines.world.wrong:     # the world check's line names the cause
                    outcome = lines.world_verdict(force=ended.exit_code == 0)
                elif ended is not None and ended.exit_code == 0 and failed is None:
                    outcome = self._finish(lines, proc, queued)
                elif ended is not None and ended.exit_code != 0:
                    if failed is None or ended.state is AttemptState.LOST:
                        failed, failed_at = ended, failed_at or time.monotonic()
                else:
                    outcome = lines.world_verdict()
                # many ranks' heartbeats may leave no quiet moment: the checks below still come every CHECK_S
                if outcome is not None or failed is not None or time.monotonic() - checked < CHECK_S:
                    continue
            if failed is not None:
                continue
            checked = time.monotonic()
            lines.heard()
            lines.lagging(checked)
            if proc.poll() is not None and not any(t.is_alive() for t in proc.readers) and queued.empty():
                outcome = lines.world_verdict(force=True) or lines.launcher_ended(proc.returncode)
                break
            outcome = (check.verdict() or lines.world_verdict() or lines.timed_out(started_at, self.settings)
                       or self._stalled(lines))
        if outcome.state is not AttemptState.REPLAN and check.future is not None and outcome.exit_code != 0:
            # The job ended before the pre-flight did: its verdict still decides what to report (a rank's
            # "No such file" is less useful than "host h2: train.py does not exist there") and what to cache.
            outcome = check.verdict(wait=PREFLIGHT_WAIT_S) or outcome
        return outcome

    def _stop_asked(self, lines: _Lines, proc, queued: queue.Queue, signum: int) -> Outcome:
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
                           state=AttemptState.STOPPED)
        if why is None and all(r.exit_code == 0 for r in lines.ranks):
            return Outcome(EXIT_OK, f"all {len(lines.ranks)} ranks finished")
        return _stopped_now(signum, f"{why or 'the ranks ended without saying it was written'}: stopped every rank; "
                                    "the checkpoint was not written")

    def _stalled(self, lines: _Lines) -> Outcome | None:
        """No rank has progressed for the stall timeout: every rank's stacks are taken and saved, the odd one
        out named, one screen printed; the Outcome is STALLED (restarted like a failure)."""
        stall = lines.stall(time.monotonic())
        if stall is None:
            return None
        reason = (f"stalled: the endpoint has not answered a health request for {stall.silent_s:.0f}s while its ranks "
                  "run" if lines.watch.policy.health else f"stalled: no progress from any rank for {stall.silent_s:.0f}s")
        failed, folder = None, None
        if self.connector is not None:
            try:
                taken = collect_stacks(self.connector, self.launch.run_id)
                folder = taken.save(self.launch.run_dir)
            except (OSError, ClusterctlError) as e:     # the stall is reported (and stopped) all the same
                reason += f"; the stacks could not be taken: {e}"
                self.emit(reason, True)
                return Outcome(EXIT_STALLED, reason, state=AttemptState.STALLED)
            odd = taken.odd_one_out()
            if odd is not None:
                failed = odd[0]
                reason += f"; rank {odd[0]} is the odd one out: {odd[1]}"
            for text in [reason] + taken.screen():
                self.emit(text, True)
            reason += f" (stacks: {os.path.relpath(folder)})"
        return Outcome(EXIT_STALLED, reason, failed_rank=failed, state=AttemptState.STALLED, stacks=folder)

    def _finish(self, lines: _Lines, proc, queued: queue.Queue) -> Outcome:
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

    def _stop(self, proc, outcome: Outcome | None) -> None:
        """Whatever ended the watch: a job still running, or one that failed, is stopped everywhere."""
        if proc.poll() is None or outcome is None or outcome.exit_code != 0:
            proc.stop()    # mpirun then stops its daemons and ranks
            connector, run_id = self.connector, self.launch.run_id
            leftover = sweep(connector, run_id) if connector is not None else []
            if leftover and outcome is not None:
                outcome.reason += (f"; could not confirm that every process of the run is gone on "
                                   f"{', '.join(leftover)} (look for clusterctl-run-{run_id} there)")


EXITED_WAIT_S = 10.0      # once a stop's checkpoint is written, how long the ranks have to exit by themselves


def _watch_stop(lines: _Lines, proc, queued: queue.Queue, deadline: float, within: float) -> str | None:
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
        try:
            _, line = queued.get(timeout=0.2)
        except queue.Empty:
            line = None
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
    return Outcome(exit_for_signal(signum), f"{_what_stopped(signum)}: {how}", state=AttemptState.STOPPED)


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
                       state=AttemptState.STOPPED)
    return Outcome(EXIT_INTERRUPTED, "interrupted (Ctrl-C)", state=AttemptState.STOPPED)


def _stop_on_signals() -> dict:
    """SIGTERM and SIGHUP (a closed terminal) stop the job like Ctrl-C does, instead of leaving it running."""
    def handler(signum, frame):
        raise SignalReceived(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, handler)
    return previous


def _exit_code(payload: str) -> int:
    code = payload.partition(" ")[0]
    return int(code) if code.lstrip("-").isdigit() else 1


def _lost(code: int) -> str:
    """What a rank's status says when it died without reporting (pure): killed by a signal (the watchdog
    shell's 128 + N, or the starter's own child), or its ssh gone (255: the host went away)."""
    if code < 0 or 128 < code < 192:
        number = -code if code < 0 else code - 128
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"was killed by {name}"
    if code == 255:
        return "lost its ssh connection (status 255): the host went away, or refused it"
    return f"ended with status {code} without reporting its exit"
