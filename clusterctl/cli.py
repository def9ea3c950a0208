"""The command line. Only this module imports click: it parses, calls the core, and prints.

Exit codes: 0 success; 1 a command failed on some host (or an internal error); 2 bad input (usage,
malformed inventory); 3 could not connect; 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import traceback

import click

from . import __version__
from .atomic import write_text
from .errors import ClusterctlError

EXAMPLES: dict[str, str] = {}
EXIT_INTERRUPTED = 130


class _Group(click.Group):
    """Lists every command with its one-line summary and an example."""

    def format_commands(self, ctx, formatter):
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            rows.append((name, cmd.get_short_help_str(limit=70)))
            if name in EXAMPLES:
                rows.append(("", f"e.g. {EXAMPLES[name]}"))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def command(example: str, **kwargs):
    """Register a command with an example for `clusterctl --help`."""
    def decorate(fn):
        EXAMPLES[fn.__name__.replace("_cmd", "").replace("_", "-")] = example
        return cli.command(name=fn.__name__.replace("_cmd", "").replace("_", "-"), **kwargs)(fn)
    return decorate


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="clusterctl", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show Python tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx, debug):
    """clusterctl: turn a handful of Macs (and Linux boxes) into an MLX training cluster.

    Every command that talks to hosts takes --hosts INVENTORY (a YAML file; see README.md).
    """
    ctx.obj = {"debug": debug}


hosts_option = click.option("--hosts", "inventory_path", required=True, type=click.Path(dir_okay=False),
                            metavar="INVENTORY", help="The inventory YAML file.")


def _load(inventory_path: str):
    from .inventory import load
    return load(inventory_path)


# ---- hosts ------------------------------------------------------------------------------------

@command("clusterctl hosts --hosts inventory.yaml")
@hosts_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of a table.")
def hosts_cmd(inventory_path, as_json):
    """Show the resolved hosts: inventory + defaults + ~/.ssh/config."""
    from .sshconfig import resolve_cluster

    cluster = _load(inventory_path)
    targets = resolve_cluster(cluster)
    rows = []
    for h in cluster.hosts:
        t = targets[h.name]
        ranks = str(h.rank) if h.slots == 1 else f"{h.ranks.start}-{h.ranks.stop - 1}"
        rows.append({
            "ranks": ranks, "name": h.name,
            "connect": "(local)" if h.local else f"{t.hostname}:{t.port}",
            "user": t.user, "address": h.address or "", "python": h.python, "workdir": h.workdir,
            "identity_file": "" if h.local else (next((p for p in t.identity_files if os.path.isfile(p)), "")),
            "env": h.env_dict,
        })
    if as_json:
        click.echo(json.dumps({"inventory": cluster.path, "world_size": cluster.world_size,
                               "backend": cluster.launch.backend, "hosts": rows}, indent=2))
        return
    columns = ["ranks", "name", "connect", "user", "address", "python", "workdir"]
    _table(rows, columns)
    click.echo(f"{len(cluster.hosts)} hosts, world size {cluster.world_size}, backend {cluster.launch.backend}")


def _table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in columns}
    click.echo("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for r in rows:
        click.echo("  ".join(str(r[c]).ljust(widths[c]) for c in columns).rstrip())


# ---- exec -------------------------------------------------------------------------------------

@command("clusterctl exec --hosts inventory.yaml -- uname -a")
@hosts_option
@click.option("--sh", "script", metavar="SCRIPT", help="Run this shell script instead of a command.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds the command may run per host.")
@click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to wait for SSH.")
@click.option("--cwd", metavar="DIR", help="Working directory on each host (~ is the host's home).")
@click.option("--strict-host-keys", is_flag=True, help="Refuse hosts whose key is not in known_hosts yet.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def exec_cmd(inventory_path, script, timeout, connect_timeout, cwd, strict_host_keys, as_json, argv):
    """Run a command on every host in parallel and show each host's output."""
    from .remote import Connector

    if bool(script) == bool(argv):
        raise click.UsageError("give either a command after -- or --sh SCRIPT")
    cluster = _load(inventory_path)
    connector = Connector(cluster, "strict" if strict_host_keys else None, connect_timeout)
    group = connector.run_everywhere(script or list(argv), timeout, cwd=cwd)
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "hosts": [_outcome_json(o) for o in group.values()]},
                              indent=2))
    else:
        for outcome in group.values():
            _print_outcome(outcome)
        failed = len(group.failed)
        click.echo(f"{len(group) - failed} ok, {failed} failed", err=True)
    sys.exit(0 if group.all_ok else 1)


