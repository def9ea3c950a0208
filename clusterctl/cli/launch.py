"""clusterctl hostfile, run: starting jobs."""
from __future__ import annotations

import json
import os
import shlex
import sys
import threading
from dataclasses import dataclass, replace

import click

from ..launch import backends
from ..launch.hostfile import FORMATS
from ..launch.launchers import LAUNCH_FROM
from ..launch.restart import DATA_PLANE_WAIT_S
from ..trainer_contract import RUNS_DIR
from . import app
from .console import Bars, TransferProgress, one_line, size, stored_line


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


class PrintedRun:
    """`run`'s events (run.RunEvents: every method of it) as lines: progress on stderr, the ranks' output
    on stdout / stderr; with `live`, the ranks' panel under them while the job runs (cli/panel.py)."""

    def __init__(self, live: bool = False, live_file: str | None = None):
        self.live = live
        self.panel = None
        # a detached run's supervisor: the panel's snapshot written there every second for `attach` to draw
        self.live_file = live_file
        self.snapshots = None          # observe/live.py LiveFile, while a job runs
        # the long copies under way, by what they copy (the model to the hosts' stores, the project, the shards, a
        # fetch): each host's bytes, rate and time left (console.TransferProgress); on a terminal one block of bars
        # for all of them at once (two blocks redrawn in place would overwrite each other)
        self.copies: dict[str, TransferProgress] = {}
        self.bars: Bars | None = None
        self.copies_lock = threading.Lock()        # each host's copy reports from a thread of its own
        self.panel_lock = threading.Lock()         # the hosts' watch tells from a thread of its own

    progress_prefix = "model"

    def _copying(self, what: str, prefix: str) -> TransferProgress:
        with self.copies_lock:
            copying = self.copies.get(what)
            if copying is None:
                terminal = sys.stderr.isatty()
                if terminal and self.bars is None:
                    self.bars = Bars(err=True, threshold=Bars.LARGE)
                copying = self.copies[what] = TransferProgress(prefix, terminal=terminal, draw=self.bars).start()
            return copying

    def model_progress(self, host, done, total):
        self._copying("model", self.progress_prefix).update(host, done, total)

    def copy_progress(self, what, host, done, total):
        self._copying(what, what).update(host, done, total)

    def copy_ended(self, what):
        """A copy has ended: its progress lines stop before the lines that say how it went."""
        with self.copies_lock:
            copying = self.copies.pop(what, None)
            if not self.copies:
                self.bars = None      # the next copy's bars: a block of their own, below what was printed meanwhile
        if copying is not None:
            copying.close()

    def copied(self):
        """The model's copy has ended (copy_ended)."""
        self.copy_ended("model")

    def launching_from(self, host, launcher):
        click.echo(f"launching {launcher} from {host}", err=True)

    def warning(self, text):
        click.echo(f"warning: {text}", err=True)

    def note(self, text):
        click.echo(f"note: {text}", err=True)

    def staged(self, what, hosts, files, nbytes):
        click.echo(f"sync: {what} to {hosts} host(s): {files} file(s), {size(nbytes)} moved in all", err=True)

    def model_route(self, lines):
        for line in lines:
            click.echo(f"{self.progress_prefix}: {line}", err=True)

    def model_stored(self, host, entry, path):
        self.copied()
        click.echo(stored_line(self.progress_prefix, host, entry, path), err=True)

    def started(self, launch, program, world, backend):
        click.echo(f"run {launch.run_id}: {program} on {world} rank{'s' * (world != 1)} over {backend}; logs in {launch.log_dir}",
                   err=True)

    def relaunching(self, launch, reason):
        click.echo(f"run {launch.run_id}: {reason}", err=True)

    def restarting(self, launch, restart, max_restarts, reason, delay_s):
        click.secho(f"run {launch.run_id}: {reason}; restart {restart} of {max_restarts} in {delay_s:g}s "
                    f"(logs of the attempt that failed: {_shown(launch.log_dir)}/)", fg="yellow", err=True)

    def data_plane_down(self, launch, restart, broken, limit_s):
        shown = "; ".join(broken[:3]) + (f"; and {len(broken) - 3} more" if len(broken) > 3 else "")
        click.secho(f"run {launch.run_id}: restart {restart} waits for the data plane, up to {limit_s:g}s "
                    f"(--data-plane-wait): {shown}", fg="yellow", err=True)

    def data_plane_up(self, launch, restart, waited_s, limit_s):
        if waited_s is None:
            click.secho(f"run {launch.run_id}: the data plane still does not answer after {limit_s:g}s; restart "
                        f"{restart} launches all the same", fg="yellow", err=True)
        else:
            click.echo(f"run {launch.run_id}: the data plane answers again after {waited_s:.0f}s; restart {restart} "
                       "goes on", err=True)

    def spread(self, step, holder, hosts):
        click.echo(f"elastic: copied checkpoint {step} from {holder} to {', '.join(hosts)} (away while it was "
                   "written)", err=True)

    def reshaped(self, hosts, world, lost):
        gone = "; ".join(f"{name} ({why})" for name, why in lost.items()) or "none"
        click.secho(f"elastic: continuing on {world} rank(s) on {', '.join(hosts)}; left out: {gone}",
                    fg="yellow", err=True)

    def output(self, text, is_err):
        if self.panel is not None:
            self.panel.print(text)
        else:
            click.echo(text, err=is_err)

    def watching(self, launch, live):
        if self.live:
            from .panel import Panel      # imports rich: only when a panel is drawn
            with self.panel_lock:
                self.panel = Panel(live)
        if self.live_file:
            from ..observe.live import LiveFile
            self.snapshots = LiveFile(live, self.live_file).start()

    def watched(self, launch):
        with self.panel_lock:
            panel, self.panel = self.panel, None
            if panel is not None:
                panel.stop()
        snapshots, self.snapshots = self.snapshots, None
        if snapshots is not None:
            snapshots.stop()

    def host_flagged(self, event):
        """`clusterctl: h2 is swapping (memory pressure warn) since step 40`, and its end: above the panel when
        one is drawn, else on stderr."""
        with self.panel_lock:
            if self.panel is not None:
                self.panel.print(event.line())
                return
        click.secho(event.line(), fg="yellow" if event.event == "started" else None, err=True)

    def fetched(self, launch, host, remote_dir, files, nbytes):
        click.echo(f"run {launch.run_id}: copied {files} file(s), {size(nbytes)} from {host}:{remote_dir} "
                   f"into {launch.run_dir}", err=True)
        model = os.path.join(launch.run_dir, "model")
        adapters = os.path.join(launch.run_dir, "adapters")
        if os.path.isfile(os.path.join(model, "config.json")):       # the bundled trainer's --model export
            click.echo(f"run {launch.run_id}: the trained model is {model} (mlx_lm.generate --model "
                       f"{shlex.quote(model)})", err=True)
        elif os.path.isfile(os.path.join(adapters, "adapter_config.json")):     # an --adapter run's adapters
            base = _adapted_base(adapters)
            click.echo(f"run {launch.run_id}: the trained adapters are {adapters} (mlx_lm.generate --model "
                       f"{shlex.quote(base or 'BASE')} --adapter-path {shlex.quote(adapters)}; `clusterctl export "
                       f"{launch.run_id}` fuses them into a model)", err=True)

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


