"""clusterctl setup mesh | python | network."""
from __future__ import annotations

import json
import sys

import click

from ..doctor import DOCTOR_CONNECT_TIMEOUT_S
from ..errors import UsageError
from ..setup.topology import BACKENDS, DEFAULT_SUBNET
from . import app


@app.command("clusterctl setup mesh --hosts inventory.yaml", cls=click.Group)
def setup_cmd():
    """Set hosts up: SSH mesh, this machine's MLX, Thunderbolt addresses."""


@setup_cmd.command("mesh")
@app.hosts_option
@click.option("--dry-run", is_flag=True, help="List every change; change nothing.")
@click.option("--undo", is_flag=True, help="Remove exactly what setup mesh added, on the hosts and in the inventory.")
@app.json_option
@app.connect_timeout_option(DOCTOR_CONNECT_TIMEOUT_S)
@app.strict_host_keys_option
def mesh_cmd(inventory_path, dry_run, undo, as_json, connect_timeout, strict_host_keys):
    """Passwordless SSH between every pair of hosts: a key pair made on each host (the private half never
    leaves it), its public half in every host's authorized_keys, every host key (as this machine's own
    connection verified it) in every host's known_hosts; then doctor's mesh check. This machine's login to
    each host must already work; no password is ever typed or stored."""
    from ..setup.mesh import setup_mesh, undo_mesh

    cluster = app.load(inventory_path)
    connector = app.connector(cluster, connect_timeout, strict_host_keys)
    result = undo_mesh(connector, dry_run) if undo else setup_mesh(connector, dry_run)
    if as_json:
        click.echo(json.dumps(result.as_dict(dry_run, undo), indent=2))
    else:
        out, err = result.report(dry_run, undo)
        for line in err:
            click.secho(line, fg="red", err=True)
        if out:
            click.echo("\n".join(out))
    sys.exit(result.exit_code)


@setup_cmd.command("python")
@app.hosts_option
@click.option("--requirements", "requirements_file", type=click.Path(exists=True, dir_okay=False),
              help="What the project needs, pip's format (MLX is pinned beside it unless it names MLX). "
                   "Default: MLX, numpy and PyYAML at this machine's versions.")
@click.option("--with", "extras", type=click.Choice(["lm", "supervisor"]), multiple=True,
              help="lm: mlx-lm (fine-tuning, serve) at this machine's version, which must have it. Without it, "
                   "mlx-lm is installed all the same whenever this machine has it. supervisor: clusterctl's own "
                   "requirements (click, paramiko, PyYAML, rich), so that a host can supervise a detached run "
                   "(run --detach).")
@click.option("--offline", is_flag=True, help="Hosts without internet: download the wheels for each kind of "
              "host here, send them, install from them alone.")
@click.option("--dry-run", is_flag=True, help="Say what each host would get; change nothing.")
@app.json_option
@app.connect_timeout_option(DOCTOR_CONNECT_TIMEOUT_S)
@app.strict_host_keys_option
def python_cmd(inventory_path, requirements_file, extras, offline, dry_run, as_json, connect_timeout, strict_host_keys):
    """The same Python, MLX (and mlx-lm, when this machine has it) on every host: a virtual environment in each
    host's workdir made with a host Python of this machine's minor version, holding this machine's versions (uv
    when the host has it, else pip); the inventory's python set to it; then doctor's parity check."""
    from ..setup.python import check_extras, setup_python

    check_extras("lm" in extras)          # before anything is asked of a host
    cluster = app.load(inventory_path)
    connector = app.connector(cluster, connect_timeout, strict_host_keys)

    def progress(h):
        if not as_json:
            what = f"failed: {h.error}" if h.error else (h.changes[-1] if h.changes else "nothing to change")
            click.echo(f"{h.host}: {what} ({h.seconds:.0f} s)", err=True)

    result = setup_python(connector, requirements_file, dry_run, progress, offline=offline, with_lm="lm" in extras,
                          supervisor="supervisor" in extras)
    if as_json:
        click.echo(json.dumps(result.as_dict(dry_run), indent=2))
    else:
        out, err = result.report(dry_run)
        for line in err:
            click.secho(line, fg="red", err=True)
        if out:
            click.echo("\n".join(out))
    sys.exit(result.exit_code)


@setup_cmd.command("network")
@app.hosts_option
@click.option("--backend", type=click.Choice(BACKENDS), help="The backend to plan for. Default: jaccl on a "
              "Thunderbolt 5 mesh whose Macs have RDMA on, else ring.")
@click.option("--subnet", default=DEFAULT_SUBNET, show_default=True, metavar="CIDR",
              help="Where the cables' /30 subnets come from (networks a Mac already uses are skipped).")
@click.option("--dot", "as_dot", is_flag=True, help="Print the cables as a Graphviz graph and stop.")
@click.option("--png", "png", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also draw the plan into FILE: each Mac, each cable with the port and address at either end, "
                   "the ring's order, from the plan alone (needs matplotlib: pip install matplotlib).")
@click.option("--write", is_flag=True, help="Write each host's address (and rdma list) and the backend into "
              "the inventory, comments kept.")
@click.option("--apply", "apply_", is_flag=True, help="Configure the Macs: cabled ports out of bridge0, an "
              "address on each (needs passwordless sudo on every Mac; each command is printed first).")
@app.json_option
@app.connect_timeout_option(DOCTOR_CONNECT_TIMEOUT_S)
@app.strict_host_keys_option
def network_cmd(inventory_path, backend, subnet, as_dot, png, write, apply_, as_json, connect_timeout,
                strict_host_keys):
    """macOS: which Thunderbolt ports join which Macs (system_profiler, networksetup), a subnet per cable,
    each host's data-plane address (and RDMA devices for jaccl). Prints the plan; --write puts it in the
    inventory, --apply sets the Macs' interfaces."""
    import ipaddress

    from ..setup.network import setup_network
    from ..setup.topology import dot

    try:
        ipaddress.IPv4Network(subnet, strict=False)
    except ValueError:
        raise UsageError(f"--subnet {subnet!r} is not an IPv4 network such as {DEFAULT_SUBNET}") from None
    if png:
        from ..figure import check
        check("setup network --png")          # before any host is asked
    cluster = app.load(inventory_path)
    connector = app.connector(cluster, connect_timeout, strict_host_keys)

    def progress(line):
        if not as_json:
            click.echo(f"running {line}", err=True)

    result = setup_network(connector, backend, subnet, write=write and not as_dot, apply=apply_ and not as_dot,
                           progress=progress)
    if png and result.plan is not None:
        from ..setup.picture import write_png
        click.echo(f"wrote {write_png(result.plan, png)}", err=True)
    if as_dot and result.plan is not None:
        click.echo(dot(result.plan), nl=False)
        sys.exit(result.exit_code)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        out, err = result.report(write, apply_)
        if out:
            click.echo("\n".join(out))
        for line in err:
            click.secho(line, fg="red", err=True)
    sys.exit(result.exit_code)
