"""clusterctl serve: one model served by mlx-lm across the hosts (docs/serve.md)."""
from __future__ import annotations

import os
import sys

import click

from ..trainer_contract import RUNS_DIR
from . import app
from .console import size
from .printedrun import PrintedRun, print_tail


class PrintedServe(PrintedRun):
    """serve's events (serve.service.ServeEvents) as lines on stderr, the ranks' output as `run` shows it."""

    def checked(self, model, kind, nbytes):
        click.echo(f"serve: {os.path.basename(model)}, a {kind} model with {size(nbytes)} of weights", err=True)

    def fused(self, base, adapters, path, cached):
        how = "fused before: reused" if cached else "fused into it now"
        click.echo(f"serve: the adapters {adapters} on {base} ({how}, {path})", err=True)

    progress_prefix = "store"         # its model's copy, and where each host has it (PrintedRun.model_stored)

    def listening(self, url, exposed):
        if exposed:
            click.secho(f"warning: the server listens on {url} with no authentication: anyone who can reach that "
                        "address can use it", fg="yellow", err=True)

    def ready(self, url, model_id, seconds, since_start):
        click.secho(f"serve: ready at {url} (model {model_id!s}): answered a one-token completion {seconds:.1f}s after "
                    f"the ranks started, {since_start:.1f}s after serve did", fg="green", err=True)


@app.command("clusterctl serve models/Qwen3-8B --hosts inventory.yaml --port 8080")
@click.argument("model")
@click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
              help="The inventory YAML file (default: this machine alone).")
@app.backend_option()
@click.option("--pipeline", is_flag=True,
              help="mlx-lm's pipeline parallelism (each host holds some layers) instead of tensor parallelism (each "
                   "host holds a slice of every layer); for models mlx-lm pipelines.")
@click.option("--name", metavar="NAME",
              help="The model's id in /v1/models, and what requests name it by (default: MODEL's directory name; "
                   "any id works, and none).")
@click.option("--port", type=int, default=8080, show_default=True,
              help="The URL's port: on this machine (carried to rank 0 over SSH), or on the --listen address.")
@click.option("--listen", metavar="ADDR",
              help="Rank 0 listens on this address of its host (e.g. its LAN address, or 0.0.0.0) instead of its "
                   "loopback, and nothing is carried over SSH. The server has no authentication.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="When a rank dies or the endpoint stops answering: stop every rank and start the server again "
                   "on the same port, up to N times.")
@click.option("--restart-delay", type=app.Seconds(), default=10.0, show_default=True, metavar="S",
              help="Seconds between an attempt's end and the next one's start.")
@click.option("--stall-timeout", type=app.Seconds(), metavar="S",
              help="The endpoint not answering /health for S seconds while the ranks run is a stall (restarted under "
                   "--max-restarts). Default: adaptive, from the first answer; 0: off.")
@click.option("--method", type=click.Choice(["auto", "rsync", "sftp"]), default="auto", show_default=True,
              help="How the model travels to a host's store. " + app.PUSH_METHOD_HELP)
@click.option("--direct", is_flag=True, help=app.DIRECT_HELP)
@click.option("--verify", is_flag=True,
              help="Hash every file of the model in every host's store again (not only the files whose size or "
                   "time changed).")
@click.option("--launch-from", type=click.Choice(["auto", "here", "first-host"]), default="auto", show_default=True,
              help="Where the launcher runs.")
@click.option("--adapter", "adapter_ref", metavar="RUN|DIR",
              help="Serve MODEL with these adapters (an --adapter run of the bundled trainer: its id, latest, its "
                   "directory, or a directory in mlx-lm's adapter layout), fused into it on this machine once.")
@click.option("--runs-dir", default=RUNS_DIR, show_default=True, type=click.Path(file_okay=False),
              help="Where the run's logs go (and where --adapter finds a run).")