def panel_wanted(plain: bool) -> bool:
    """run's live panel is drawn only on a terminal: stdout and stderr both a tty, and no --plain."""
    return not plain and sys.stdout.isatty() and sys.stderr.isatty()


def _shown(path):
    """A local path as the user would type it: ./x below the current directory, else absolute."""
    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else os.path.join(".", rel)


# Options that name the launch itself, never a program's: a block of clusterctl options written after the
# program's arguments (mlx.launch style) is taken as clusterctl's only when it starts with one of these.
LAUNCH_ONLY = ("--hosts", "--fetch", "--fetch-all-ranks", "--launcher", "--launch-from", "--no-sync", "--no-fetch",
               "--no-preflight", "--rank0-only", "--plain", "--start-timeout", "--hang-timeout", "--stall-timeout",
               "--runs-dir", "--no-stdin", "--direct", "--env",
               "--max-restarts", "--restart-delay", "--elastic", "--elastic-batch")


@dataclass(frozen=True)
class RunWords:
    """`clusterctl run`'s command line, split: clusterctl's own words, the program (SCRIPT, or `-m` MODULE,
    or neither: the bundled trainer) and the program's arguments."""

    options: list[str]
    script: str | None
    module: str | None
    args: list[str]
    trailing: list[str]          # clusterctl options taken from the end of the line (a note says so)


