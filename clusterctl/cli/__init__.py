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

from ..atomic import write_text
from ..errors import ClusterctlError

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
@click.version_option(None, "--version", package_name="clusterctl", prog_name="clusterctl",
                      message="%(prog)s %(version)s")
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
    from ..inventory import load
    return load(inventory_path)


# ---- hosts ------------------------------------------------------------------------------------

@command("clusterctl hosts --hosts inventory.yaml")
@hosts_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of a table.")
def hosts_cmd(inventory_path, as_json):
    """Show the resolved hosts: inventory + defaults + ~/.ssh/config."""
    from ..hosts.sshconfig import resolve_cluster

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
    from ..hosts.connector import Connector

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
    from ..doctor import DoctorOptions, run_doctor
    from ..doctor.report import render_table

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

    from ..launch.hostfile import render

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
        from ..launch.plan import discover
        from ..hosts.connector import Connector
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
        from ..launch.backends import mlx_launch_argv, mpirun_argv
        from ..hosts.sshconfig import rsh_agent

        python = cluster.hosts[0].python
        if fmt == "openmpi":
            argv = mpirun_argv(cluster, hostfile=os.path.abspath(output), program=[python, *program], env=plan.env,
                               rsh_agent=rsh_agent(cluster, connect_timeout=connect_timeout),
                               if_include=plan.if_include, as_root=os.geteuid() == 0)
            click.echo(shlex.join(argv))
        else:
            import shutil

            from ..launch.backends import find_mlx_launch, write_ssh_shim
            from ..hosts.sshconfig import openssh_options

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
@click.argument("script", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("-m", "--module", metavar="MODULE",
              help="Run this Python module on every rank (python -m MODULE). Default without SCRIPT: the "
                   "bundled trainer, clusterctl.train.")
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
@click.option("--no-sync", is_flag=True,
              help="Do not copy the current directory (the project) and clusterctl to the hosts first.")
@click.option("--no-fetch", is_flag=True,
              help="Leave what the job wrote in its run directory on the first host (default: copy it here).")
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False), metavar="DIR",
              help="Shards from `clusterctl data prepare`: host i gets only its own; ranks find them in "
                   "CLUSTERCTL_DATA_DIR (the bundled trainer reads them).")
def run_cmd(script, args, module, inventory_path, backend, dry_run, no_preflight, rank0_only, start_timeout,
            hang_timeout, runs_dir, connect_timeout, launch_from, no_sync, no_fetch, data_dir):
    """Run SCRIPT (or the bundled trainer) on every rank, supervised."""
    from ..hosts.fanout import in_background
    from ..launch.backends import find_mlx_launch
    from ..inventory import parse
    from ..launch.plan import LaunchPlan, cached_plan, discover, remember_plan
    from ..hosts.connector import Connector
    from ..launch.supervise import prepare, supervise

    if script is not None and script.startswith("-"):
        args, script = (script, *args), None     # `run -- --steps 100`: arguments for the default program
    if script is not None and module:
        raise click.UsageError("give a SCRIPT or --module, not both")
    if script is None:
        module = module or "clusterctl.train"
        program, program_args = "-m", [module, *args]
    else:
        program, program_args = script, list(args)
    if inventory_path:
        cluster = _load(inventory_path)
    else:
        # this machine, working where run was started: a relative SCRIPT is the one here
        cluster = parse(f"hosts: [{{name: localhost, local: true, slots: 2, workdir: {json.dumps(os.getcwd())}}}]\n"
                        "launch: {backend: ring}\n", "(this machine)", base_dir=os.getcwd())
    backend = backend or cluster.launch.backend
    extra_env = {}
    if not dry_run:
        extra_env = _stage(cluster, no_sync=no_sync, bundled=module is not None and module.startswith("clusterctl."),
                           data_dir=data_dir, connect_timeout=connect_timeout)
        if data_dir and module == "clusterctl.train":
            program_args = [program_args[0], "--data", extra_env["CLUSTERCTL_DATA_DIR"], *program_args[1:]]
    connector = Connector(cluster, connect_timeout=connect_timeout)
    preflight = None
    if no_preflight:
        plan = LaunchPlan(dict(cluster.hosts[0].env_dict), cluster.mpi.if_include)
    elif dry_run:
        plan = cached_plan(cluster) or discover(connector)
    else:
        plan = cached_plan(cluster)
        verify = lambda: discover(connector, script=script, module=module)   # noqa: E731
        if plan is None:
            plan = verify()
            remember_plan(cluster, plan)
        else:
            # Launch at once from the plan the last verified launch used; the pre-flight checks it meanwhile
            # and stops the job with the failing host named, or launches again if the hosts changed.
            preflight = in_background(verify)
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
    while True:
        launch = prepare(cluster, plan, script=program, args=program_args, backend=backend, runs_root=runs_dir,
                         connect_timeout=connect_timeout, launcher=launcher, remote=remote, extra_env=extra_env)
        if dry_run:
            click.echo(json.dumps(launch.describe(), indent=2))
            return
        what = module if script is None else script
        click.echo(f"run {launch.run_id}: {what} on {cluster.world_size} ranks over {backend}; "
                   f"logs in {launch.run_dir}", err=True)
        outcome = supervise(launch, connector, emit=lambda text, err: click.echo(text, err=err),
                            rank0_only=rank0_only, start_timeout=start_timeout, hang_timeout=hang_timeout,
                            preflight=preflight, plan=plan)
        if outcome.replan is None:
            break
        click.echo(f"run {launch.run_id}: {outcome.reason}", err=True)
        plan, preflight = outcome.replan, None
        remember_plan(cluster, plan)
    if preflight is not None and preflight.exception() is None:   # waits for it: a short, bounded probe
        remember_plan(cluster, preflight.result())
    if not no_fetch and not cluster.hosts[0].local:
        _fetch(connector, launch)
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


