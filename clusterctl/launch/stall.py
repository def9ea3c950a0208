"""Progress, not liveness: when a job has stopped making progress (docs/run.md#stalls), as pure bookkeeping
over times the supervisor passes in.

    watch = StallWatch(StallPolicy.parse(None))     # the default: adaptive; parse(20): fixed; parse(0): off
    watch.started(now)                              # every rank has started
    watch.progress(rank, now, structured)           # a line or bar (False), a metrics line (True)
    watch.answered(now)                             # the endpoint answered a health request (serve)
    watch.quiet(rank, now, seconds)                 # the rank announced a quiet phase (report(quiet_s=...))
    watch.ended(rank)                               # the rank exited
    watch.check(now) -> Stall | None                # no rank has progressed for the timeout
    watch.stragglers(now) -> [(rank, seconds)]      # ranks newly behind the others (a warning, not a stall)

A heartbeat is not progress: it comes from a thread of the rank, which beats on while the rank waits inside a
collective forever (docs/facts/mlx-distributed.md#ring-all-sum-can-deadlock).

The default (adaptive) watchdog arms at a job's first structured progress (a metrics line: clusterctl.report,
the bundled trainer's steps); a program that never reports any is never stopped for being quiet, however long
(an idle server, a long script: issue 31's rule). Once armed, the job is stalled when no rank has progressed for
max(ADAPTIVE_FLOOR_S, ADAPTIVE_MULTIPLE x the longest gap between progress events seen so far, the wait
from the start to the first one included). A fixed timeout arms when every rank has started. Either way a
rank's announced quiet phase holds the verdict off until it ends (the rank's next progress) or runs out, and
a gap that ended a quiet phase does not count towards the adaptive timeout.

A service (`clusterctl serve`, policy.health set) makes progress by answering: its progress is the endpoint
answering a health request, and output lines are not progress at all, so an idle server is never stalled, and
one whose endpoint stopped answering for the timeout while its ranks are alive is. The watch then arms at the
first answer, and the wait until then (the model loading) is not a gap.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# The default's floor. A Mac's SSD writes 2-3 GB/s, so 120 s covers an unannounced checkpoint of 100+ GB;
# it is twice the 60 s after which Horovod warns of a stalled collective and a fifth of PyTorch's 10-minute
# NCCL collective timeout, so a hang is caught within a few minutes, not tens.
ADAPTIVE_FLOOR_S = 120.0
# ... and its multiple of the longest gap: a job whose progress comes every minute is given five.
ADAPTIVE_MULTIPLE = 5.0
# A rank is a straggler when the others progressed this fraction of the timeout (at least STRAGGLER_MIN_S)
# past its own last progress.
STRAGGLER_FRACTION = 0.5
STRAGGLER_MIN_S = 5.0


@dataclass(frozen=True)
class StallPolicy:
    fixed: float | None = None       # seconds; None: adaptive
    enabled: bool = True
    # a service's progress: when the endpoint last answered a health request (time.monotonic(), None before
    # the first answer); output lines are then no progress at all
    health: Callable[[], float | None] | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, seconds: float | None, health: Callable[[], float | None] | None = None) -> StallPolicy:
        """`--stall-timeout`: None (not given) is adaptive, 0 is off, S > 0 is fixed."""
        if seconds is None:
            return cls(health=health)
        if seconds < 0:
            from ..errors import UsageError
            raise UsageError(f"--stall-timeout {seconds:g}: give seconds > 0, or 0 to turn the watchdog off")
        return cls(fixed=float(seconds), health=health) if seconds > 0 else cls(enabled=False)

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        since = "the endpoint's first health answer" if self.health else "the first metrics line"
        if self.fixed is not None:
            return f"{self.fixed:g}s" + (f" from {since}" if self.health else "")
        return f"adaptive (from {since}: max({ADAPTIVE_FLOOR_S:g}s, {ADAPTIVE_MULTIPLE:g} x the longest gap))"


@dataclass(frozen=True)
class Stall:
    silent_s: float                  # since the last progress of any rank
    timeout_s: float                 # the timeout that ran out


@dataclass
class StallWatch:
    policy: StallPolicy
    start: float | None = None                     # every rank started
    last: float | None = None                      # the job's last progress; None until the watch is armed
    longest_gap: float = 0.0
    rank_last: dict[int, float] = field(default_factory=dict)       # ranks that sent structured progress
    quiet_until: dict[int, float] = field(default_factory=dict)     # announced quiet phases
    quiet_seen: bool = False                       # a quiet phase ran during the current gap
    done: set[int] = field(default_factory=set)
    lagging: set[int] = field(default_factory=set)

    @property
    def armed(self) -> bool:
        return self.last is not None

    def started(self, now: float) -> None:
        if self.start is None:
            self.start = now
            if self.policy.enabled and self.policy.fixed is not None and self.policy.health is None:
                self.last = now

    def answered(self, now: float) -> None:
        """The endpoint answered a health request: the service's progress (the first answer arms the watch)."""
        if not self.policy.enabled:
            return
        if self.armed:
            self.longest_gap = max(self.longest_gap, now - self.last)
            self.last = max(self.last, now)
        else:
            self.last = now

    def progress(self, rank: int, now: float, structured: bool = False) -> None:
        if not self.policy.enabled or self.policy.health is not None:
            return
        if structured or rank in self.rank_last:     # a rank that reports structured progress is followed
            self.rank_last[rank] = now
            self.lagging.discard(rank)
        if structured and not self.armed:       # adaptive: the wait from the start to here is the first gap
            self.last = self.start if self.start is not None else now
        if not self.armed:
            return
        if not self.quiet_seen:
            self.longest_gap = max(self.longest_gap, now - self.last)
        self.quiet_until.pop(rank, None)      # a rank's progress ends its quiet phase
        self.quiet_seen = bool(self.quiet_until)
        self.last = max(self.last, now)

    def quiet(self, rank: int, now: float, seconds: float) -> None:
        if self.policy.enabled and seconds > 0:
            self.quiet_until[rank] = now + seconds
            self.quiet_seen = True

    def ended(self, rank: int) -> None:
        self.done.add(rank)
        self.quiet_until.pop(rank, None)

    def timeout(self) -> float | None:
        if not self.policy.enabled or not self.armed:
            return None
        if self.policy.fixed is not None:
            return self.policy.fixed
        return max(ADAPTIVE_FLOOR_S, ADAPTIVE_MULTIPLE * self.longest_gap)

    def check(self, now: float, live: int = 1) -> Stall | None:
        """A Stall when no rank has progressed for the timeout while `live` ranks still run."""
        timeout = self.timeout()
        if timeout is None or live <= 0:
            return None
        deadline = max([self.last + timeout, *self.quiet_until.values()])
        return Stall(now - self.last, timeout) if now > deadline else None

    def stragglers(self, now: float) -> list[tuple[int, float]]:
        """Ranks (with the seconds they are behind) that have just fallen behind the others: the others sent
        progress long after their last one. Each is named once until it progresses again."""
        timeout = self.timeout()
        if timeout is None:
            return []
        behind = max(STRAGGLER_MIN_S, STRAGGLER_FRACTION * timeout)
        newly = []
        for rank, seen in sorted(self.rank_last.items()):
            if rank in self.done or rank in self.lagging or rank in self.quiet_until:
                continue
            if self.last - seen > behind:
                self.lagging.add(rank)
                newly.append((rank, now - seen))
        return newly