def split_run_words(words: list[str], takes_value: dict[str, bool]) -> RunWords:
    """Split run's words (pure). Everything after SCRIPT or `-m MODULE` belongs to the program, as with
    `python -m` and torchrun; `clusterctl run [OPTIONS] -- ARGS` gives ARGS to the bundled trainer. Two
    older spellings still work: `SCRIPT [OPTIONS] -- ARGS` (the words between the program and `--` are all
    clusterctl options), and a block of clusterctl options at the very end of the line that starts with an
    option naming the launch (LAUNCH_ONLY: --hosts, --fetch, ...), which the caller reports as taken.
    `takes_value` maps each option spelling to whether it takes a value."""
    options, i = [], 0
    script = module = None
    while i < len(words):
        word = words[i]
        if word == "--":
            return RunWords(options, None, None, words[i + 1:], [])
        name, eq, _ = word.partition("=")
        if word in ("-m", "--module") and i + 1 < len(words):
            module, i = words[i + 1], i + 2
            break
        if name == "--module" and eq or word.startswith("-m") and len(word) > 2 and not word.startswith("--"):
            module, i = (word.split("=", 1)[1] if eq else word[2:]), i + 1
            break
        if not word.startswith("-") or word == "-":
            script, i = word, i + 1
            break
        options.append(word)
        if takes_value.get(name) and not eq and i + 1 < len(words):
            options.append(words[i + 1])
            i += 1
        i += 1
    rest = words[i:]
    if rest[:1] == ["--"]:
        return RunWords(options, script, module, rest[1:], [])
    if "--" in rest:
        k = rest.index("--")
        if k and _all_options(rest[:k], takes_value):
            return RunWords(options + rest[:k], script, module, rest[k + 1:], [])
    for start, word in enumerate(rest):
        if word.partition("=")[0] in LAUNCH_ONLY and _all_options(rest[start:], takes_value):
            return RunWords(options + rest[start:], script, module, rest[:start], rest[start:])
    return RunWords(options, script, module, rest, [])


def _all_options(words: list[str], takes_value: dict[str, bool]) -> bool:
    """Whether `words` are entirely clusterctl options, each with its value."""
    i = 0
    while i < len(words):
        name, eq, _ = words[i].partition("=")
        if name not in takes_value or name in ("-m", "--module"):
            return False
        i += 2 if takes_value[name] and not eq else 1
        if i > len(words):
            return False
    return True


# what a detached run's supervisor is not given of the run's own words (cli/launch.py supervisor_argv): what applies
# here only (the inventory's path, this machine's --env and stdin, the staging that happened here, the detach
# itself), each replaced by what the supervisor does instead (SUPERVISOR_WORDS)
HERE_ONLY = frozenset({"--hosts", "--env", "--runs-dir", "--data", "--all-shards", "--direct", "--no-sync",
                       "--no-stdin", "--plain", "--dry-run", "--detach", "--supervisor", "--handoff"})


def supervisor_argv(words: RunWords, takes_value: dict[str, bool], runs_dir: str) -> list[str]:
    """The words of `run` that the supervisor of this run, detached, runs with (pure): clusterctl's options less
    HERE_ONLY (in any spelling: --opt VALUE, --opt=VALUE), then its own (no copy: staged; no stdin; its runs
    directory; plain output, no terminal), then the program as given."""
    out, i, given = [], 0, words.options
    while i < len(given):
        word = given[i]
        name = word.split("=", 1)[0] if word.startswith("--") else word
        skip_value = takes_value.get(name, False) and "=" not in word
        if name in HERE_ONLY:
            i += 2 if skip_value else 1
            continue
        out.extend(given[i:i + (2 if skip_value else 1)])
        i += 2 if skip_value else 1
    out += ["--no-sync", "--no-stdin", "--plain", "--runs-dir", runs_dir]
    if words.module is not None:
        return [*out, "-m", words.module, *words.args]
    if words.script is not None:
        return [*out, words.script, *words.args]
    return [*out, "--", *words.args]


class RunCommand(click.Command):
    """`run`'s parser: split_run_words decides what is clusterctl's and what is the program's; click then
    parses clusterctl's options alone, and the program's words arrive untouched."""

    def collect_usage_pieces(self, ctx):
        return ["[OPTIONS]", "[SCRIPT | -m MODULE] [ARGS]..."]

    def takes_value(self) -> dict[str, bool]:
        """Every spelling of run's options -> whether it takes a value (what split_run_words needs)."""
        return {opt: not param.is_flag and not param.count for param in self.params
                if isinstance(param, click.Option) for opt in (*param.opts, *param.secondary_opts)}

    def parse_args(self, ctx, args):
        words = split_run_words(list(args), self.takes_value())
        ctx.meta["clusterctl.run"] = words
        return super().parse_args(ctx, [*words.options, "--"])


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
@click.option("--start-timeout", type=float, metavar="S", help="Abort if some rank has not started after S seconds.")
@click.option("--hang-timeout", type=float, metavar="S",
              help="Abort if a rank is silent (no output, no heartbeat) for S seconds.")