def _fetch(connector, launch) -> None:
    """Bring home what the job left in its run directory on the first host (checkpoints, metrics)."""
    from paramiko import SSHException

    from ..transfer.stage import fetch_run_dir

    host = connector.cluster.hosts[0]
    try:
        files, size = fetch_run_dir(connector, launch.run_id, launch.run_dir)
    except (OSError, ClusterctlError, SSHException) as e:
        click.secho(f"run {launch.run_id}: could not copy {host.workdir}/runs/{launch.run_id}/ from {host.name} "
                    f"({_one_line(e)}); it is still there", fg="yellow", err=True)
        return
    if files:
        click.echo(f"run {launch.run_id}: copied {files} file(s), {_size(size)} from {host.name}:"
                   f"{host.workdir}/runs/{launch.run_id}/ into {launch.run_dir}", err=True)


def _stage(cluster, *, no_sync: bool, bundled: bool, data_dir: str | None, connect_timeout: float) -> dict:
    """Copy what the job needs to the hosts before launching, the project, clusterctl and the shards at
    once (they are independent); returns the ranks' extra environment."""
    from concurrent.futures import wait

    from ..hosts.fanout import in_background
    from ..transfer.stage import ship_clusterctl, stage_data, stage_project

    jobs = {}
    if not no_sync:
        jobs["project"] = in_background(stage_project, cluster, os.getcwd(), connect_timeout=connect_timeout)
        if bundled:
            jobs["clusterctl"] = in_background(ship_clusterctl, cluster, connect_timeout=connect_timeout)
    if data_dir:
        jobs["data"] = in_background(stage_data, cluster, data_dir, connect_timeout=connect_timeout)
    wait(jobs.values())
    for future in jobs.values():      # the first failure, after every copy has ended
        future.result()
    for what in ("project", "clusterctl"):
        group = jobs[what].result() if what in jobs else None
        if group is not None:
            moved = sum(len(o.value.moved) for o in group.values())
            size = sum(o.value.moved_bytes for o in group.values())
            click.echo(f"sync: {what} to {len(group)} host(s): {moved} file(s), {_size(size)} moved in all", err=True)
    return {"CLUSTERCTL_DATA_DIR": jobs["data"].result()} if "data" in jobs else {}


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
    from ..inventory import parse
    from ..resources import render, template_text

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
    from ..train.generate import generate_text

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

    from ..data.shards import prepare

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


# ---- sync, data push -------------------------------------------------------------------------

@command("clusterctl sync . --hosts inventory.yaml --exclude '*.ckpt'")
@click.argument("path", default=".")
@hosts_option
@click.option("--exclude", "excludes", multiple=True, metavar="PATTERN",
              help="Do not ship files matching PATTERN (gitignore syntax, relative to PATH; repeatable).")