def _outcome_json(o) -> dict:
    r = o.value
    return {"host": o.host.name, "rank": o.host.rank, "ok": o.ok, "elapsed_s": round(o.elapsed_s, 3),
            "exit_code": getattr(r, "exit_code", None), "stdout": getattr(r, "stdout", ""),
            "stderr": getattr(r, "stderr", ""), "error": str(o.error) if o.error else None}


def _print_outcome(o) -> None:
    prefix = f"[{o.host.rank} {o.host.name}]"
    if o.error is not None:
        click.secho(f"{prefix} error: {_one_line(o.error)}", fg="red", err=True)
        return
    for line in o.value.stdout.splitlines():
        click.echo(f"{prefix} {line}")
    for line in o.value.stderr.splitlines():
        click.echo(f"{prefix} {line}", err=True)
    if not o.value.ok:
        click.secho(f"{prefix} exited {o.value.exit_code}", fg="red", err=True)


def _one_line(error: BaseException) -> str:
    text = str(error)
    # ConnectError / CommandTimeout already name the host; the prefix does too.
    host = getattr(error, "host", None)
    if host and text.startswith(f"{host}: "):
        text = text[len(host) + 2:]
    return " ".join(text.split())


# ---- doctor -----------------------------------------------------------------------------------

@command("clusterctl doctor --hosts inventory.yaml")
@hosts_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the table.")
@click.option("--deep/--no-deep", default=None,
              help="Launch a real MLX all_sum over mpirun (and mlx.launch for ring). Default: on when this "
                   "machine has mpirun, or the hosts have addresses.")
@click.option("--connect-timeout", default=5.0, show_default=True, help="Seconds to wait for any SSH connection.")
@click.option("--smoke-timeout", default=90.0, show_default=True, help="Seconds the smoke tests may take.")
@click.option("--strict-host-keys", is_flag=True, help="Refuse hosts whose key is not in known_hosts yet.")
def doctor_cmd(inventory_path, as_json, deep, connect_timeout, smoke_timeout, strict_host_keys):
    """Check SSH all-to-all, PATH, MPI and the data plane of a cluster."""
    from .doctor import DoctorOptions, run_doctor
    from .doctor.report import render_table

    cluster = _load(inventory_path)
    report = run_doctor(cluster, DoctorOptions(connect_timeout=connect_timeout, deep=deep,
                                               host_key_checking="strict" if strict_host_keys else None,
                                               smoke_timeout=smoke_timeout))
    if as_json:
        click.echo(report.to_json())
    else:
        click.echo(render_table(report, colour=sys.stdout.isatty()))
    sys.exit(0 if report.ok else 1)


# ---- hostfile ---------------------------------------------------------------------------------

@command("clusterctl hostfile --hosts inventory.yaml -o hosts.txt --print-command -- /path/train.py")
@hosts_option
@click.option("--format", "fmt", type=click.Choice(["openmpi", "mpich", "mlx"]), default="openmpi",
              show_default=True, help="openmpi: `host slots=N`; mpich: `host:N`; mlx: mlx.launch's JSON.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here (default: standard output).")
@click.option("--template", type=click.Path(exists=True, dir_okay=False), help="Your own template (see templates/).")
@click.option("--print-command", is_flag=True,
              help="Also print the mpirun (or mlx.launch) line for SCRIPT, with the environment and tuning "
                   "`run` would use (asks every host over SSH where libmpi is).")