@click.option("--stall-timeout", type=click.FloatRange(min=0), metavar="S",
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
@click.option("--restart-delay", type=click.FloatRange(min=0), default=10.0, show_default=True, metavar="S",
              help="Seconds between an attempt's end and the next one's pre-flight.")
@click.option("--data-plane-wait", type=click.FloatRange(min=0), default=DATA_PLANE_WAIT_S, show_default=True,
              metavar="S", help="After an attempt that failed because its hosts could not reach each other (the "
                                "link between them dropped), the restart waits up to S seconds for every host to reach "
                                "the others again before it launches; 0: launch at once.")
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
            fetch_all_ranks, data_dir, all_shards, env_words, direct, max_restarts, restart_delay, data_plane_wait, elastic,
            elastic_batch, detach, supervisor_host, handoff_path):
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
    from ..launch.attempts import AttemptSettings
    from ..launch.restart import RestartPolicy
    from ..launch.outcome import AttemptState
    from ..launch.stall import StallPolicy
    from ..launch.supervise import Settings
    from ..run import RunOptions, parse_env_options, run
    from ..train.config import file_settings
    from ..train.prelaunch import check_before_launch
    from ..train.strategies import shrink_refusal
    from ..trainer_program import BundledTrainer

    words: RunWords = click.get_current_context().meta["clusterctl.run"]
    if words.trailing:
        click.echo(f"note: took {' '.join(words.trailing)} from the end of the line as clusterctl's options "
                   "(write `--` after the program to pass them to it)", err=True)
    # -m is taken by split_run_words (click's --module only documents it), so the module is the split's
    script, args, module = words.script, words.args, words.module
    attempts = AttemptSettings(runs_dir=runs_dir, launch_from=launch_from, dry_run=dry_run, preflight=not no_preflight,
                               restart=RestartPolicy(max_restarts, restart_delay, elastic, elastic_batch,
                                                     data_plane_wait),
                               watch=Settings(rank0_only=rank0_only, start_timeout=start_timeout,
                                              hang_timeout=hang_timeout, stall=StallPolicy.parse(stall_timeout)))
    options = RunOptions(script=script, args=tuple(args), module=module, backend=backend, launcher=launcher,
                         attempts=attempts, connect_timeout=connect_timeout, sync=not no_sync, fetch=not no_fetch,
                         fetch_paths=tuple(fetch_paths), fetch_all_ranks=fetch_all_ranks, data_dir=data_dir,
                         all_shards=all_shards, direct_model=direct, env=parse_env_options(env_words, os.environ),
                         stdin=None if no_stdin or sys.stdin is None else sys.stdin.buffer,
                         # the bundled trainer's checks before a launch are the trainer's own (run imports no train/)
                         kinds=(BundledTrainer(prelaunch=check_before_launch, strategy_shrink=shrink_refusal,
                                               settings_file=file_settings),))
    if supervisor_host and not detach:
        raise click.UsageError("--supervisor says where a detached run's supervisor goes: give --detach too")
    if detach:
        _detach(words, options, inventory_path, supervisor_host, fetch_paths, data_dir, elastic)
        return
    cluster = app.load(inventory_path) if inventory_path else None
    events = PrintedRun(live=panel_wanted(plain))
    if handoff_path:        # a detached run's supervisor, on its host (clusterctl/detach/supervisor.py)
        from ..detach import handoff
        from ..detach.supervisor import LIVE_FILE
        from ..run import Staged
        handed = handoff.read(handoff_path)
        os.unlink(handoff_path)        # it holds the inventory's env values: read once, kept nowhere
        cluster = handed.cluster
        options = replace(options, staged=Staged(handed.extra_env, handed.host_env),
                          attempts=replace(attempts, run_id=handed.run_id))
        events = PrintedRun(live=False, live_file=os.path.join(os.path.dirname(handoff_path), LIVE_FILE))
    result = run(cluster, options, events)
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


def print_tail(launch, outcome) -> None:
    """The failing rank's last lines (run's and serve's failure screens)."""
    if outcome.failed_rank is not None and outcome.tail:
        click.echo(f"last lines of {os.path.join(launch.log_dir, f'rank-{outcome.failed_rank}.log')}:", err=True)
        for line in outcome.tail:
            click.echo(f"  {line}", err=True)


def _adapted_base(adapters: str) -> str | None:
    """The --model an adapter run adapted, as its adapter_config.json records it (relative to the project)."""
    import json
    try:
        with open(os.path.join(adapters, "adapter_config.json"), encoding="utf-8") as f:
            model = json.load(f).get("model")
    except (OSError, ValueError):
        return None
    return model if isinstance(model, str) else None