@click.option("--delete", is_flag=True, help="Remove files on the hosts that PATH no longer has.")
@click.option("--dry-run", is_flag=True, help="Show what would move (and be deleted); move nothing.")
@click.option("--dest", metavar="DIR", help="Sync into DIR inside each host's workdir instead of the workdir.")
@click.option("--method", type=click.Choice(["auto", "rsync", "sftp"]), default="auto", show_default=True,
              help="auto: rsync over ssh where both ends have it, else SFTP.")
@click.option("--checksum", is_flag=True,
              help="Compare content, not size and mtime: a touched but unchanged file is not sent.")
@click.option("--bwlimit", type=click.IntRange(1), metavar="KBPS", help="Limit each host's transfer to KBPS KiB/s.")
@click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to wait for SSH.")
@click.option("--timeout", default=3600.0, show_default=True, help="Seconds a host's whole transfer may take.")
@click.option("--strict-host-keys", is_flag=True, help="Refuse hosts whose key is not in known_hosts yet.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the table.")
def sync_cmd(path, inventory_path, excludes, delete, dry_run, dest, method, checksum, bwlimit, connect_timeout,
             timeout, strict_host_keys, as_json):
    """Mirror a project directory into every host's workdir."""
    from ..transfer.sync import SyncOptions, plan_sync, sync_tree

    cluster = _load(inventory_path)
    options = SyncOptions(excludes=tuple(excludes), delete=delete, dry_run=dry_run, dest=dest, method=method,
                          checksum=checksum, bwlimit_kbps=bwlimit, connect_timeout=connect_timeout, timeout=timeout,
                          host_key_checking="strict" if strict_host_keys else None)
    plan = plan_sync(path, options)
    bars = _Bars([h.name for h in cluster.hosts]) if sys.stdout.isatty() and not as_json else None
    group = sync_tree(cluster, plan, options, progress=bars.update if bars else None)
    if bars:
        bars.close()
    rows = []
    for o in group.values():
        r = o.value
        row = {"host": o.host.name, "rank": o.host.rank, "ok": o.ok, "error": _one_line(o.error) if o.error else None}
        if r is not None:
            row.update(method=r.method, dest=r.dest, files=len(r.moved), bytes=r.moved_bytes, wire_bytes=r.wire_bytes,
                       deleted=len(r.deleted), elapsed_s=round(r.elapsed_s, 3), note=r.note,
                       moved=r.moved, deleted_files=r.deleted)
        rows.append(row)
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "root": plan.root, "selection": plan.selection,
                               "files": len(plan.entries), "dry_run": dry_run, "hosts": rows}, indent=2))
    else:
        verb = "would send" if dry_run else "sent"
        click.echo(f"{plan.root}: {len(plan.entries)} files, {_size(plan.total_bytes)} "
                   f"(chosen by {'git' if plan.selection == 'git' else '.gitignore rules'})")
        for row in rows:
            if dry_run and row["ok"]:
                for f in row["moved"]:
                    click.echo(f"[{row['rank']} {row['host']}] {verb} {f}")
                for f in row["deleted_files"]:
                    click.echo(f"[{row['rank']} {row['host']}] would delete {f}")
        table = [{"host": r["host"], "method": r.get("method", ""), "files": r.get("files", ""),
                  "bytes": _size(r["bytes"]) if "bytes" in r else "", "deleted": r.get("deleted", ""),
                  "time": f"{r['elapsed_s']:.1f}s" if "elapsed_s" in r else "",
                  "note": r["error"] and f"error: {r['error']}" or r.get("note", "")} for r in rows]
        _table(table, ["host", "method", "files", "bytes", "deleted", "time", "note"])
        failed = len(group.failed)
        click.echo(f"{len(group) - failed} ok, {failed} failed" + (" (dry run: nothing moved)" if dry_run else ""),
                   err=bool(failed))
    sys.exit(0 if group.all_ok else 1)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class _Bars:
    """One progress line per host, redrawn in place (only on a terminal), once a host has a large
    transfer (at least LARGE bytes); small syncs print only the summary."""

    LARGE = 4 * 1024 * 1024

    def __init__(self, hosts: list[str]):
        import threading

        self.hosts = hosts
        self.state: dict[str, tuple[int, int]] = {}
        self.lock = threading.Lock()
        self.drawn = 0
        self.last = 0.0

    def update(self, host: str, done: int, total: int) -> None:
        import time

        with self.lock:
            self.state[host] = (done, total)
            if not any(t >= self.LARGE for _, t in self.state.values()):
                return
            now = time.monotonic()
            if now - self.last < 0.1 and done < total:
                return
            self.last = now
            self._draw()

    def _draw(self) -> None:
        width = max(len(h) for h in self.hosts)
        lines = []
        for h in self.hosts:
            done, total = self.state.get(h, (0, 0))
            frac = done / total if total else 0.0
            bar = "#" * int(frac * 30)
            lines.append(f"{h.ljust(width)} [{bar.ljust(30)}] {frac * 100:5.1f}% {_size(done)} / {_size(total)}")
        if self.drawn:
            click.echo(f"\x1b[{self.drawn}A", nl=False)
        for line in lines:
            click.echo("\x1b[2K" + line)
        self.drawn = len(lines)

    def close(self) -> None:
        with self.lock:
            if self.drawn:
                self._draw()


