"""Restarting a failed job (`clusterctl run --max-restarts N [--elastic MIN]`): the decisions, as pure
functions; run/ carries them out.

    policy = RestartPolicy(max_restarts=2, delay_s=10, elastic=2)
    policy.check(...)                         # refuse combinations that cannot work, before anything starts
    policy.should_restart(outcome.state, restarts)  # after an attempt ended
    policy.world_ok(ranks)                    # the hosts that answered the re-check are enough

Every attempt keeps the run's id and directory (its checkpoints are there, on every host) and writes its
own logs into runs/<id>/attempt-K/, K = 0, 1, ... (K is CLUSTERCTL_RESTART in the ranks' environment).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConnectError, UsageError
from .backends import get
from .outcome import AttemptState

BATCH_POLICIES = ("rank", "global")
# A rank's bootstrap beats every second whatever its program does, so silence this long means its host
# stopped answering (asleep, unplugged), not a slow step: a restartable run watches for it unless
# --hang-timeout says otherwise.
SILENT_HOST_S = 60.0
# After an attempt that failed because its hosts could not reach each other (launch/dataplane.py), the restart waits
# this long at most for the link to come back before it launches again (--data-plane-wait).
DATA_PLANE_WAIT_S = 300.0
# A restart whose re-check cannot reach a host over SSH for a reason that passes (refused: sshd not up yet, a timeout,
# no banner: a Mac rebooting or waking) asks it again every HOST_POLL_S, this long at most (--host-wait), before that
# counts as a failed restart; a host that refuses our key, or whose host key changed, is not waited for.
HOST_WAIT_S = 300.0
HOST_POLL_S = 5.0
PASSING_CONNECT_REASONS = ("refused", "timeout", "no-banner", "dropped")


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 0
    delay_s: float = 10.0
    elastic: int | None = None        # continue on the hosts that answer, while at least this many ranks remain
    batch: str = "rank"               # after a world change: keep each rank's batch, or the global batch
    data_plane_wait_s: float = DATA_PLANE_WAIT_S   # after a data-plane fault: how long a restart waits for the link
    host_wait_s: float = HOST_WAIT_S   # how long a restart waits for a host that does not answer over SSH

    @property
    def enabled(self) -> bool:
        return self.max_restarts > 0

    def check(self, *, world: int, backend: str, preflight: bool, shrink_refusal: str | None = None) -> None:
        """UsageError for what cannot work, before anything starts (pure). `shrink_refusal`: the program's own
        reason it cannot continue on fewer ranks (program.Capabilities.shrink_refusal), if it has one."""
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts {self.max_restarts}: give 0 or more")
        if self.delay_s < 0:
            raise UsageError(f"--restart-delay {self.delay_s:g}: give 0 or more seconds")
        if self.data_plane_wait_s < 0:
            raise UsageError(f"--data-plane-wait {self.data_plane_wait_s:g}: give 0 or more seconds")
        if self.host_wait_s < 0:
            raise UsageError(f"--host-wait {self.host_wait_s:g}: give 0 or more seconds")
        if self.batch not in BATCH_POLICIES:
            raise UsageError(f"--elastic-batch {self.batch!r}: one of {', '.join(BATCH_POLICIES)}")
        if self.elastic is None:
            return
        if not self.enabled:
            raise UsageError("--elastic says how a restart may shrink the world: give --max-restarts N too")
        if not 1 <= self.elastic <= world:
            raise UsageError(f"--elastic {self.elastic}: the fewest ranks to continue on, between 1 and the "
                             f"cluster's {world}")
        if not preflight:
            raise UsageError("--elastic finds the hosts that still answer with the pre-flight: drop --no-preflight")
        refusal = get(backend).shrink_refusal
        if refusal:
            raise UsageError(refusal)
        if shrink_refusal:
            raise UsageError(shrink_refusal)

    def should_restart(self, state: AttemptState, restarts: int) -> bool:
        """After an attempt: restart one that failed (a rank lost, or the job stalled), not one that succeeded or that the user
        stopped (Ctrl-C, SIGTERM, SIGHUP), while restarts are left."""
        return state in (AttemptState.FAILED, AttemptState.LOST, AttemptState.STALLED) and restarts < self.max_restarts

    def hang_timeout(self, given: float | None) -> float | None:
        """--hang-timeout as given, else SILENT_HOST_S for a restartable run (without one, a sleeping host's
        ranks would stall the others forever)."""
        return given if given is not None or not self.enabled else SILENT_HOST_S

    def world_ok(self, ranks: int) -> bool:
        return ranks >= (self.elastic or 1)

    def waits_for(self, error: BaseException) -> bool:
        """Whether a re-check that failed with `error` is asked again (the host may come back: rebooting, waking)
        rather than counted as a failed restart: a host that could not be reached over SSH for a passing reason,
        when --host-wait allows and the run is not elastic (elastic goes on without it)."""
        return (isinstance(error, ConnectError) and error.reason in PASSING_CONNECT_REASONS and self.host_wait_s > 0
                and self.elastic is None)

