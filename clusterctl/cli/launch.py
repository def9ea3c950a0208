"""clusterctl hostfile, run: starting jobs. run's command line is split by runwords.py (RunCommand), its events
printed by printedrun.py (PrintedRun), and the job is run/'s (run/usecase.py run, run/detached.py detach)."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import click

from ..launch import backends
from ..launch.hostfile import FORMATS
from ..launch.launchers import LAUNCH_FROM
from ..launch.restart import DATA_PLANE_WAIT_S, HOST_WAIT_S
from ..trainer_contract import RUNS_DIR
from . import app
from .printedrun import PrintedRun, panel_wanted, print_tail
from .runwords import RunCommand, RunWords, supervisor_argv


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
    from ..launch.byhand import hostfile_and_command

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
    # the hosts are reached (and so resolved) only for --print-command's discovery
    connector = app.connector(app.load(inventory_path), connect_timeout, lazy=not print_command)
    text, line = hostfile_and_command(connector, fmt, output=output, template=template_text,
                                      template_name=template or fmt, program=list(program) if print_command else None)
    if not output:
        click.echo(text, nl=False)
    if line:
        click.echo(line)


@app.command("clusterctl run --hosts inventory.yaml train.py --lr 3e-4", cls=RunCommand)
@click.option("-m", "--module", metavar="MODULE",
              help="Run this Python module on every rank, as `python -m MODULE ARGS...`; the last of "
                   "clusterctl's options: every word after MODULE is the module's.")
@click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
              help="The inventory. Default: this machine, 2 ranks, ring backend.")
@app.backend_option()
@click.option("--dry-run", is_flag=True, help="Print the command and environment; launch nothing.")
@click.option("--no-preflight", is_flag=True, help="Skip checking SSH, python and the script on every host first.")
@click.option("--rank0-only", is_flag=True, help="Show only rank 0's output (every rank is still logged).")
@click.option("--no-stdin", is_flag=True,
              help="Give every rank an empty stdin (EOF at once) instead of this command's own stdin, which every "
                   "rank otherwise reads, the same bytes each (a terminal only while run is in the foreground; "
                   "docs/run.md#standard-input). The bundled trainer always gets an empty one.")
@click.option("--plain", is_flag=True,
              help="No live panel of the ranks under the output (it is drawn only on a terminal anyway).")
@click.option("--start-timeout", type=app.Seconds(), metavar="S",
              help="Abort if some rank has not started after S seconds.")
@click.option("--hang-timeout", type=app.Seconds(), metavar="S",
              help="Abort if a rank is silent (no output, no heartbeat) for S seconds.")
@click.option("--stall-timeout", type=app.Seconds(), metavar="S",
              help="Stop the job, with every rank's stacks, when no rank has made progress (output, metrics "
                   "lines) for S seconds; 0: never. Default: adaptive, from the first metrics line on "
                   "(docs/run.md#stalls).")
@click.option("--runs-dir", default=RUNS_DIR, show_default=True, help="Where runs/<id>/ (logs, launch.json) go.")
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
@click.option("--data", "data_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Shards from `clusterctl data prepare`: host i gets only its own; ranks find them in "
                   "CLUSTERCTL_DATA_DIR (the bundled trainer reads them).")
@click.option("--all-shards", is_flag=True,
              help="With --data: every shard to every host, so that the bundled trainer's balancing can give a "
                   "faster host rows of a slower one's shard (docs/trainer.md#balanced-data-parallelism).")
@click.option("--env", "env_words", multiple=True, metavar="NAME[=VALUE]",
              help="Set NAME in every rank's environment (over the inventory's `env:`); a bare NAME takes this "
                   "machine's value (the way to pass a secret: it stays off every command line). Repeatable. As "
                   "the inventory's env, it reaches the ranks through SSH's standard input, and a name that looks "
                   "secret (…TOKEN, …API_KEY, …) is redacted in the run's records.")
@click.option("--direct", is_flag=True,
              help="Copy the program's model (the bundled trainer's --model) to each host from this machine, instead "
                   "of once to the first host and from host to host over their data-plane addresses "
                   "(docs/models.md#relay).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="When a rank fails, a host stops answering or the launcher dies: stop every rank, wait "
                   "--restart-delay, check the hosts again and launch again, up to N times. The bundled trainer "
                   "continues from its newest checkpoint; other programs get CLUSTERCTL_RESTART and "
                   "CLUSTERCTL_RESUME_DIR. Each attempt logs into runs/<id>/attempt-K/.")
@click.option("--restart-delay", type=app.Seconds(), default=10.0, show_default=True, metavar="S",
              help="Seconds between an attempt's end and the next one's pre-flight.")
@click.option("--data-plane-wait", type=app.Seconds(), default=DATA_PLANE_WAIT_S, show_default=True,
              metavar="S", help="After an attempt that failed because its hosts could not reach each other (the "
                                "link between them dropped), the restart waits up to S seconds for every host to reach "
                                "the others again before it launches; 0: launch at once.")
@click.option("--host-wait", type=app.Seconds(), default=HOST_WAIT_S, show_default=True, metavar="S",
              help="A restart whose check of the hosts cannot reach one over SSH (connection refused or timed out: "
                   "a Mac rebooting or waking) asks it again every 5 s, up to S seconds, before that restart counts "
                   "as failed; 0: no wait. With --elastic the restart goes on without it instead.")
@click.option("--elastic", type=click.IntRange(min=1), metavar="MIN",
              help="With --max-restarts: restart on the hosts that answer, as long as they run at least MIN ranks "
                   "(data-parallel only; a host that comes back is used again at the next restart).")
@click.option("--elastic-batch", type=click.Choice(["rank", "global"]), default="rank", show_default=True,
              help="After the world changes, keep each rank's batch (the global batch changes with the world), or "
                   "keep the global batch by changing the bundled trainer's --accum (exported to every program "
                   "as CLUSTERCTL_ELASTIC_BATCH).")
@app.detach_options("run", "Hand the job to a supervisor on one of its hosts and return at once: it goes on while "
                   "this machine sleeps or goes away; follow it with `clusterctl attach RUN` "
                   "(docs/run.md#close-the-lid-detached-runs).")
def run_cmd(module, inventory_path, backend, dry_run, no_preflight, rank0_only, no_stdin, plain, start_timeout,
            hang_timeout, stall_timeout, runs_dir, connect_timeout, launch_from, launcher, no_sync, no_fetch, fetch_paths,
            fetch_all_ranks, data_dir, all_shards, env_words, direct, max_restarts, restart_delay, data_plane_wait, host_wait,
            elastic, elastic_batch, detach, supervisor_host, handoff_path):
    """Run SCRIPT, -m MODULE or the bundled trainer on every rank.

    \b
    clusterctl run [OPTIONS] SCRIPT [ARGS]...      python SCRIPT ARGS on every rank
    clusterctl run [OPTIONS] -m MODULE [ARGS]...   python -m MODULE ARGS on every rank
    clusterctl run [OPTIONS] [-- ARGS]             the bundled trainer (python -m clusterctl.train ARGS)

    clusterctl's options come first: every word after SCRIPT or MODULE is the program's, as with
    `python` and torchrun. For example, a package's subcommand with its own flags:

    \b
    clusterctl run --hosts inventory.yaml --fetch adapters -m mlx_lm lora --train --data data --adapter-path adapters

    A block of clusterctl options at the very end of the line, starting with --hosts, --fetch, --launcher or
    another option that names the launch, is still taken as clusterctl's (mlx.launch-style lines), with a
    note; write `--` after SCRIPT or MODULE to give every following word to the program instead.
    """
    words: RunWords = click.get_current_context().meta["clusterctl.run"]
    if words.trailing:
        click.echo(f"note: took {' '.join(words.trailing)} from the end of the line as clusterctl's options "
                   "(write `--` after the program to pass them to it)", err=True)
    attempts = _attempt_settings(runs_dir, launch_from, dry_run, no_preflight, rank0_only, start_timeout, hang_timeout,
                                 stall_timeout, max_restarts, restart_delay, data_plane_wait, host_wait, elastic,
                                 elastic_batch)
    options = _run_options(words, backend, launcher, attempts, connect_timeout, no_sync, no_fetch, fetch_paths,
                           fetch_all_ranks, data_dir, all_shards, direct, env_words, no_stdin)
    if supervisor_host and not detach:
        raise click.UsageError("--supervisor says where a detached run's supervisor goes: give --detach too")
    if detach:
        _detach(words, options, inventory_path, supervisor_host, fetch_paths, data_dir, elastic)
        return
    _run_attached(options, inventory_path, plain, handoff_path)


def _attempt_settings(runs_dir, launch_from, dry_run, no_preflight, rank0_only, start_timeout, hang_timeout,
                      stall_timeout, max_restarts, restart_delay, data_plane_wait, host_wait, elastic, elastic_batch):
    """How every attempt is launched and watched (launch/attempts.py AttemptSettings), from run's options."""
    from ..launch.attempts import AttemptSettings
    from ..launch.restart import RestartPolicy
    from ..launch.stall import StallPolicy
    from ..launch.supervise import Settings

    return AttemptSettings(runs_dir=runs_dir, launch_from=launch_from, dry_run=dry_run, preflight=not no_preflight,
                           restart=RestartPolicy(max_restarts, restart_delay, elastic, elastic_batch, data_plane_wait,
                                                 host_wait),
                           watch=Settings(rank0_only=rank0_only, start_timeout=start_timeout,
                                          hang_timeout=hang_timeout, stall=StallPolicy.parse(stall_timeout)))


