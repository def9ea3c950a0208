"""The metrics line a rank prints for `clusterctl run`'s live panel (docs/run.md#feeding-the-live-panel).

    clusterctl:metrics {"step": 10, "total_steps": 100, "loss": 2.31, "tokens_per_s": 1234, "peak_mem_mb": 512}

One line on standard output: the marker, a space, a JSON object. Every field is optional; others are
ignored. `report(**fields)` prints it (standard library only, so a rank can import it without MLX);
`parse(line)` reads it back, None for any other line.
"""
from __future__ import annotations

import json
import math
import sys

MARKER = "clusterctl:metrics "
FIELDS = ("step", "total_steps", "loss", "tokens_per_s", "peak_mem_mb", "quiet_s")


def report(**fields: float) -> None:
    """Print one metrics line for the live panel, e.g. report(step=10, total_steps=100, loss=2.31)."""
    sys.stdout.write(MARKER + json.dumps(fields) + "\n")
    sys.stdout.flush()


def parse(line: str) -> dict[str, float] | None:
    """The known numeric fields of a metrics line, or None when `line` is not one."""
    if not line.startswith(MARKER):
        return None
    try:
        value = json.loads(line[len(MARKER):])
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {k: float(v) for k, v in value.items() if k in FIELDS and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}
