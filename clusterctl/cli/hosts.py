"""clusterctl hosts, exec, init: the inventory, and commands on every host."""
from __future__ import annotations

import datetime
import json
import os
import sys

import click

from ..atomic import write_text
from ..errors import EXIT_FAILED, EXIT_OK, UsageError
from ..inventory import DEFAULT_BACKEND, DEFAULT_PYTHON, DEFAULT_WORKDIR
from ..launch import backends
from . import app
from .console import outcome_json, print_outcome, table


@app.command("clusterctl hosts --hosts inventory.yaml")
@app.hosts_option
@app.json_option
def hosts_cmd(inventory_path, as_json):
    """Show the resolved hosts: inventory + defaults + ~/.ssh/config."""
    from ..hosts.sshconfig import host_rows

    cluster = app.load(inventory_path)
    rows = host_rows(cluster)
    if as_json:
        click.echo(json.dumps({"inventory": cluster.path, "world_size": cluster.world_size,
                               "backend": cluster.launch.backend, "hosts": rows}, indent=2))
        return
    table(rows, ["ranks", "name", "connect", "user", "address", "python", "workdir"])
    click.echo(f"{len(cluster.hosts)} hosts, world size {cluster.world_size}, backend {cluster.launch.backend}")


@app.command("clusterctl exec --hosts inventory.yaml -- uname -a")
@app.hosts_option
@click.option("--sh", "script", metavar="SCRIPT", help="Run this shell script instead of a command.")
@click.option("--timeout", type=app.Seconds(above=True), metavar="S", default=60.0, show_default=True,
              help="Seconds the command may run per host.")
@app.connect_timeout_option()
@click.option("--cwd", metavar="DIR", help="Working directory on each host (~ is the host's home).")
@app.strict_host_keys_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def exec_cmd(inventory_path, script, timeout, connect_timeout, cwd, strict_host_keys, as_json, argv):
    """Run a command on every host in parallel and show each host's output."""
    if bool(script) == bool(argv):
        raise click.UsageError("give either a command after -- or --sh SCRIPT")
    cluster = app.load(inventory_path)
    connector = app.connector(cluster, connect_timeout, strict_host_keys)
    group = connector.run_everywhere(script or list(argv), timeout, cwd=cwd)
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "hosts": [outcome_json(o) for o in group.values()]}, indent=2))
    else:
        for outcome in group.values():
            print_outcome(outcome)
        failed = len(group.failed)
        click.echo(f"{len(group) - failed} ok, {failed} failed", err=True)
    sys.exit(EXIT_OK if group.all_ok else EXIT_FAILED)


@app.command("clusterctl init studio-1 studio-2 --user alice -o inventory.yaml")
@click.argument("names", nargs=-1, required=True)
@click.option("-o", "--output", default="inventory.yaml", show_default=True, type=click.Path(dir_okay=False))
@click.option("--user", help="SSH user on every host (default: from ~/.ssh/config or your user name).")
@click.option("--port", type=int, help="SSH port on every host (default: from ~/.ssh/config, else 22).")
@click.option("--identity-file", metavar="KEY", help="The private key on this machine that logs in to every host "
              "(default: from ~/.ssh/config, else ssh's own keys).")
@click.option("--python", default=DEFAULT_PYTHON, show_default=True, help="Python with mlx on every host.")
@click.option("--workdir", default=DEFAULT_WORKDIR, show_default=True, help="Where code and data land.")
@click.option("--address", "addresses", multiple=True, metavar="IP",
              help="Data-plane IPv4 per host, in the same order as the names (repeat the option).")
@click.option("--backend", type=click.Choice(backends.names()), default=DEFAULT_BACKEND, show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init_cmd(names, output, user, port, identity_file, python, workdir, addresses, backend, force):
    """Write a starter inventory for the given hosts.

    The settings given go under `defaults:`; the others are shown there commented."""
    from ..inventory_edit import starter_inventory

    if os.path.exists(output) and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")
    if identity_file and not identity_file.startswith("~") and not os.path.isabs(identity_file):
        # the inventory reads a relative path from its own directory: the same file, said from there
        identity_file = os.path.relpath(os.path.abspath(identity_file), os.path.dirname(os.path.abspath(output)))
    settings = {"user": user, "port": port, "identity_file": identity_file, "python": python, "workdir": workdir}
    text = starter_inventory(list(names), settings=settings, addresses=list(addresses), backend=backend,
                             date=datetime.date.today().isoformat(), path=output,
                             rdma=backends.get(backend).rdma is not None)
    write_text(output, text)
    click.echo(f"wrote {output} ({len(names)} hosts); check it with: clusterctl hosts --hosts {output}")
    key = identity_file and os.path.join(os.path.dirname(os.path.abspath(output)), os.path.expanduser(identity_file))
    if key and not os.path.isfile(key):
        click.secho(f"warning: --identity-file {identity_file}: no such file on this machine ({key}) yet",
                    fg="yellow", err=True)


@app.command("clusterctl ssh-close --hosts inventory.yaml")
@click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
              help="Close only these hosts' connections (default: every one clusterctl keeps open).")
def ssh_close_cmd(inventory_path):
    """End the SSH connections clusterctl keeps open for reuse."""
    from ..hosts.openssh import CONTROL_PERSIST_S, close_masters

    closed = close_masters(app.load(inventory_path) if inventory_path else None)
    click.echo(f"closed {len(closed)} connection(s)" + ("" if closed else
               f" (none was open: an idle one ends by itself after {CONTROL_PERSIST_S} s)"))