def _run_options(words: RunWords, backend, launcher, attempts, connect_timeout, no_sync, no_fetch, fetch_paths,
                 fetch_all_ranks, data_dir, all_shards, direct, env_words, no_stdin):
    """What run is asked (run/options.py RunOptions): the program as split_run_words found it (-m is taken by the
    split: click's --module only documents it), and the bundled trainer with its own checks before a launch (the
    trainer's code, given here: run imports no train/)."""
    from ..run.envflags import parse_env_options
    from ..run.options import RunOptions
    from ..train.config import file_settings
    from ..train.prelaunch import check_before_launch
    from ..train.strategies import shrink_refusal
    from ..trainer_program import BundledTrainer

    return RunOptions(script=words.script, args=tuple(words.args), module=words.module, backend=backend,
                      launcher=launcher, attempts=attempts, connect_timeout=connect_timeout, sync=not no_sync,
                      fetch=not no_fetch, fetch_paths=tuple(fetch_paths), fetch_all_ranks=fetch_all_ranks,
                      data_dir=data_dir, all_shards=all_shards, direct_model=direct,
                      env=parse_env_options(env_words, os.environ),
                      stdin=None if no_stdin or sys.stdin is None else sys.stdin.buffer,
                      kinds=(BundledTrainer(prelaunch=check_before_launch, strategy_shrink=shrink_refusal,
                                            settings_file=file_settings),))


