"""clusterctl top: every host's memory, pressure, swap, load, GPU, heat, disk and ranks, refreshed in place
(observe/telemetry.py samples them; docs/observe.md#clusterctl-top says what each column is and where it comes from).

On a terminal the table is redrawn in place with rich (as run's live panel, cli/panel.py), a flagged or unreachable
host in colour; elsewhere (a pipe, a file) a plain table is printed per sample, as `top -b` does. `--once` prints one
table and `--json` one JSON document, then exit. The rows are cli/hosttable.py's, which run's live panel draws too."""
from __future__ import annotations

import json
import sys
import time

import click

from . import app
from .hosttable import lines


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
@click.option("--interval", default=3.0, show_default=True, type=app.Seconds(0.5), metavar="S",
              help="Seconds between samples.")
@click.option("--once", is_flag=True, help="Print one table and exit (for scripts; no live refresh).")
@app.json_option
@app.connect_timeout_option()
def top_cmd(inventory_path, interval, once, as_json, connect_timeout):
    """Watch every host: memory, swap, load, GPU, heat, disk and ranks, live."""
    from ..observe.telemetry import Telemetry

    every = None if as_json or once else interval          # watched: one probe per host, printing every interval
    with Telemetry(app.connector(app.load(inventory_path), connect_timeout), every=every) as telemetry:
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

    from .panel import Cropped       # styled lines cut at the terminal's width, as run's panel draws them

    console = Console(highlight=False, markup=False, emoji=False)
    with Live(Cropped([("sampling every host...", "dim")]), console=console, auto_refresh=False,
              transient=False) as live:
        for hosts in telemetry.every(interval):
            live.update(Cropped([(_title(hosts), "bold")] + lines(hosts)), refresh=True)
