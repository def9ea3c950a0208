"""clusterctl hostfile, run: starting jobs."""
from __future__ import annotations

import json
import os
import sys

import click

from ..launch import backends
from ..launch.hostfile import FORMATS
from ..launch.launchers import LAUNCH_FROM
from . import app
from .console import one_line, size


@app.command("clusterctl hostfile --hosts inventory.yaml -o hosts.txt --print-command -- /path/train.py")
@app.hosts_option
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="openmpi", show_default=True,
              help="openmpi: `host slots=N`; mpich: `host:N`; mlx: mlx.launch's JSON.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here (default: standard output).")
@click.option("--template", type=click.Path(exists=True, dir_okay=False), help="Your own template (see templates/).")
@click.option("--print-command", is_flag=True,
              help="Also print the mpirun (or mlx.launch) line for SCRIPT, with the environment and tuning "
                   "`run` would use (asks every host over SSH where libmpi is).")
@app.connect_timeout_option()
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def hostfile_cmd(inventory_path, fmt, output, template, print_command, connect_timeout, program):
    """Write an Open MPI, MPICH or mlx.launch hostfile (and the launch line)."""
    from ..run import hostfile_and_command

    if print_command and not program:
        raise click.UsageError("--print-command needs the script: ... --print-command -- SCRIPT [ARGS]")
    if program and not print_command:
        raise click.UsageError("a script is only used with --print-command")
    if print_command and not output:
        raise click.UsageError("--print-command needs -o FILE: the printed command refers to the hostfile")
    template_text = None
    if template:
        with open(template, encoding="utf-8") as f:
            template_text = f.read()
    text, line = hostfile_and_command(app.load(inventory_path), fmt, output=output, template=template_text,
                                      template_name=template or fmt, program=list(program) if print_command else None,
                                      connect_timeout=connect_timeout)
    if not output:
        click.echo(text, nl=False)
    if line:
        click.echo(line)


class PrintedRun:
    """`run`'s events (run.RunEvents: every method of it) as lines: progress on stderr, the ranks' output
    on stdout / stderr."""

    def launching_from(self, host, launcher):
        click.echo(f"launching {launcher} from {host}", err=True)

    def staged(self, what, hosts, files, nbytes):
        click.echo(f"sync: {what} to {hosts} host(s): {files} file(s), {size(nbytes)} moved in all", err=True)

    def started(self, launch, program, world, backend):
        click.echo(f"run {launch.run_id}: {program} on {world} ranks over {backend}; logs in {launch.run_dir}",
                   err=True)

    def relaunching(self, launch, reason):
        click.echo(f"run {launch.run_id}: {reason}", err=True)

    def output(self, text, is_err):
        click.echo(text, err=is_err)

    def fetched(self, launch, host, remote_dir, files, nbytes):
        click.echo(f"run {launch.run_id}: copied {files} file(s), {size(nbytes)} from {host}:{remote_dir} "
                   f"into {launch.run_dir}", err=True)

    def fetch_failed(self, launch, host, remote_dir, error):
        click.secho(f"run {launch.run_id}: could not copy {remote_dir} from {host} ({one_line(error)}); it is "
                    "still there", fg="yellow", err=True)

    def outputs_fetched(self, launch, fetched):
        for f in fetched:
            what = f.path.path + ("/" if f.kind == "dir" else "")
            if f.status == "copied":
                route = ", over SFTP" if f.method == "sftp" else ""     # rsync missing here or on the host
                click.echo(f"run {launch.run_id}: fetched {what} ({f.files} file(s), {size(f.nbytes)}{route}) from "
                           f"{f.host} into {_shown(f.dest)}", err=True)
            elif f.status == "here":
                click.echo(f"run {launch.run_id}: {what} is already here ({_shown(f.dest)}): rank 0 ran on this "
                           "machine, in this directory; nothing to copy", err=True)
            elif f.status == "missing":
                click.secho(f"run {launch.run_id}: --fetch {f.path.given}: {f.host} has no {f.source}; nothing "
                            "copied", fg="yellow", err=True)
            else:
                click.secho(f"run {launch.run_id}: could not fetch {f.source} from {f.host} ({one_line(f.error)}); "
                            "it is still there", fg="yellow", err=True)
        click.echo(f"run {launch.run_id}: logs and metrics in {_shown(launch.run_dir)}/", err=True)


