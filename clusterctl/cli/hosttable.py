"""The hosts' telemetry as table rows (observe/telemetry.py's HostTelemetry), drawn by `clusterctl top` (every
column) and under the ranks in `run`'s live panel (PANEL_COLUMNS); plain strings, no rich (cli/panel.py styles them).

    header_and_rows = lines(hosts)                       # [(line, style)]: a header, then a row per host
    lines(hosts, PANEL_COLUMNS)                          # the panel's compact subset
"""
from __future__ import annotations

from .console import table_lines

COLUMNS = ["host", "state", "memory", "pressure", "swap", "load", "gpu", "thermal", "disk free", "ranks", "flags"]
PANEL_COLUMNS = ["host", "state", "memory", "pressure", "swap", "load", "gpu", "thermal", "flags"]   # ranks: above
STATE_STYLE = {"unreachable": "red", "error": "red"}
FLAG_STYLE = "bold red"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024 ** 3:.1f}"


def row(h) -> dict:
    """One host's figures as the table's cells (h: observe.telemetry.HostTelemetry)."""
    if h.state != "ok":
        return {c: "" for c in COLUMNS} | {"host": h.host, "state": h.state, "flags": h.error or ""}
    memory = "-"
    if h.memory_used is not None and h.memory_total:
        memory = f"{_gib(h.memory_used)}/{_gib(h.memory_total)} GiB {100 * h.memory_used / h.memory_total:.0f}%"
    swap = "-" if h.swap_total is None else f"{_gib(h.swap_used)}/{_gib(h.swap_total)} GiB"
    load = "-" if h.load_1m is None else f"{h.load_1m:.2f}/{h.cores or '?'}"
    thermal = h.thermal or "-"
    if h.speed_limit is not None and h.speed_limit < 100:
        thermal += f" {h.speed_limit}%"
    elif h.temperature_c is not None:
        thermal += f" {h.temperature_c:.0f}°C"
    ranks = f"{len(h.ranks)}, {h.ranks_rss_kb / 1024 ** 2:.1f} GiB" if h.ranks else "0"
    return {"host": h.host, "state": h.state, "memory": memory, "pressure": h.pressure or "-", "swap": swap,
            "load": load, "gpu": "-" if h.gpu_percent is None else f"{h.gpu_percent:.0f}%", "thermal": thermal,
            "disk free": "-" if h.disk_free is None else f"{_gib(h.disk_free)} GiB", "ranks": ranks,
            "flags": "; ".join(h.why) if h.flags else ""}


def lines(hosts, columns: list[str] = COLUMNS) -> list[tuple[str, str]]:
    """(line, style) pairs: a header, then a row per host, flagged or unreachable ones styled."""
    header, *rows = table_lines([row(h) for h in hosts], columns)
    return [(header, "dim")] + [(line, STATE_STYLE.get(h.state) or (FLAG_STYLE if h.flags else ""))
                                for h, line in zip(hosts, rows)]
