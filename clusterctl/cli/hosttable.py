"""The hosts' telemetry as table lines (observe/telemetry.py's HostTelemetry and its cells(), which the dashboard's
page shows too), drawn by `clusterctl top` (every column) and under the ranks in `run`'s live panel (PANEL_COLUMNS);
plain strings, no rich (cli/panel.py styles them).

    header_and_rows = lines(hosts)                       # [(line, style)]: a header, then a row per host
    lines(hosts, PANEL_COLUMNS)                          # the panel's compact subset
"""
from __future__ import annotations

from ..observe.telemetry import COLUMNS, cells
from .console import table_lines

PANEL_COLUMNS = ["host", "state", "memory", "pressure", "swap", "load", "gpu", "thermal", "flags"]   # ranks: above
STATE_STYLE = {"unreachable": "red", "error": "red"}
FLAG_STYLE = "bold red"


def lines(hosts, columns: list[str] = COLUMNS) -> list[tuple[str, str]]:
    """(line, style) pairs: a header, then a row per host, flagged or unreachable ones styled."""
    header, *rows = table_lines([cells(h) for h in hosts], columns)
    return [(header, "dim")] + [(line, STATE_STYLE.get(h.state) or (FLAG_STYLE if h.flags else ""))
                                for h, line in zip(hosts, rows)]