def _run_attached(options, inventory_path: str | None, plain: bool, handoff_path: str | None) -> None:
    """The job run from here, or, with --handoff, as a detached run's supervisor on its host
    (clusterctl/detach/supervisor.py); its outcome said, and its exit code."""
    from ..run.usecase import run

    cluster = app.load(inventory_path) if inventory_path else None
    events = PrintedRun(live=panel_wanted(plain))
    if handoff_path:
        cluster, options, events = _handed_off(options, handoff_path)
    _report(run(cluster, options, events))


def _handed_off(options, handoff_path: str):
    """A detached run's supervisor: the cluster, the staging and the run id the handoff file gives (read once and
    removed: it holds the inventory's env values), its live panel written beside it for `attach`."""
    from ..detach import handoff
    from ..detach.supervisor import LIVE_FILE
    from ..run.options import Staged

    handed = handoff.read(handoff_path)
    os.unlink(handoff_path)        # it holds the inventory's env values: read once, kept nowhere
    options = replace(options, staged=Staged(handed.extra_env, handed.host_env),
                      attempts=replace(options.attempts, run_id=handed.run_id))
    return handed.cluster, options, PrintedRun(live=False, live_file=os.path.join(os.path.dirname(handoff_path),
                                                                                  LIVE_FILE))


def _report(result) -> None:
    """A run's last line (a dry run: its launch as JSON), and its exit code when it failed or was stopped."""
    from ..launch.outcome import AttemptState

    launch, outcome = result.launch, result.outcome
    if outcome is None:
        click.echo(json.dumps(launch.describe(), indent=2))
        return
    if result.exit_code == 0:
        click.echo(f"run {launch.run_id}: {outcome.reason}", err=True)
        return
    if outcome.state is AttemptState.STOPPED:      # Ctrl-C, SIGTERM: what the user asked for, not a failure
        click.secho(f"run {launch.run_id} stopped: {outcome.reason}", fg="yellow", err=True)
        sys.exit(result.exit_code)
    click.secho(f"run {launch.run_id} failed: {outcome.reason}", fg="red", err=True)
    print_tail(launch, outcome)
    sys.exit(result.exit_code)


def _detach(words: RunWords, options, inventory_path: str | None, supervisor_host: str | None, fetch_paths,
            data_dir: str | None, elastic: int | None) -> None:
    """run --detach: staged from here, handed to its supervisor on a host (run/detached.py); how to follow it."""
    from ..detach.supervisor import DETACHED_DIR
    from ..run.detached import detach

    if fetch_paths:
        raise click.UsageError("--detach and --fetch: a detached run's outputs stay on its hosts; its run directory "
                               "comes home with `clusterctl attach` or `clusterctl runs` once it ended")
    if data_dir and elastic is not None:
        raise click.UsageError("--detach with --data and --elastic: the shards are cut again for a smaller world "
                               "from this machine's copy, which a detached run cannot count on; run it attached")
    command = click.get_current_context().command
    argv = supervisor_argv(words, command.takes_value(), DETACHED_DIR)
    detached = detach(app.load(inventory_path) if inventory_path else None, options, argv, supervisor_host,
                      PrintedRun(live=False))
    click.echo(f"run {detached.run_id}: detached; its supervisor runs on {detached.host} (pid {detached.pid})", err=True)
    click.echo(f"  follow it:  clusterctl attach {detached.run_id}   (Ctrl-C there leaves it running)", err=True)
    click.echo(f"  stop it:    clusterctl kill {detached.run_id}", err=True)
    click.echo(detached.run_id)
