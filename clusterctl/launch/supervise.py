"""Supervise a prepared launch (job.py) to its end: one event loop over the launcher's output lines.

    supervise(launch, connector, emit=...) -> Outcome    run it; stream `[rank N host]` lines; per-rank logs

Every rank runs under the bootstrap (bootstrap.py), so the supervisor sees tagged lines, heartbeats and exit
codes from each rank whatever the launcher (mlx.launch's own exit status says nothing about the ranks:
docs/launchers.md#mlx-launch-exit-status). It stops the job — SIGTERM to the launcher's process group,
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
from typing import Callable

from ..errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    ClusterctlError,
    SignalReceived,
    exit_for_signal,
)
from ..hosts.connector import Connector
from ..progress import parse as parse_metrics
from .bootstrap import parse_line
from .job import Launch
from .launchers import sweep
from .plan import LaunchPlan
from .world import WorldCheck

FINISH_TIMEOUT_S = 30.0
TAIL_LINES = 10
# After a rank fails, how long to listen for the rank starter's word that another rank died without
# reporting its exit (killed, its host gone; hosts/scripts/ranks.py): that one is the cause, not the ranks
# that failed after losing it.
CAUSE_WAIT_S = 0.5


@dataclass
class Outcome:
    exit_code: int
    reason: str                       # one line: what happened
    failed_rank: int | None = None
    tail: list[str] = field(default_factory=list)
    replan: LaunchPlan | None = None  # the pre-flight found other hosts than the cached plan: launch again
    rank0_wrote: bool | None = None   # rank 0 left files in its run directory (None: it did not say)
    stopped_by_user: bool = False     # Ctrl-C, SIGTERM or SIGHUP: never restarted
    lost: bool = False                # the failed rank died without reporting its exit (the rank starter said)


PREFLIGHT_WAIT_S = 30.0


class _Preflight:
    """The pre-flight running beside a launch that started from the cached plan. If it fails, the job
    is stopped and its error raised (a missing script or python is named, not just a rank's exit); if it
    finds the hosts changed, the job is stopped and launched again with the fresh plan."""

    def __init__(self, future, plan: LaunchPlan):
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
            return Outcome(EXIT_FAILED, "the hosts changed since the plan was cached: launching again", replan=fresh)
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

    def write(self, line: str) -> None:
        for log in self.logs:
            log.write(line + "\n")
            log.flush()

    def close(self) -> None:
        for log in self.logs:
            log.close()


Status = Callable[[int, str, object, float], None]     # (rank, kind, value, time.monotonic())


def _no_status(rank: int, kind: str, value: object, now: float) -> None:
    pass


def supervise(launch: Launch, connector: Connector | None, *, emit: Callable[[str, bool], None],
              rank0_only: bool = False, start_timeout: float | None = None,
              hang_timeout: float | None = None, preflight=None, plan: LaunchPlan | None = None,
              status: Status = _no_status) -> Outcome:
    """Run the launcher and watch every rank until the job ends one way or another. `preflight` (a
    Future of discover()) verifies, while the job starts, the cached `plan` it was launched from;
    `status` hears every rank's events (observe/live.py lists them)."""
    check = _Preflight(preflight, plan)
    preflight_error: BaseException | None = None
    # an attempt's logs (run --max-restarts: runs/<id>/attempt-K/), and the run's, which hold every attempt
    log_dirs = list(dict.fromkeys([launch.log_dir, launch.run_dir]))
    ranks = [_Rank(r, h, [os.path.join(d, f"rank-{r}.log") for d in log_dirs]) for r, h in enumerate(launch.rank_hosts)]
    world = WorldCheck(len(ranks), launch.backend)
    launcher_log = open(os.path.join(launch.log_dir, "launcher.log"), "a", encoding="utf-8", errors="replace")
    lines: queue.Queue = queue.Queue()
    proc = launch.start(lines)
    readers = proc.readers
    started_at = time.monotonic()
    outcome: Outcome | None = None
    failed: Outcome | None = None           # a rank's failure, held CAUSE_WAIT_S for a rank lost before it
    failed_at = 0.0
    previous = _stop_on_signals()
    try:
        while outcome is None:
            if failed is not None and (failed.lost or time.monotonic() - failed_at > CAUSE_WAIT_S):
                outcome = failed
                break
            try:
                is_err, line = lines.get(timeout=0.05 if failed is not None else 0.2)
            except queue.Empty:
                line = None
            if line is not None:
                ended = _handle(line, is_err, ranks, launcher_log, emit, rank0_only, world, status)
                if ended is not None and world.wrong:     # the world check's line names the cause
                    outcome = _world_verdict(world, ranks, force=ended.exit_code == 0)
                elif ended is not None and ended.exit_code == 0 and failed is None:
                    outcome = _finish(proc, readers, lines, ranks, launcher_log, emit, rank0_only, world, status)
                elif ended is not None and ended.exit_code != 0:
                    if failed is None or ended.lost:
                        failed, failed_at = ended, failed_at or time.monotonic()
                else:
                    outcome = _world_verdict(world, ranks)
                continue
            if failed is not None:
                continue
            if proc.poll() is not None and not any(t.is_alive() for t in readers) and lines.empty():
                outcome = _world_verdict(world, ranks, force=True) or _launcher_ended(proc.returncode, ranks, launcher_log)
                break
            outcome = (check.verdict() or _world_verdict(world, ranks)
                       or _check_timeouts(ranks, started_at, start_timeout, hang_timeout))
        if outcome.replan is None and check.future is not None:
            # The job ended before the pre-flight did: its verdict still decides what to report (a rank's
            # "No such file" is less useful than "host h2: train.py does not exist there") and what to cache.
            if outcome.exit_code != 0:
                outcome = check.verdict(wait=PREFLIGHT_WAIT_S) or outcome
    except KeyboardInterrupt:
        outcome = Outcome(EXIT_INTERRUPTED, "interrupted (Ctrl-C): stopped every rank", stopped_by_user=True)
    except SignalReceived as e:
        outcome = Outcome(exit_for_signal(e.signum), f"{signal.Signals(e.signum).name} received: stopped every rank",
                          stopped_by_user=True)
    except ClusterctlError as e:   # the pre-flight failed: stop the job, then say why
        preflight_error = e
        outcome = Outcome(EXIT_FAILED, str(e))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if proc.poll() is None or outcome is None or outcome.exit_code != 0:
            proc.stop()    # mpirun then stops its daemons and ranks
            leftover = sweep(connector, launch.run_id) if connector is not None else []
            if leftover and outcome is not None:
                outcome.reason += (f"; could not confirm that every process of the run is gone on "
                                   f"{', '.join(leftover)} (look for clusterctl-run-{launch.run_id} there)")
        for r in ranks:
            r.close()
        launcher_log.close()
    if preflight_error is not None:
        raise preflight_error
    if outcome.failed_rank is not None:
        outcome.tail = list(ranks[outcome.failed_rank].tail)
    outcome.rank0_wrote = ranks[0].wrote if ranks else None
    return outcome


@contextmanager
def signals_stop():
    """SIGTERM and SIGHUP raise SignalReceived inside (as Ctrl-C raises KeyboardInterrupt): for what `run`
    does between attempts (the restart delay, the re-check), so a stop there is as orderly as in a job."""
    previous = _stop_on_signals()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stopped(e: BaseException) -> Outcome:
    """The outcome of a stop by the user (Ctrl-C, SIGTERM, SIGHUP) outside a job."""
    if isinstance(e, SignalReceived):
        return Outcome(exit_for_signal(e.signum), f"{signal.Signals(e.signum).name} received", stopped_by_user=True)
    return Outcome(EXIT_INTERRUPTED, "interrupted (Ctrl-C)", stopped_by_user=True)


def _stop_on_signals() -> dict:
    """SIGTERM and SIGHUP (a closed terminal) stop the job like Ctrl-C does, instead of leaving it running."""
    def handler(signum, frame):
        raise SignalReceived(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, handler)
    return previous


def _handle(line, is_err, ranks, launcher_log, emit, rank0_only, world: WorldCheck, status: Status) -> Outcome | None:
    parsed = parse_line(line)
    if parsed is None or not 0 <= parsed[0] < len(ranks):
        launcher_log.write(line + "\n")
        launcher_log.flush()
        if line.strip():
            emit(f"[launcher] {line}", True)
        return None
    rank, kind, payload = parsed
    r = ranks[rank]
    r.last_seen = time.monotonic()
    metrics = parse_metrics(payload) if kind == "out" else None
    if metrics is not None:
        status(rank, "metrics", metrics, r.last_seen)
        return None
    status(rank, kind, _exit_code(payload) if kind == "exit" else payload, r.last_seen)
    if kind == "start":
        r.started = True
    elif kind in ("out", "err"):
        r.write(payload)
        r.tail.append(payload)
        if (not rank0_only or rank == 0) and r.bar_shown.pop(kind, None) != payload:
            emit(f"[rank {rank} {r.host}] {payload}", kind == "err")
    elif kind == "bar":        # "<out|err> <the bar's latest state>": shown, never logged
        stream, _, text = payload.partition(" ")
        r.bar_shown[stream] = text
        if not rank0_only or rank == 0:
            emit(f"[rank {rank} {r.host}] {text}", stream == "err")
    elif kind == "world":
        world.report(rank, r.host, payload, time.monotonic())
    elif kind == "lost":       # the rank starter: the rank died, status <code>, without its own exit line
        code = int(payload) if payload.lstrip("-").isdigit() else 1
        r.exit_code = 128 - code if code < 0 else code
        return Outcome(r.exit_code, f"rank {rank} on {r.host} {_lost(code)}", failed_rank=rank, lost=True)
    elif kind == "exit":       # "<code> <1 if the rank left files in its run directory, else 0>"
        r.exit_code = _exit_code(payload)
        r.wrote = payload.partition(" ")[2] == "1"
        if r.exit_code != 0:
            return Outcome(r.exit_code, f"rank {rank} on {r.host} exited {r.exit_code}", failed_rank=rank)
        if all(x.exit_code == 0 for x in ranks):
            return Outcome(EXIT_OK, f"all {len(ranks)} ranks finished")
    return None


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


def _finish(proc, readers, lines, ranks, launcher_log, emit, rank0_only, world, status) -> Outcome:
    """Every rank reported success: let the launcher shut down in order, keep its last words, and hold it
    to its exit status (mpirun complains, and fails, when a rank skipped MPI_Finalize:
    docs/mlx-distributed.md#mpi-world-of-one-not-finalized)."""
    try:
        proc.wait(timeout=FINISH_TIMEOUT_S)
    except TimeoutError:
        return Outcome(EXIT_FAILED, f"every rank finished but the launcher did not exit within {FINISH_TIMEOUT_S:g}s")
    for t in readers:
        t.join(5)
    while not lines.empty():
        is_err, line = lines.get()
        _handle(line, is_err, ranks, launcher_log, emit, rank0_only, world, status)
    if proc.returncode != 0:
        return Outcome(proc.returncode, f"every rank finished but the launcher exited {proc.returncode} "
                       f"(see {launcher_log.name})")
    return Outcome(EXIT_OK, f"all {len(ranks)} ranks finished")


def _world_verdict(world: WorldCheck, ranks, force: bool = False) -> Outcome | None:
    reason = world.verdict({r.rank for r in ranks if r.exit_code is not None}, time.monotonic(), force)
    if reason is None:
        return None
    return Outcome(EXIT_FAILED, reason, failed_rank=min(r for r, rep in world.reports.items() if rep[1] != world.expected))


def _launcher_ended(code: int, ranks, launcher_log) -> Outcome:
    if code == 0 and all(r.exit_code == 0 for r in ranks):
        return Outcome(EXIT_OK, f"all {len(ranks)} ranks finished")
    missing = [r for r in ranks if r.exit_code is None]
    who = ", ".join(f"rank {r.rank} on {r.host}" for r in missing[:4])
    return Outcome(code or EXIT_FAILED, f"the launcher exited {code} before {who} reported an exit"
                   f" (see {launcher_log.name})", failed_rank=missing[0].rank if missing else None)


def _check_timeouts(ranks, started_at, start_timeout, hang_timeout) -> Outcome | None:
    now = time.monotonic()
    if start_timeout and now - started_at > start_timeout:
        silent = [r for r in ranks if not r.started]
        if silent:
            names = ", ".join(f"rank {r.rank} on {r.host}" for r in silent)
            return Outcome(EXIT_TIMEOUT, f"start timeout: no sign of {names} after {start_timeout:g}s",
                           failed_rank=silent[0].rank)
    if hang_timeout:
        hung = [r for r in ranks if r.started and r.exit_code is None and now - r.last_seen > hang_timeout]
        if hung:
            names = ", ".join(f"rank {r.rank} on {r.host}" for r in hung)
            return Outcome(EXIT_TIMEOUT, f"hang timeout: no output and no heartbeat from {names} for {hang_timeout:g}s",
                           failed_rank=hung[0].rank)
    return None
