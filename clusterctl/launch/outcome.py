"""How one attempt of a job ended: the value the supervisor (supervise.py) returns and everything after it reads.

    Outcome(exit_code, reason, failed_rank=1, tail=[...], ended_as=AttemptState.LOST)
    outcome.state                                    # what `run` does next follows from it alone (restart.py)
    replace(outcome, reason=outcome.reason + "; ...")  # a changed copy (dataclasses.replace): an Outcome never changes

The states are torchrun's WorkerState for one attempt: an Outcome says which one it ended in, or leaves it to
its exit code (SUCCEEDED for 0, FAILED otherwise), the common case.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .causes import Cause
from .plan import LaunchPlan


class AttemptState(Enum):
    """How an attempt ended (as torchrun's WorkerState): what `run` does next follows from it alone."""

    SUCCEEDED = "succeeded"   # every rank finished, and the launcher with them
    FAILED = "failed"         # a rank or the launcher failed, a rank never started or went silent
    LOST = "lost"             # the failed rank died without reporting its exit (the rank starter said)
    STALLED = "stalled"       # every rank alive, none making progress for the stall timeout (stall.py)
    STOPPED = "stopped"       # Ctrl-C, SIGTERM or SIGHUP: never restarted
    REPLAN = "replan"         # the pre-flight found other hosts than the cached plan: launch again


@dataclass(frozen=True)
class Outcome:
    """One attempt's end, as the supervisor found it; frozen: a later word (the sweep's, a restart's) is a copy."""

    exit_code: int
    reason: str                       # one line: what happened
    failed_rank: int | None = None
    tail: list[str] = field(default_factory=list)   # the failed rank's last lines (a copy of its own, for this Outcome)
    ended_as: AttemptState | None = None      # None: as the exit code says (see state)
    fresh_plan: LaunchPlan | None = None      # REPLAN: the plan the pre-flight found, to launch again from
    rank0_wrote: bool | None = None   # rank 0 left files in its run directory (None: it did not say)
    stacks: str | None = None         # STALLED: where every rank's stacks were saved (runs/<id>/stacks/<time>)
    cause: Cause | None = None        # what the failed rank's last lines say (causes.py); None: killed, lost, no rank
    step: int | None = None           # the failed rank's last reported step (None: it reported none)

    @property
    def restartable(self) -> tuple[bool, str]:
        """(whether a restart may help, why not): a full disk or a missing file is met again by the next attempt."""
        if self.cause is not None and not self.cause.restartable:
            return False, f"a restart would meet the same {self.cause.kind}"
        return True, ""

    @property
    def state(self) -> AttemptState:
        """The state it ended in: the one given, else SUCCEEDED for exit code 0 and FAILED for any other."""
        if self.ended_as is not None:
            return self.ended_as
        return AttemptState.SUCCEEDED if self.exit_code == 0 else AttemptState.FAILED
