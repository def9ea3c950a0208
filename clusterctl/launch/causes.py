"""Why a rank failed, read from its last lines (pure): a fault of its own — a full disk, out of memory, a missing
file, any other error — or a peer's, which it only followed: a collective whose connection to another rank was
lost. When several ranks fail, the supervisor (supervise.py) names the one whose failure came first in cause.

    cause = read(["Traceback ...", "RuntimeError: [ring] connection to a peer was lost"])
    cause.kind            # PEER_LOST: followed from another rank's failure
    cause.restartable     # False for a full disk or a missing file: the same attempt would fail the same way
    cause.fix(host)       # what to do, in words, where one is known

The patterns are the messages the failing code prints: Python's OSError texts (ENOSPC, ENOMEM, ENOENT), MLX's
own (`[write] Unable to write`, `[malloc]`), the bundled trainer's checkpoint line (train/checkpoint.py), the
ring's words for peers it could not connect to (the data plane), and the ring's and Open MPI's for a lost peer.
Anything else is an error of the rank's own (OTHER).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

DISK_FULL = "disk full"
OUT_OF_MEMORY = "out of memory"
MISSING_FILE = "missing file"
PEER_LOST = "peer lost"
DATA_PLANE = "data plane"       # the ranks could not reach each other (the stall watchdog says so too: supervise.py)
OTHER = "error"

_PATTERNS = (
    (DISK_FULL, re.compile(r"no space left on device|\[Errno 28\]|disk quota exceeded|\[Errno 122\]|"
                           r"\[write\] Unable to write|not enough free space for this run's checkpoints", re.I)),
    (OUT_OF_MEMORY, re.compile(r"\bMemoryError\b|out of memory|std::bad_alloc|\[malloc\]|\[metal::malloc\]|"
                               r"Cannot allocate memory|\[Errno 12\]|Unable to allocate", re.I)),
    (MISSING_FILE, re.compile(r"\bFileNotFoundError\b|No such file or directory|\bModuleNotFoundError\b", re.I)),
    (DATA_PLANE, re.compile(r"\[ring\] Couldn't connect|could not form the world of \d+ the launcher started: \[ring\]",
                            re.I)),
    (PEER_LOST, re.compile(r"connection to a peer was lost|Connection reset by peer|Broken pipe|"
                           r"\[ring\].*(?:lost|closed|reset|failed)|lost communication with|"
                           r"MPI_ERR_(?:PROC_FAILED|COMM)|connection refused by a peer", re.I)),
)
# a line that reads as an error's last line: "SomeError: ...", "error: ...", "[ring] ..."
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b|error:|\[\w+\])", re.I)


@dataclass(frozen=True)
class Cause:
    kind: str
    line: str          # the line that says it (the error's last line; empty when the rank printed nothing)

    @property
    def followed(self) -> bool:
        """It failed because another rank did (its collective lost a peer): never the first cause."""
        return self.kind == PEER_LOST

    @property
    def restartable(self) -> bool:
        """Whether a restart may fix it: not a full disk nor a missing file, which the next attempt meets again."""
        return self.kind not in (DISK_FULL, MISSING_FILE)

    def fix(self, host: str) -> str | None:
        if self.kind == DISK_FULL and "free space there" in self.line:      # the trainer's own line says it
            return None
        if self.kind == DISK_FULL:
            return (f"free space on {host} (the path above), or keep fewer checkpoints (--keep), then "
                    "`clusterctl run ... --resume latest`")
        if self.kind == OUT_OF_MEMORY:
            return f"{host} ran out of memory: a smaller --batch-size, --grad-checkpoint, or --strategy fsdp / zero3"
        if self.kind == MISSING_FILE:
            return f"the file is missing on {host}: copy it there (`clusterctl sync`) or fix the path"
        if self.kind == DATA_PLANE:
            return "the ranks could not reach each other: check the link between the hosts " \
                   "(`clusterctl doctor --data-plane`)"
        if self.kind == PEER_LOST:
            return "a rank on another host failed or went away, or the link between hosts dropped " \
                   "(`clusterctl doctor --data-plane`)"
        return None


def read(tail: list[str]) -> Cause:
    """The cause its last lines give (the last line that matches a known fault, else the last error line)."""
    lines = [line.strip() for line in tail if line.strip()]
    for line in reversed(lines):
        for kind, pattern in _PATTERNS:
            if pattern.search(line):
                return Cause(kind, line)
    errors = [line for line in lines if _ERROR_LINE.match(line)]      # a program's ordinary output says no cause
    return Cause(OTHER, (errors or [""])[-1])


def rank(cause: Cause | None, lost: bool) -> int:
    """How strongly a failure is a first cause: a rank that died without reporting (killed, its host gone) or
    failed on its own (2) over one that followed a peer (0); an exit with no line to read, or one that could not
    reach its peers (they may have failed to start), is in between (1)."""
    if lost:
        return 2
    if cause is None or not cause.line or cause.kind == DATA_PLANE:
        return 1
    return 0 if cause.followed else 2
