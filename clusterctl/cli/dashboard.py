"""clusterctl dashboard: a local web page of the hosts, the runs and the serve endpoints, updated live
(clusterctl/dashboard/; docs/observe.md#clusterctl-dashboard).

The page is served on 127.0.0.1 and a free port unless told otherwise, and every request must carry the random
token in the URL printed here: nothing else on this machine (another user, a web page in a browser) can read it.
`--listen ADDR` serves it on that address of this machine, with a warning."""
from __future__ import annotations

import click

from ..trainer_contract import RUNS_DIR
from . import app


@app.command("clusterctl dashboard --hosts inventory.yaml")
@click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
              help="The inventory YAML file: its hosts' telemetry and picture (without it: runs and endpoints only).")
@click.option("--runs-dir", default=RUNS_DIR, show_default=True, help="Where the project's runs/<id>/ directories are "
              "(runs of other projects come from the runs index).")
@click.option("--port", default=0, type=click.IntRange(0, 65535), metavar="PORT",
              help="The page's port (default: a free one).")
@click.option("--listen", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="The address of this machine the page is served on; another than the loopback lets other machines "
                   "reach it (the token still required), with a warning.")
@click.option("--interval", default=5.0, show_default=True, type=app.Seconds(0.5), metavar="S",
              help="Seconds between samples of the hosts while a page is open.")
@app.connect_timeout_option()
@click.pass_context
def dashboard_cmd(ctx, inventory_path, runs_dir, port, listen, interval, connect_timeout):
    """A live web page of the hosts, runs and endpoints, on this machine."""
    from ..dashboard.server import Page
    from ..dashboard.state import Board

    cluster = app.load(inventory_path) if inventory_path else None
    connector = app.connector(cluster, connect_timeout) if cluster is not None else None
    page = Page(Board(runs_dir, cluster, connector, interval=interval), listen, port)
    if page.exposed:
        click.secho(f"warning: the dashboard listens on {listen}: anyone who can reach that address and has the URL "
                    "(its token travels unencrypted over HTTP) sees your hosts and runs and can talk to your "
                    "endpoints", fg="yellow", err=True)
    click.echo(f"dashboard: {page.url}")
    click.echo("(open it in a browser on this machine; Ctrl-C stops the dashboard)", err=True)
    try:
        page.run(debug=(ctx.obj or {}).get("debug", False))
    except KeyboardInterrupt:            # the way to stop it: not a failure
        return