@data_cmd.command(name="push")
@click.argument("data_dir")
@hosts_option
@click.option("--name", metavar="NAME", help="Directory name on the hosts (default: DATA_DIR's name).")
@click.option("--method", type=click.Choice(["auto", "rsync", "sftp"]), default="auto", show_default=True,
              help="auto: rsync over ssh where both ends have it, else SFTP.")
@click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to wait for SSH.")
@click.option("--timeout", default=7200.0, show_default=True, help="Seconds a host's whole transfer may take.")
@click.option("--strict-host-keys", is_flag=True, help="Refuse hosts whose key is not in known_hosts yet.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the table.")
def data_push_cmd(data_dir, inventory_path, name, method, connect_timeout, timeout, strict_host_keys, as_json):
    """Send host i its shard i (+ val.bin, manifest), checked by sha256."""
    from ..transfer.shards import push_shards

    cluster = _load(inventory_path)
    bars = _Bars([h.name for h in cluster.hosts]) if sys.stdout.isatty() and not as_json else None
    group = push_shards(cluster, data_dir, name=name, method=method, connect_timeout=connect_timeout,
                        timeout=timeout, host_key_checking="strict" if strict_host_keys else None,
                        progress=bars.update if bars else None)
    if bars:
        bars.close()
    rows = []
    for o in group.values():
        r = o.value
        row = {"host": o.host.name, "ok": o.ok, "error": _one_line(o.error) if o.error else None}
        if r is not None:
            row.update(dir=r.dir, ranks=r.ranks, sent=r.sent, sent_bytes=r.sent_bytes, unchanged=r.unchanged,
                       removed=r.removed, method=r.method, elapsed_s=round(r.elapsed_s, 3))
        rows.append(row)
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "hosts": rows}, indent=2))
    else:
        _table([{"host": r["host"], "ranks": ",".join(map(str, r.get("ranks", []))),
                 "sent": len(r.get("sent", [])), "bytes": _size(r.get("sent_bytes", 0)),
                 "unchanged": len(r.get("unchanged", [])), "removed": len(r.get("removed", [])),
                 "time": f"{r['elapsed_s']:.1f}s" if "elapsed_s" in r else "",
                 "note": f"error: {r['error']}" if r["error"] else r.get("dir", "")} for r in rows],
               ["host", "ranks", "sent", "bytes", "unchanged", "removed", "time", "note"])
        failed = len(group.failed)
        click.echo(f"{len(group) - failed} ok, {failed} failed", err=bool(failed))
    sys.exit(0 if group.all_ok else 1)


# ---- bench ------------------------------------------------------------------------------------

@command("clusterctl bench --hosts inventory.yaml --backend mpi --sizes 1K..64M")
@hosts_option
@click.option("--backend", type=click.Choice(["mpi", "ring"]), help="Default: the inventory's launch.backend.")
@click.option("--sizes", default="1K..64M", show_default=True,
              help="Message sizes: a range of powers of two (1K..1G), a list (1M,64M), or both.")
