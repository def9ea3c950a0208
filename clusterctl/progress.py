"""The metrics line a rank prints for `clusterctl run`'s live panel (docs/run.md#feeding-the-live-panel).

    clusterctl:metrics {"step": 10, "total_steps": 100, "loss": 2.31, "tokens_per_s": 1234, "peak_mem_mb": 512}

One line on standard output: the marker, a space, a JSON object. Every field is optional; others are
ignored. `report(**fields)` prints it (standard library only, so a rank can import it without MLX);
`parse(line)` reads it back, None for any other line (a line with the marker but no JSON object is an
ordinary line), and raises Unreadable for one that must not be parsed or cannot be: longer than MAX_LINE,
nested too deep for the JSON parser; a number too large for a float is dropped like a non-finite one.
"""
from __future__ import annotations

import json
import math
import sys

MARKER = "clusterctl:metrics "
MAX_LINE = 64 * 1024       # longer metrics lines are not parsed (a real one is ~200 bytes)
RANK_METRICS = "rank-metrics.jsonl"     # where `run` keeps every rank's metrics lines, in runs/<id>/ (observe/record.py)


class Unreadable(ValueError):
    """A metrics line that is not parsed: the supervisor drops it, with a warning."""
FIELDS = ("step", "total_steps", "loss", "val_loss", "tokens_per_s", "peak_mem_mb", "quiet_s", "share",
          "stop_s", "stopped")     # a stop with the work kept: docs/run.md#ctrl-c-and-sigterm


def report(**fields: float) -> None:
    """Print one metrics line for the live panel, e.g. report(step=10, total_steps=100, loss=2.31)."""
    sys.stdout.write(MARKER + json.dumps(fields) + "\n")
    sys.stdout.flush()


def parse(line: str) -> dict[str, float] | None:
    """The known numeric fields of a metrics line, or None when `line` is not one."""
    if not line.startswith(MARKER):
        return None
    if len(line) > MAX_LINE:
        raise Unreadable(f"{len(line):,} characters, over {MAX_LINE:,}")
    try:
        value = json.loads(line[len(MARKER):])
    except RecursionError:
        raise Unreadable("nested too deep") from None
    except ValueError:          # not JSON (a number too long to convert is a ValueError too)
        return None
    if not isinstance(value, dict):
        return None
    return {k: number for k, v in value.items() if k in FIELDS and (number := _finite(v)) is not None}


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:       # an integer beyond a float's range
        return None
    return number if math.isfinite(number) else None