@click.option("--connect-timeout", default=5.0, show_default=True, help="Seconds to wait for SSH.")
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def hostfile_cmd(inventory_path, fmt, output, template, print_command, connect_timeout, program):
    """Write an Open MPI, MPICH or mlx.launch hostfile (and the launch line)."""
    import shlex

    from .hostfile import render

    if print_command and not program:
        raise click.UsageError("--print-command needs the script: ... --print-command -- SCRIPT [ARGS]")
    if program and not print_command:
        raise click.UsageError("a script is only used with --print-command")
    if print_command and not output:
        raise click.UsageError("--print-command needs -o FILE: the printed command refers to the hostfile")
    if print_command and fmt == "mpich":
        raise click.UsageError("MLX's mpi backend needs Open MPI: --print-command works with openmpi or mlx")
    cluster = _load(inventory_path)
    plan = None
    if print_command:
        from .plan import discover
        from .remote import Connector
        plan = discover(Connector(cluster, connect_timeout=connect_timeout))
    text_template = None
    if template:
        with open(template, encoding="utf-8") as f:
            text_template = f.read()
    backend = cluster.launch.backend if cluster.launch.backend != "mpi" else "ring"
    text = render(cluster, fmt, text_template, backend=backend, env=plan.env if plan else cluster.hosts[0].env_dict,
                  template_name=template or fmt)
    if output:
        write_text(output, text)
    else:
        click.echo(text, nl=False)
    if print_command:
        from .launch import mlx_launch_argv, mpirun_argv
        from .sshconfig import rsh_agent

        python = cluster.hosts[0].python
        if fmt == "openmpi":
            argv = mpirun_argv(cluster, hostfile=os.path.abspath(output), program=[python, *program], env=plan.env,
                               rsh_agent=rsh_agent(cluster, connect_timeout=connect_timeout),
                               if_include=plan.if_include, as_root=os.geteuid() == 0)
            click.echo(shlex.join(argv))
        else:
            import shutil

            from .launch import find_mlx_launch, write_ssh_shim
            from .sshconfig import openssh_options

            ssh = shutil.which("ssh")
            if ssh is None:
                raise click.UsageError("mlx.launch needs the OpenSSH client (ssh) on this machine")
            shim_dir = write_ssh_shim(os.path.abspath(output) + ".ssh", ssh,
                                      openssh_options(cluster, connect_timeout=connect_timeout))

            launcher = find_mlx_launch()
            if launcher is None:
                raise click.UsageError("mlx.launch is not installed on this machine (pip install mlx)")
            argv = mlx_launch_argv(cluster, hostfile=os.path.abspath(output), backend=backend, python=python,
                                   program=list(program), env={}, launcher=launcher)
            click.echo(f'PATH={shlex.quote(shim_dir)}:"$PATH" {shlex.join(argv)}')


# ---- run --------------------------------------------------------------------------------------

@command("clusterctl run train.py --hosts inventory.yaml -- --lr 3e-4")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
              help="The inventory. Default: this machine, 2 ranks, ring backend.")
@click.option("--backend", type=click.Choice(["mpi", "ring", "jaccl"]), help="Default: the inventory's launch.backend.")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; launch nothing.")
@click.option("--no-preflight", is_flag=True, help="Skip checking SSH, python and the script on every host first.")
@click.option("--rank0-only", is_flag=True, help="Show only rank 0's output (every rank is still logged).")
@click.option("--start-timeout", type=float, metavar="S", help="Abort if some rank has not started after S seconds.")
@click.option("--hang-timeout", type=float, metavar="S", help="Abort if a rank is silent (no output, no heartbeat) for S seconds.")
@click.option("--runs-dir", default="runs", show_default=True, help="Where runs/<id>/ (logs, launch.json) go.")
@click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to wait for SSH.")
@click.option("--launch-from", type=click.Choice(["auto", "here", "first-host"]), default="auto", show_default=True,
              help="Where mpirun / mlx.launch runs. auto: here when it is installed here, else the first host.")
