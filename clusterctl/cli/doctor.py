"""clusterctl doctor."""
from __future__ import annotations

import sys

import click

from ..doctor import DOCTOR_CONNECT_TIMEOUT_S, DoctorOptions
from ..errors import EXIT_FAILED, EXIT_OK
from . import app


@app.command("clusterctl doctor --hosts inventory.yaml")
@app.hosts_option
@app.json_option
@click.option("--deep/--no-deep", default=None,
              help="Launch a real MLX all_sum over mpirun (and mlx.launch for ring). Default: on when this "
                   "machine has mpirun, or the hosts have addresses.")
@app.connect_timeout_option(DOCTOR_CONNECT_TIMEOUT_S)
@click.option("--smoke-timeout", type=app.Seconds(above=True), metavar="S", default=DoctorOptions.smoke_timeout,
              show_default=True,
              help="Seconds the smoke tests may take.")
@app.strict_host_keys_option
def doctor_cmd(inventory_path, as_json, deep, connect_timeout, smoke_timeout, strict_host_keys):
    """Check SSH all-to-all, PATH, MPI and the data plane of a cluster."""
    from ..doctor import run_doctor
    from ..doctor.report import render_table

    cluster = app.load(inventory_path)
    report = run_doctor(app.connector(cluster, connect_timeout, strict_host_keys),
                        DoctorOptions(deep=deep, smoke_timeout=smoke_timeout))
    if as_json:
        click.echo(report.to_json())
    else:
        click.echo(render_table(report, colour=sys.stdout.isatty()))
    sys.exit(EXIT_OK if report.ok else EXIT_FAILED)