@click.option("--ops", default="all_sum,all_gather", show_default=True, help="Collectives to time.")
@click.option("--no-mpi4py", is_flag=True, help="Skip the raw mpi4py comparison (mpi backend).")
@click.option("--tune", is_flag=True, help="Try btl_tcp_links (mpi) or connections-per-ip (ring) in 1, 2, 4, 8 "
                                           "and the shared subnets (mpi); print the winner.")
@click.option("--write", is_flag=True, help="With --tune: store the winner in the inventory (nothing else changes).")
@click.option("--p2p", is_flag=True, help="Bandwidth between every pair of hosts (ring: between ring neighbours).")
@click.option("--p2p-size", default="16M", show_default=True, help="Message size of --p2p.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to wait for SSH.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds one launch may take before its ranks give up.")
def bench_cmd(inventory_path, backend, sizes, ops, no_mpi4py, tune, write, p2p, p2p_size, as_json,
              connect_timeout, timeout):
    """Measure all_sum / all_gather bandwidth across the cluster."""
    from ..bench.measure import Bench
    from ..bench.report import format_bytes, parse_size, parse_sizes, render_matrix, render_table

    if write and not tune:
        raise click.UsageError("--write stores what --tune found: give --tune too")
    if tune and p2p:
        raise click.UsageError("give --tune or --p2p, not both")
    op_list = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = [o for o in op_list if o not in ("all_sum", "all_gather")]
    if unknown or not op_list:
        raise click.UsageError(f"--ops: {', '.join(unknown) or '(none)'}: choose from all_sum, all_gather")
    size_list = parse_sizes(sizes)
    cluster = _load(inventory_path)
    backend = backend or cluster.launch.backend
    if backend not in ("mpi", "ring"):
        raise click.UsageError(f"bench measures the mpi and ring backends; pass --backend (the inventory says {backend})")
    say = (lambda text: click.echo(text, err=True))
    bench = Bench(cluster, backend, connect_timeout=connect_timeout, deadline_s=timeout)
    doc = {"inventory": cluster.path, "backend": backend, "world_size": cluster.world_size,
           "hosts": [h.name for h in cluster.hosts]}
    if p2p:
        say(f"bench: point-to-point, {p2p_size} messages, {len(cluster.hosts)} hosts over {backend}")
        doc["p2p"] = bench.point_to_point(parse_size(p2p_size))
        click.echo(json.dumps(doc, indent=2) if as_json else render_matrix(doc["p2p"]), nl=as_json)
        return
    if tune:
        from ..bench.tune import describe, store
        from ..bench.tune import tune as run_tune

        nbytes = size_list[-1]
        say(f"bench --tune: all_sum of {format_bytes(nbytes)} on {cluster.world_size} ranks over {backend}")
        progress = (lambda t: say(f"  {describe(t.setting)}: " + (f"busbw {t.busbw_gbs:.3f} GB/s" if t.error is None
                                                                  else f"failed: {t.error}")))
        trials, best = run_tune(bench, nbytes, progress=progress)
        doc["tune"] = {"bytes": nbytes, "trials": [t.__dict__ for t in trials], "best": best.__dict__}
        changed = store(inventory_path, bench, best) if write else []
        doc["tune"]["written"] = changed
        if as_json:
            click.echo(json.dumps(doc, indent=2))
        else:
            click.echo(f"best: {describe(best.setting)}: busbw {best.busbw_gbs:.3f} GB/s "
                       f"({format_bytes(nbytes)} all_sum, {cluster.world_size} ranks)")
        if write:
            say(f"wrote {', '.join(changed)} to {inventory_path}" if changed
                else f"{inventory_path} already holds the best setting; unchanged")
        return
    say(f"bench: {', '.join(op_list)} at {len(size_list)} sizes on {cluster.world_size} ranks over {backend}")
    doc.update(bench.collectives(size_list, op_list, mpi4py=not no_mpi4py))
    click.echo(json.dumps(doc, indent=2) if as_json else render_table(doc["rows"]), nl=as_json)


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


def _version() -> str:
    from .. import __version__
    return __version__


def _write_debug_log() -> str:
    directory = os.path.join(os.path.expanduser("~"), ".cache", "clusterctl")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        directory = tempfile.gettempdir()
    path = os.path.join(directory, "debug.log")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"--- {datetime.datetime.now().isoformat()} clusterctl {_version()} {sys.argv}\n")
        f.write(traceback.format_exc())
    return path