def run_cmd(script, args, inventory_path, backend, dry_run, no_preflight, rank0_only, start_timeout, hang_timeout,
            runs_dir, connect_timeout, launch_from):
    """Launch SCRIPT over mpirun or mlx.launch and supervise every rank."""
    from .launch import find_mlx_launch
    from .inventory import parse
    from .plan import LaunchPlan, discover
    from .remote import Connector
    from .supervise import prepare, supervise

    if inventory_path:
        cluster = _load(inventory_path)
    else:
        cluster = parse("hosts: [{name: localhost, local: true, slots: 2}]\nlaunch: {backend: ring}\n",
                        "(this machine)", base_dir=os.getcwd())
    backend = backend or cluster.launch.backend
    connector = Connector(cluster, connect_timeout=connect_timeout)
    if no_preflight or dry_run:
        plan = LaunchPlan(dict(cluster.hosts[0].env_dict), cluster.mpi.if_include)
    else:
        plan = discover(connector, script=script)
    import shutil

    launcher = find_mlx_launch() if backend != "mpi" else None
    here = shutil.which("mpirun") is not None if backend == "mpi" else launcher is not None
    not_here = "mpirun is not installed here" if backend == "mpi" else "mlx.launch is not installed here (pip install mlx)"
    if launch_from == "here" and not here:
        raise click.UsageError(not_here)
    remote = None
    if launch_from == "first-host" or not here:
        # No launcher on this machine: run it on the first host, which has one if doctor passes there.
        if cluster.hosts[0].local:
            raise click.UsageError(not_here)
        remote = connector.transport(cluster.hosts[0])
        click.echo(f"launching {'mpirun' if backend == 'mpi' else 'mlx.launch'} from {cluster.hosts[0].name}",
                   err=True)
    launch = prepare(cluster, plan, script=script, args=list(args), backend=backend, runs_root=runs_dir,
                     connect_timeout=connect_timeout, launcher=launcher, remote=remote)
    if dry_run:
        click.echo(json.dumps(launch.describe(), indent=2))
        return
    click.echo(f"run {launch.run_id}: {cluster.world_size} ranks over {backend}; logs in {launch.run_dir}", err=True)
    outcome = supervise(launch, connector, emit=lambda text, err: click.echo(text, err=err), rank0_only=rank0_only,
                        start_timeout=start_timeout, hang_timeout=hang_timeout)
    if outcome.exit_code == 0:
        click.echo(f"run {launch.run_id}: {outcome.reason}", err=True)
        return
    click.secho(f"run {launch.run_id} failed: {outcome.reason}", fg="red", err=True)
    if outcome.failed_rank is not None:
        log = os.path.join(launch.run_dir, f"rank-{outcome.failed_rank}.log")
        if outcome.tail:
            click.echo(f"last lines of {log}:", err=True)
            for line in outcome.tail:
                click.echo(f"  {line}", err=True)
    sys.exit(outcome.exit_code if 0 < outcome.exit_code < 256 else 1)


# ---- init -------------------------------------------------------------------------------------

@command("clusterctl init studio-1 studio-2 --user alice -o inventory.yaml")
@click.argument("names", nargs=-1, required=True)
@click.option("-o", "--output", default="inventory.yaml", show_default=True, type=click.Path(dir_okay=False))
@click.option("--user", help="SSH user on every host (default: from ~/.ssh/config or your user name).")
@click.option("--python", default="python3", show_default=True, help="Python with mlx on every host.")
@click.option("--workdir", default="~/clusterctl", show_default=True, help="Where code and data land.")
@click.option("--address", "addresses", multiple=True, metavar="IP",
              help="Data-plane IPv4 per host, in the same order as the names (repeat the option).")
@click.option("--backend", type=click.Choice(["mpi", "ring", "jaccl"]), default="mpi", show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init_cmd(names, output, user, python, workdir, addresses, backend, force):
    """Write a starter inventory for the given hosts."""
    from .inventory import parse
    from .resources import render, template_text

    if addresses and len(addresses) != len(names):
        raise click.UsageError(f"{len(addresses)} --address values for {len(names)} hosts")
    if os.path.exists(output) and not force:
        raise click.UsageError(f"{output} exists; pass --force to overwrite it")
    q = json.dumps   # a JSON string is a valid YAML scalar: names and paths stay literal
    defaults = [f"  python: {q(python)}", f"  workdir: {q(workdir)}"]
    if user:
        defaults.insert(0, f"  user: {q(user)}")
    host_lines = []
    for i, name in enumerate(names):
        host_lines.append(f"  - name: {q(name)}")
        if addresses:
            host_lines.append(f"    address: {q(addresses[i])}")
    text = render(template_text("inventory.yaml.tmpl"), date=datetime.date.today().isoformat(),
                  defaults="\n".join(defaults), hosts="\n".join(host_lines), backend=backend)
    parse(text, output)   # never write an inventory we would refuse to read
    write_text(output, text)
    click.echo(f"wrote {output} ({len(names)} hosts); check it with: clusterctl hosts --hosts {output}")


# ---- generate -----------------------------------------------------------------------------------

@command('clusterctl generate --checkpoint runs/train-1 --prompt "Once upon a time"')
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(exists=True, file_okay=False),
              metavar="DIR", help="A run directory, its checkpoints/ or one step-N directory (latest wins).")
