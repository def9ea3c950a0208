"""The world check: did MLX join the ranks into the world the launcher started?

    check = WorldCheck(expected=4, backend="mpi")
    check.report(rank, host, payload)          # each rank's `world <size> <backend asked>` line (hosts/scripts/worldwatch.py)
    check.verdict(exited, now) -> str | None   # one line naming the ranks and the cause, once it is time to say

Under mpirun MLX falls back silently to a world of one per rank when it cannot load libmpi, and a program
that asks for another backend than the launch's gets one too: each rank then trains alone and exits 0
(docs/facts/mlx-distributed.md#world-of-one-fallback). The bootstrap reports the size of the group the
program's first `mx.distributed.init()` returned; the supervisor fails the job on the first size that is
not the launch's, after waiting up to WAIT_S for the other ranks' reports so the line names all of them.
"""
from __future__ import annotations

from .backends import get, names

WAIT_S = 2.0          # after the first mismatch, how long other ranks' reports are awaited
NAMED = 4             # ranks named in full in the message; the rest are counted


def parse_world(payload: str) -> tuple[int, str] | None:
    """(size, backend the program asked for) from a `world` line's payload, None if it is not one."""
    size, _, asked = payload.partition(" ")
    return (int(size), asked or "any") if size.isdigit() else None


def mismatch(expected: int, backend: str, reports: dict[int, tuple[str, int, str]]) -> str | None:
    """The failure line for these reports (rank -> (host, size, backend asked)), None when every reported
    size is `expected`. Pure."""
    wrong = {rank: r for rank, r in sorted(reports.items()) if r[1] != expected}
    if not wrong:
        return None
    by_size: dict[int, list[str]] = {}
    for rank, (host, size, _) in wrong.items():
        by_size.setdefault(size, []).append(f"rank {rank} on {host}")
    formed = "; ".join(f"{_names(who)} formed a world of {size}" for size, who in sorted(by_size.items()))
    return f"{formed}, not {expected}: {cause(backend, {r[2] for r in wrong.values()})}"


def cause(backend: str, asked: set[str]) -> str:
    """Why MLX most likely did not join the ranks: the program asked for another backend, or the launch's
    backend could not find its peers (the backend says why)."""
    if "mpi4py" in asked and not get(backend).needs_mpi:
        mpi = next(name for name in names() if get(name).needs_mpi)
        return ("the program uses mpi4py, whose MPI world only an MPI launcher forms: each rank ran alone "
                f"(run it with --backend {mpi})")
    other = sorted(a for a in asked if a not in ("any", backend, "mpi4py"))
    if other:
        return (f"the program asked MLX for the {'/'.join(other)} backend, but the ranks were started for "
                f"{backend} (pass backend={backend!r}, or run with --backend {other[0]})")
    return get(backend).lost_peers()


def _names(who: list[str]) -> str:
    if len(who) > NAMED:
        return ", ".join(who[:NAMED]) + f" and {len(who) - NAMED} more"
    return who[0] if len(who) == 1 else ", ".join(who[:-1]) + " and " + who[-1]


class WorldCheck:
    """The reports of one launch, and when to give the verdict: as soon as every rank has reported (or
    exited), else WAIT_S after the first mismatch."""

    def __init__(self, expected: int, backend: str):
        self.expected, self.backend = expected, backend
        self.reports: dict[int, tuple[str, int, str]] = {}
        self.first_wrong: float | None = None

    def report(self, rank: int, host: str, payload: str, now: float) -> None:
        parsed = parse_world(payload)
        if parsed is None or rank in self.reports:
            return
        self.reports[rank] = (host, *parsed)
        if parsed[0] != self.expected and self.first_wrong is None:
            self.first_wrong = now

    @property
    def wrong(self) -> bool:
        return self.first_wrong is not None

    def verdict(self, settled: set[int], now: float, force: bool = False) -> str | None:
        """The failure line once it is time to give it; `settled`: the ranks that exited (they will not
        report any more); `force`: the job is over, say it now."""
        if self.first_wrong is None:
            return None
        everyone = all(r in self.reports or r in settled for r in range(self.expected))
        if force or everyone or now - self.first_wrong >= WAIT_S:
            return mismatch(self.expected, self.backend, self.reports)
        return None
