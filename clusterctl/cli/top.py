"""clusterctl top: every host's memory, pressure, swap, load, GPU, heat, disk and ranks, refreshed in place
(observe/telemetry.py samples them; docs/observe.md#clusterctl-top says what each column is and where it comes from).

On a terminal the table is redrawn in place with rich (as run's live panel, cli/panel.py), a flagged or unreachable
host in colour; elsewhere (a pipe, a file) a plain table is printed per sample, as `top -b` does. `--once` prints one
table and `--json` one JSON document, then exit."""
from __future__ import annotations

import json
import sys
import time

import click

from . import app
from .console import table_lines

COLUMNS = ["host", "state", "memory", "pressure", "swap", "load", "gpu", "thermal", "disk free", "ranks", "flags"]
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


def lines(hosts) -> list[tuple[str, str]]:
    """(line, style) pairs: a header, then a row per host, flagged or unreachable ones styled."""
    header, *rows = table_lines([row(h) for h in hosts], COLUMNS)
    return [(header, "dim")] + [(line, STATE_STYLE.get(h.state) or (FLAG_STYLE if h.flags else ""))
                                for h, line in zip(hosts, rows)]


def _title(hosts) -> str:
    flagged = [h.host for h in hosts if h.flags]
    down = [h.host for h in hosts if h.state != "ok"]
    parts = [time.strftime("%H:%M:%S"), f"{len(hosts)} host(s)"]
    if flagged:
        parts.append("flagged: " + ", ".join(flagged))
    if down:
        parts.append("not answering: " + ", ".join(down))
    return "  ".join(parts)


def _errors(hosts) -> bool:
    down = [h for h in hosts if h.state != "ok"]
    for h in down:
        click.secho(f"[{h.host}] {h.state}: {h.error}", fg="red", err=True)
    return bool(down)


@app.command("clusterctl top --hosts inventory.yaml")
@app.hosts_option
@click.option("--interval", default=3.0, show_default=True, type=click.FloatRange(min=0.5), metavar="S",
              help="Seconds between samples.")
@click.option("--once", is_flag=True, help="Print one table and exit (for scripts; no live refresh).")
@app.json_option
@app.connect_timeout_option()
def top_cmd(inventory_path, interval, once, as_json, connect_timeout):
    """Watch every host: memory, swap, load, GPU, heat, disk and ranks, live."""
    from ..observe.telemetry import Telemetry

    with Telemetry(app.connector(app.load(inventory_path), connect_timeout)) as telemetry:
        if as_json or once:
            hosts = telemetry.sample()
            if as_json:
                click.echo(json.dumps({"taken": time.time(), "hosts": [h.as_json() for h in hosts]}, indent=2))
            else:
                for line, _ in lines(hosts):
                    click.echo(line)
            if _errors(hosts):
                sys.exit(1)
            return
        try:
            if sys.stdout.isatty():
                _live(telemetry, interval)
            else:
                for hosts in telemetry.every(interval):
                    click.echo(_title(hosts))
                    for line, _ in lines(hosts):
                        click.echo(line)
                    click.echo("")
        except KeyboardInterrupt:         # the way out of a live view: not a failure
            return


def _live(telemetry, interval: float) -> None:
    from rich.console import Console
    from rich.live import Live

    from .panel import _Cropped       # styled lines cut at the terminal's width, as run's panel draws them

    console = Console(highlight=False, markup=False, emoji=False)
    with Live(_Cropped([("sampling every host...", "dim")]), console=console, auto_refresh=False,
              transient=False) as live:
        for hosts in telemetry.every(interval):
            live.update(_Cropped([(_title(hosts), "bold")] + lines(hosts)), refresh=True)