@click.option("--prompt", default="", help="Text to continue (default: start a new document).")
@click.option("--max-tokens", default=200, show_default=True, help="Tokens to generate at most.")
@click.option("--temperature", default=0.8, show_default=True, help="Sampling temperature; 0 is greedy.")
@click.option("--top-k", default=0, show_default=True, help="Sample from the k likeliest tokens (0: all).")
@click.option("--seed", default=0, show_default=True, help="Sampling seed.")
def generate_cmd(checkpoint_dir, prompt, max_tokens, temperature, top_k, seed):
    """Sample text from a checkpoint of the bundled trainer."""
    from .train.generate import generate_text

    pieces = generate_text(checkpoint_dir, prompt, max_tokens, temperature, seed, top_k)
    click.echo(prompt, nl=False)
    for piece in pieces:
        click.echo(piece, nl=False)
    click.echo()


# ---- data -------------------------------------------------------------------------------------

@command("clusterctl data prepare corpus.jsonl --world 4 --out data/", cls=click.Group)
def data_cmd():
    """Dataset shards: tokenize a corpus into one shard per rank."""


@data_cmd.command("prepare")
@click.argument("source")
@click.option("--world", type=int, required=True, metavar="N", help="Number of ranks: one shard each.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Directory for the shards, val.bin and manifest.json (replaced if it holds a dataset).")
@click.option("--tokenizer", default="byte", show_default=True, metavar="byte|PATH",
              help="byte (no downloads) or a local Hugging Face tokenizer.json (needs `tokenizers`).")
@click.option("--val-fraction", default=0.01, show_default=True, type=float,
              help="Share of documents held out in val.bin (every 1/F-th document).")
@click.option("--json", "as_json", is_flag=True, help="Print manifest.json instead of a summary.")
def data_prepare_cmd(source, world, out_dir, tokenizer, val_fraction, as_json):
    """Tokenize SOURCE once into N equal shards plus manifest.json.

    SOURCE: `embedded` (the built-in stories; `embedded:COUNT[:SEED]`), a .txt file (documents separated
    by blank lines), a .jsonl file ("text" field), a directory of those, or hf:NAME[:SPLIT] (a dataset
    already in the local Hugging Face cache; needs `datasets`).
    """
    import time

    from .data.shards import prepare

    bars = _ProgressBars() if sys.stderr.isatty() and not as_json else None
    start = time.monotonic()
    try:
        manifest = prepare(source, world, out_dir, tokenizer=tokenizer, val_fraction=val_fraction, progress=bars)
    finally:
        if bars:
            bars.close()
    elapsed = time.monotonic() - start
    if as_json:
        click.echo(manifest.to_json(), nl=False)
        return
    total = manifest.tokens_per_shard * manifest.world_size + manifest.dropped_tokens + manifest.val.tokens
    click.echo(f"{out_dir}: {manifest.world_size} shards of {manifest.tokens_per_shard:,} {manifest.dtype} tokens "
               f"({manifest.tokenizer['type']} tokenizer, vocab {manifest.vocab_size}), val.bin "
               f"{manifest.val.tokens:,} tokens, {manifest.dropped_tokens:,} dropped")
    click.echo(f"{total:,} tokens in {elapsed:.1f} s ({total / max(elapsed, 1e-9):,.0f} tokens/s)")


class _ProgressBars:
    """prepare()'s progress callback as click progress bars on stderr, one per phase."""

    LABELS = {"tokenize": "tokenizing", "write": "writing shards"}

    def __init__(self):
        self.phase, self.bar, self.done = None, None, 0

    def __call__(self, phase, done, total):
        if phase != self.phase:
            self.close()
            self.phase, self.done = phase, 0
            self.bar = click.progressbar(length=total, label=self.LABELS.get(phase, phase), file=sys.stderr)
            self.bar.__enter__()
        self.bar.update(done - self.done)
        self.done = done

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


# ---- entry point ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        cli.main(args=args, prog_name="clusterctl", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except ClusterctlError as e:
        if debug:
            raise
        click.secho(f"error: {e}", fg="red", err=True)
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - the one place unexpected errors become one line + a log
        if debug:
            raise
        log = _write_debug_log()
        click.secho(f"internal error: {type(e).__name__}: {e} (traceback in {log}; rerun with --debug)",
                    fg="red", err=True)
        sys.exit(1)


def _write_debug_log() -> str:
    directory = os.path.join(os.path.expanduser("~"), ".cache", "clusterctl")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        directory = tempfile.gettempdir()
    path = os.path.join(directory, "debug.log")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"--- {datetime.datetime.now().isoformat()} clusterctl {__version__} {sys.argv}\n")
        f.write(traceback.format_exc())
    return path