def _shown(path):
    """A local path as the user would type it: ./x below the current directory, else absolute."""
    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else os.path.join(".", rel)


@app.command("clusterctl run train.py --hosts inventory.yaml -- --lr 3e-4")
@click.argument("script", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("-m", "--module", metavar="MODULE",
              help="Run this Python module on every rank (python -m MODULE). Default without SCRIPT: the "
                   "bundled trainer, clusterctl.train.")
@click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
              help="The inventory. Default: this machine, 2 ranks, ring backend.")
@app.backend_option()
@click.option("--dry-run", is_flag=True, help="Print the command and environment; launch nothing.")
@click.option("--no-preflight", is_flag=True, help="Skip checking SSH, python and the script on every host first.")
@click.option("--rank0-only", is_flag=True, help="Show only rank 0's output (every rank is still logged).")
@click.option("--start-timeout", type=float, metavar="S", help="Abort if some rank has not started after S seconds.")
@click.option("--hang-timeout", type=float, metavar="S", help="Abort if a rank is silent (no output, no heartbeat) for S seconds.")
@click.option("--runs-dir", default="runs", show_default=True, help="Where runs/<id>/ (logs, launch.json) go.")
@app.connect_timeout_option()
@click.option("--launch-from", type=click.Choice(LAUNCH_FROM), default="auto", show_default=True,
              help="Where the launcher runs. auto: here when it is installed here (clusterctl's own always is), "
                   "else the first host.")
@click.option("--launcher", type=click.Choice(backends.launchers()),
              help="What starts the ranks. Default: mpirun for mpi; clusterctl itself for ring (mlx.launch: MLX's "
                   "own launcher, as a fallback).")
@click.option("--no-sync", is_flag=True,
              help="Do not copy the current directory (the project) and clusterctl to the hosts first.")
@click.option("--no-fetch", is_flag=True,
              help="Leave what the job wrote in its run directory on the first host (default: copy it here).")
@click.option("--fetch", "fetch_paths", multiple=True, metavar="PATH",
              help="After the job, whatever its outcome, copy PATH (a file or directory, relative to rank 0's "
                   "workdir, or absolute there) from rank 0's host to the same relative path here (an absolute "
                   "PATH: into runs/<id>/fetched/). Incremental. Repeatable.")
@click.option("--fetch-all-ranks", is_flag=True,
              help="With --fetch: bring PATH from every host, into runs/<id>/host-<name>/PATH.")
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False), metavar="DIR",
              help="Shards from `clusterctl data prepare`: host i gets only its own; ranks find them in "
                   "CLUSTERCTL_DATA_DIR (the bundled trainer reads them).")
def run_cmd(script, args, module, inventory_path, backend, dry_run, no_preflight, rank0_only, start_timeout,
            hang_timeout, runs_dir, connect_timeout, launch_from, launcher, no_sync, no_fetch, fetch_paths,
            fetch_all_ranks, data_dir):
    """Run SCRIPT (or the bundled trainer) on every rank, supervised."""
    from ..run import RunOptions, run

    options = RunOptions(script=script, args=tuple(args), module=module, backend=backend, dry_run=dry_run,
                         preflight=not no_preflight, rank0_only=rank0_only, start_timeout=start_timeout,
                         hang_timeout=hang_timeout, runs_dir=runs_dir, connect_timeout=connect_timeout,
                         launch_from=launch_from, launcher=launcher, sync=not no_sync, fetch=not no_fetch,
                         fetch_paths=tuple(fetch_paths), fetch_all_ranks=fetch_all_ranks, data_dir=data_dir)
    result = run(app.load(inventory_path) if inventory_path else None, options, PrintedRun())
    launch, outcome = result.launch, result.outcome
    if outcome is None:
        click.echo(json.dumps(launch.describe(), indent=2))
        return
    if result.exit_code == 0:
        click.echo(f"run {launch.run_id}: {outcome.reason}", err=True)
        return
    click.secho(f"run {launch.run_id} failed: {outcome.reason}", fg="red", err=True)
    if outcome.failed_rank is not None and outcome.tail:
        click.echo(f"last lines of {os.path.join(launch.run_dir, f'rank-{outcome.failed_rank}.log')}:", err=True)
        for line in outcome.tail:
            click.echo(f"  {line}", err=True)
    sys.exit(result.exit_code)