@app.connect_timeout_option()
@app.detach_options("server", "Hand the server to a supervisor on one of its hosts and return at once: it goes on "
                   "serving while this machine sleeps or is gone (needs --listen; `clusterctl attach RUN` follows it, "
                   "`clusterctl kill RUN` stops it: docs/serve.md#a-server-that-outlives-this-machine).")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def serve_cmd(model, inventory_path, backend, pipeline, name, port, listen, max_restarts, restart_delay, stall_timeout,
              method, direct, verify, launch_from, adapter_ref, runs_dir, connect_timeout, detach, supervisor_host,
              handoff_path, server_args):
    """Serve MODEL (a directory or hub id) from every host, until Ctrl-C.

    MODEL: an mlx-lm model directory, or a model's Hugging Face id (mlx-community/Qwen3-4B-4bit), from the hub's
    cache here (docs/models.md).

    \b
    clusterctl serve MODEL --hosts inventory.yaml [OPTIONS] [-- MLX_LM_SERVER_OPTIONS]

    The model goes to each host's model store once (`clusterctl models`), one rank per host loads its share,
    and the OpenAI-compatible endpoint is printed once it answers, by default at http://127.0.0.1:PORT on this
    machine, carried over SSH to rank 0's host, where the server listens only on the loopback.
    """
    from ..launch.attempts import AttemptSettings
    from ..launch.outcome import AttemptState
    from ..launch.restart import RestartPolicy
    from ..launch.stall import StallPolicy
    from ..launch.supervise import Settings
    from ..serve.adapted import adapter_dir
    from ..serve.service import ServeOptions, describe_failure, serve

    attempts = AttemptSettings(runs_dir=runs_dir, launch_from=launch_from,
                               restart=RestartPolicy(max_restarts, restart_delay),
                               watch=Settings(stall=StallPolicy.parse(stall_timeout)))
    options = ServeOptions(model=model, name=name, port=port, listen=listen, backend=backend, pipeline=pipeline,
                           server_args=tuple(server_args), attempts=attempts, method=method, direct=direct, verify=verify,
                           connect_timeout=connect_timeout,
                           adapter=adapter_dir(adapter_ref, runs_dir) if adapter_ref else None,
                           fuse=_fuse if adapter_ref else None)
    if supervisor_host and not detach:
        raise click.UsageError("--supervisor says where a detached server's supervisor goes: give --detach too")
    cluster = app.load(inventory_path) if inventory_path else None
    if detach:
        _detach(cluster, options, supervisor_host)
        return
    events = PrintedServe()
    if handoff_path:        # a detached server's supervisor, on its host (clusterctl/detach/supervisor.py)
        from dataclasses import replace

        from ..detach import handoff

        handed = handoff.read(handoff_path)
        os.unlink(handoff_path)        # it holds the inventory's env values: read once, kept nowhere
        cluster = handed.cluster
        options = replace(options, stored=handed.stored, attempts=replace(attempts, run_id=handed.run_id))
    result = serve(cluster, options, events)
    launch, outcome = result.run.launch, result.run.outcome
    if outcome.state is AttemptState.STOPPED:
        click.echo(f"serve {launch.run_id}: {outcome.reason}; {result.url} is closed", err=True)
        sys.exit(result.exit_code)
    cause = describe_failure(result.run)
    click.secho(f"serve {launch.run_id} ended: {cause or outcome.reason}", fg="red", err=True)
    if cause is None:
        print_tail(launch, outcome)
    sys.exit(result.exit_code or 1)


# what a detached server's supervisor is not given of serve's options (supervisor_argv): what applies here only
# (the inventory's path, the model's copy and its adapters, done here; the detach itself) and what it is given
# otherwise (MODEL, --name, --runs-dir)
HERE_ONLY = frozenset({"inventory_path", "method", "direct", "verify", "adapter_ref", "runs_dir", "detach",
                       "supervisor_host", "handoff_path", "name"})


def supervisor_argv(command: click.Command, params: dict, model_path: str, name: str, runs_dir: str) -> list[str]:
    """The words of `serve` that a detached server's supervisor runs with (pure): the model where the first host's
    store holds it, its name, the supervisor's runs directory, every other option as given (or its default), then
    the server's own options."""
    out = [model_path, "--name", name, "--runs-dir", runs_dir]
    for param in command.params:
        if not isinstance(param, click.Option) or param.name in HERE_ONLY:
            continue
        value = params[param.name]
        if param.is_flag:
            out += [param.opts[0]] if value else []
        elif value is not None:
            out += [param.opts[0], str(value)]
    return [*out, "--", *params["server_args"]]


def _detach(cluster, options, supervisor_host: str | None) -> None:
    """serve --detach: checked and stored from here, handed to its supervisor on a host (serve/detached.py)."""
    from ..detach.supervisor import DETACHED_DIR
    from ..serve.detached import detach

    ctx = click.get_current_context()
    detached, url = detach(cluster, options,
                           lambda path, name: supervisor_argv(ctx.command, ctx.params, path, name, DETACHED_DIR),
                           supervisor_host, PrintedServe())
    click.echo(f"serve {detached.run_id}: detached; its supervisor runs on {detached.host} (pid {detached.pid}); it "
               f"answers at {url} once ready", err=True)
    click.echo(f"  follow it:  clusterctl attach {detached.run_id}   (says when it is ready; Ctrl-C there leaves it "
               "serving)", err=True)
    click.echo(f"  stop it:    clusterctl kill {detached.run_id}", err=True)
    click.echo(detached.run_id)


def _fuse(base, adapters, into):
    from ..train.export import fuse_into       # imports mlx and mlx-lm: only a serve --adapter pays for it
    fuse_into(base, adapters, into)
