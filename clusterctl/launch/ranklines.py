"""One attempt's ranks as the supervisor (supervise.py) hears them: every line the launcher prints, routed.

    lines = RankLines.open(launch, emit, status, rank0_only=False, stall=StallPolicy())
    ended = lines.handle(line)     # an Outcome when the line ends the job: a rank's failure, or every rank's success
    lines.world_verdict(), lines.timed_out(...), lines.stall(now), lines.launcher_ended(code)   # the other verdicts
    lines.lagging(now), lines.outlived(now)                        # warnings: a straggler, a rank left running

A rank's tagged line (bootstrap.py) goes to its log (the attempt's and the run's), its tail, the screen and the
`status` hook (the live panel's model, observe/live.py); any other line goes to launcher.log. Progress-bar updates
(`bar` lines) are shown live; only each bar's final state, an ordinary line, is logged. A metrics line
(progress.py) goes to the status hook, the stall watch and the run's rank-metrics.jsonl (observe/record.py), with
its time and rank: it is neither shown nor logged.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections import deque
from typing import Callable, TextIO

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT
from ..progress import RANK_METRICS, Unreadable
from ..progress import parse as parse_metrics
from . import causes
from .bootstrap import parse_line
from .job import Launch
from .outcome import AttemptState, Outcome
from .stall import StallPolicy, StallWatch
from .world import WorldCheck

TAIL_LINES = 10
# A rank still running this long after another finished (exit 0) is said once: a program whose ranks end together
# has one left waiting, or working on alone (Horovod warns of a stalled collective after 60 s too).
OUTLIVED_S = 60.0

Emit = Callable[[str, bool], None]                     # (text, is_err): what the user sees
Status = Callable[[int, str, object, float], None]     # (rank, kind, value, time.monotonic())


def no_status(rank: int, kind: str, value: object, now: float) -> None:
    """The status hook when nothing listens."""


class Rank:
    """One rank as its lines have told it so far: started, its exit, its last lines, what it said of a stop."""

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
        self.step: int | None = None          # the last step its metrics lines reported
        self.cause: causes.Cause | None = None    # why it failed, from its last lines (None: killed, or no failure)
        self.finished_at: float | None = None     # when it exited 0 (time.monotonic())

    def write(self, line: str) -> None:
        for log in self.logs:
            log.write(line + "\n")
            log.flush()

    def close(self) -> None:
        for log in self.logs:
            log.close()


class RankLines:
    """One attempt's ranks and logs: every line the launcher prints goes to its rank (log, tail, screen,
    status hook) or to launcher.log; the verdicts read from the ranks' state are here too."""

    def __init__(self, ranks: list[Rank], launcher_log: TextIO, world: WorldCheck, emit: Emit, *,
                 rank0_only: bool = False, status: Status = no_status, stall: StallPolicy | None = None,
                 metrics_log: TextIO | None = None, exit_is_every_ranks: bool = False):
        self.ranks, self.launcher_log, self.world = ranks, launcher_log, world
        self.exit_is_every_ranks = exit_is_every_ranks     # the launcher's exit 0 is every rank's (mpirun)
        self.metrics_log = metrics_log
        self.emit, self.rank0_only, self._status = emit, rank0_only, status
        self.watch = StallWatch(stall or StallPolicy())
        self.unreadable: set[int] = set()      # ranks warned of an unreadable metrics line
        self.answered: float | None = None     # a service's last health answer already given to the watch
        self.outlived_said: set[int] = set()   # ranks already said to run on after another finished

    @classmethod
    def open(cls, launch: Launch, emit: Emit, status: Status, *, rank0_only: bool, stall: StallPolicy) -> RankLines:
        # an attempt's logs (run --max-restarts: runs/<id>/attempt-K/), and the run's, which hold every attempt
        log_dirs = list(dict.fromkeys([launch.log_dir, launch.run_dir]))
        ranks = [Rank(r, h, [os.path.join(d, f"rank-{r}.log") for d in log_dirs])
                 for r, h in enumerate(launch.rank_hosts)]
        world = WorldCheck(len(ranks), launch.backend)
        launcher_log = open(os.path.join(launch.log_dir, "launcher.log"), "a", encoding="utf-8", errors="replace")
        metrics_log = open(os.path.join(launch.run_dir, RANK_METRICS), "a", encoding="utf-8")
        return cls(ranks, launcher_log, world, emit, rank0_only=rank0_only, status=status, stall=stall,
                   metrics_log=metrics_log, exit_is_every_ranks=launch.exit_is_every_ranks)

    def close(self) -> None:
        for r in self.ranks:
            r.close()
        self.launcher_log.close()
        if self.metrics_log is not None:
            self.metrics_log.close()

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
            r.step = metrics["step"] if isinstance(metrics.get("step"), int) else r.step
            self.watch.progress(rank, r.last_seen, structured=True)
            if metrics.get("quiet_s"):
                self.watch.quiet(rank, r.last_seen, metrics["quiet_s"])
            self.status(rank, "metrics", metrics, r.last_seen)
            if self.metrics_log is not None:       # one line per report: a few a second at most
                self.metrics_log.write(json.dumps({"t": round(time.time(), 3), "rank": rank, **metrics}) + "\n")
                self.metrics_log.flush()
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

    def _ended(self, r: Rank, kind: str, payload: str) -> Outcome | None:
        if kind == "lost":       # the rank starter: the rank died, status <code>, without its own exit line
            code = int(payload) if payload.lstrip("-").isdigit() else 1
            r.exit_code = 128 - code if code < 0 else code
            return Outcome(r.exit_code, f"rank {r.rank} on {r.host} {_lost(code)}", failed_rank=r.rank,
                           ended_as=AttemptState.LOST, step=r.step)
        # "<code> <1 if the rank left files in its run directory, else 0>"
        r.exit_code = _exit_code(payload)
        r.wrote = payload.partition(" ")[2] == "1"
        r.finished_at = time.monotonic() if r.exit_code == 0 else None
        if r.exit_code != 0 and self.stopped_step is not None:    # asked from outside: `clusterctl kill`, a signal
            return Outcome(r.exit_code, f"the ranks were asked to stop (clusterctl kill, or a signal to a rank) and wrote "
                           f"a checkpoint at step {self.stopped_step}", ended_as=AttemptState.STOPPED)
        if r.exit_code != 0:
            r.cause = causes.read(list(r.tail))
            said = f": {r.cause.line}" if r.cause.line else ""
            return Outcome(r.exit_code, f"rank {r.rank} on {r.host} exited {r.exit_code}{said}", failed_rank=r.rank,
                           cause=r.cause, step=r.step)
        if all(x.exit_code == 0 for x in self.ranks):
            return Outcome(EXIT_OK, f"all {len(self.ranks)} ranks finished")
        return None

    def followers(self, cause: Outcome) -> tuple[list[str], list[str]]:
        """The other ranks that failed: (those that followed a peer's failure, those that failed on their own too),
        each as "rank N on HOST (its line)", "(the same)" where its line is the cause's."""
        followed, also = [], []
        for r in self.ranks:
            if r.rank == cause.failed_rank or r.exit_code in (None, 0):
                continue
            said = r.cause.line if r.cause is not None and r.cause.line else f"exited {r.exit_code}"
            same = cause.cause is not None and said == cause.cause.line
            entry = f"rank {r.rank} on {r.host} ({'the same' if same else said[:120]})"
            (also if causes.rank(r.cause, lost=False) == 2 else followed).append(entry)
        return followed, also

    def heartbeats(self, now: float) -> dict[str, float]:
        """Each host's seconds since the last line of any of its live ranks (output or the bootstrap's heartbeat)."""
        ages: dict[str, float] = {}
        for r in self.ranks:
            if r.started and r.exit_code is None:
                ages[r.host] = min(ages.get(r.host, float("inf")), now - r.last_seen)
        return ages

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
        if code == 0 and self.exit_is_every_ranks and all(r.exit_code in (0, None) for r in ranks):
            # mpirun exits 0 only when every rank exited 0 (docs/facts/launchers.md#mpirun-exit-status), but it
            # can drop a remote rank's last forwarded lines, its exit line among them
            for r in missing:
                r.exit_code = 0
            self.emit(f"warning: mpirun says every rank exited 0, but the last output of {who} never reached "
                      f"this machine (Open MPI's output forwarding dropped it); its log here ends early", True)
            self.launcher_log.write(f"clusterctl: mpirun exited 0; no exit line came from {who}\n")
            self.launcher_log.flush()
            return Outcome(EXIT_OK, f"all {len(ranks)} ranks finished")
        return Outcome(code or EXIT_FAILED, f"the launcher exited {code} before {who} reported an exit"
                       f" (see {self.launcher_log.name})", failed_rank=missing[0].rank if missing else None)

    def outlived(self, now: float) -> None:
        """Warn, once for each, of ranks still running OUTLIVED_S after the first rank finished (exit 0): the run
        waits for every rank, so one that never ends holds it; `clusterctl stacks` shows where it is."""
        finished = [r for r in self.ranks if r.finished_at is not None]
        if not finished:
            return
        first = min(finished, key=lambda r: r.finished_at)
        waited = now - first.finished_at
        late = [r for r in self.ranks if r.exit_code is None and r.rank not in self.outlived_said]
        if waited < OUTLIVED_S or not late:
            return
        self.outlived_said.update(r.rank for r in late)
        who = ", ".join(f"rank {r.rank} on {r.host}" for r in late[:4]) + (" and more" if len(late) > 4 else "")
        last = late[0].tail[-1][:120] if late[0].tail else None
        self.emit(f"warning: {who} still running {waited:.0f}s after rank {first.rank} on {first.host} finished"
                  + (f" (its last line: {last})" if last else "")
                  + "; the run waits for every rank (clusterctl stacks shows where it is)", True)
        self.launcher_log.write(f"clusterctl: {who} still running {waited:.0f}s after rank {first.rank} finished\n")
        self.launcher_log.flush()

    def status(self, rank: int, kind: str, value, now: float) -> None:
        """The status hook (the live panel), guarded: if it fails, the job goes on without it."""
        try:
            self._status(rank, kind, value, now)
        except Exception as e:      # noqa: BLE001 - a display's bug must never stop the ranks
            self._status = no_status
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

    def timed_out(self, started_at: float, start_timeout: float | None, hang_timeout: float | None) -> Outcome | None:
        now = time.monotonic()
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
