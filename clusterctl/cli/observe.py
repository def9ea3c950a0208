"""clusterctl runs, logs, plot, ps, kill, stacks, completion: looking at runs, past and present."""
from __future__ import annotations

import json
import os
import re
import sys
import time

import click

from ..hosts.scripts.contract import SupervisorState
from ..trainer_contract import RUNS_DIR
from . import app
from .console import table

runs_dir_option = click.option("--runs-dir", default=RUNS_DIR, show_default=True,
                               help="Where the project's runs/<id>/ directories are.")


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes}m{s:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _when(iso) -> str:
    return iso[:19].replace("T", " ") if iso else "-"


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


@app.command("clusterctl runs --all")
@runs_dir_option
@click.option("--all", "everywhere", is_flag=True,
              help="Every run this machine started, in any project (from ~/.cache/clusterctl/runs.jsonl).")
@app.connect_timeout_option()
@app.json_option
def runs_cmd(runs_dir, everywhere, connect_timeout, as_json):
    """List runs: kind, model, strategy, hosts, outcome, final loss."""
    from ..observe.runs import list_all, list_runs

    from ..detach.follow import refresh_all
    refresh_all(runs_dir, connect_timeout)      # detached runs asked how they are; those that ended come home
    infos = list_all(runs_dir) if everywhere else list_runs(runs_dir)
    if as_json:
        click.echo(json.dumps([i.as_json() for i in infos], indent=2))
        return
    if not infos:
        click.echo(f"no runs in {runs_dir}/" + ("" if everywhere else " (--all: every project)"), err=True)
        return
    rows = [{"id": i.run_id, "kind": i.kind or "-", "model": _short(os.path.basename(i.model.rstrip("/")) or i.model, 24)
             if i.model else "-", "strategy": i.strategy or "-", "start": _when(i.start),
             "duration": _duration(i.duration_s), "hosts": _short(",".join(i.hosts) or "-", 30), "world": i.world or "-",
             "backend": i.backend or "-", "outcome": _short(i.outcome),
             "loss": f"{i.final_loss:.4f}" if i.final_loss is not None else "-",
             "test_ppl": f"{i.test_perplexity:.3f}" if i.test_perplexity is not None else "-",
             **({"dir": i.dir} if everywhere else {})} for i in infos]
    tested = ["test_ppl"] if any(i.test_perplexity is not None for i in infos) else []   # a fine-tune's test.jsonl
    table(rows, ["id", "kind", "model", "strategy", "start", "duration", "hosts", "world", "backend", "outcome", "loss"]
          + tested + (["dir"] if everywhere else []))


@app.command("clusterctl logs latest --rank 0 --grep loss")
@click.argument("run_ref", metavar="RUN")
@click.option("--rank", type=int, help="Only this rank's log (default: every rank, merged in time order).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option("--grep", "pattern", metavar="PATTERN", help="Only lines matching this regular expression.")
@click.option("--attempt", type=click.IntRange(min=0), metavar="K",
              help="A restarted run (run --max-restarts): only attempt K's logs (runs/<id>/attempt-K/; default: "
                   "every attempt, one after the other).")
@runs_dir_option
@app.connect_timeout_option()
def logs_cmd(run_ref, rank, follow, pattern, attempt, runs_dir, connect_timeout):
    """Show a run's rank logs (RUN: an id, a prefix of one, or latest).

    A detached run's logs are read from its supervising host as they are there (-f: every few seconds)."""
    from dataclasses import replace

    from ..detach import follow as detached
    from ..errors import UsageError
    from ..observe.logs import follow_logs, rank_hosts, read_logs, run_ended
    from ..observe.runs import attempts, resolve

    info = resolve(runs_dir, run_ref)
    ended = run_ended
    now = detached.look(info.dir, connect_timeout)
    if now is not None and now.get("state") == SupervisorState.RUNNING:        # detached: looked at again as it is followed
        ended = _detached_ended(connect_timeout)
    if attempt is not None:
        there = attempts(info.dir)
        if attempt not in there:
            raise UsageError(f"run {info.run_id} has no attempt {attempt} (" + (
                f"attempts {', '.join(map(str, there))})" if there else "it was not started with --max-restarts)"))
        whole = info.dir
        # an attempt is over when the run is, or when the next attempt has begun

        whole_ended = ended

        def ended(_):
            return whole_ended(whole) or os.path.isdir(os.path.join(whole, f"attempt-{attempt + 1}"))
        info = replace(info, dir=os.path.join(info.dir, f"attempt-{attempt}"))
    try:
        regex = re.compile(pattern) if pattern is not None else None
    except re.error as e:
        raise click.BadParameter(f"{pattern!r}: {e}", param_hint="--grep") from None
    ranks = rank_hosts(info.dir)
    if rank is not None and rank not in ranks:
        raise UsageError(f"run {info.run_id} has no rank {rank} (ranks {', '.join(map(str, sorted(ranks))) or 'none'})")

    def show(line):
        click.echo(line.text if rank is not None else f"[rank {line.rank} {line.host}] {line.text}")

    if follow:
        for line in follow_logs(info, rank, regex, ended=ended):
            show(line)
        return
    lines, timed = read_logs(info, rank, regex)
    if rank is None and not timed and len(ranks) > 1:
        click.echo(f"note: attempt {attempt}'s logs carry no times: ranks shown one after another (without "
                   "--attempt, the run's logs are merged in time order)" if attempt is not None else
                   f"note: run {info.run_id} has no log-times.jsonl (made before clusterctl timed its logs): "
                   "ranks shown one after another", err=True)
    for line in lines:
        show(line)
    if not lines:      # exit 0 all the same: an empty log is an answer, but a silent one looks like a failure
        who = f"rank {rank}" if rank is not None else f"run {info.run_id}"
        click.echo(f"({who} printed nothing" + (" that matches" if regex is not None else "") + ")", err=True)


def _detached_ended(connect_timeout: float, every_s: float = 2.0):
    """`logs -f`'s test for the end of a detached run: every `every_s` its run directory fetched again from the
    supervising host (detach/follow.py look), ended once the supervisor has; a host that does not answer is
    asked again later (the run goes on without this machine)."""
    from ..detach import follow as detached
    from ..errors import ClusterctlError

    last = [time.monotonic()]

    def ended(run_dir: str) -> bool:
        if time.monotonic() - last[0] < every_s:
            return False
        last[0] = time.monotonic()
        try:
            now = detached.look(run_dir, connect_timeout)
        except ClusterctlError:
            return False
        return now is None or now.get("state") != SupervisorState.RUNNING
    return ended


def _size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m or not (100 <= int(m.group(1)) <= 8000 and 100 <= int(m.group(2)) <= 8000):
        raise click.BadParameter(f"{text!r}: WIDTHxHEIGHT in pixels, 100 to 8000 each", param_hint="--size")
    return int(m.group(1)), int(m.group(2))


@app.command("clusterctl plot latest -o loss.png")
@click.argument("run_refs", metavar="RUN...", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write an image (.png, .svg, .pdf; needs matplotlib: pip install matplotlib). "
                   "Default: a text chart here.")
@click.option("--size", default="960x640", show_default=True, metavar="WxH", help="The image's size in pixels.")
@runs_dir_option
def plot_cmd(run_refs, output, size, runs_dir):
    """Plot runs' loss, held-out loss, tokens/s and memory by step."""
    from ..observe.plot import Curves, render_text, write_image
    from ..observe.runs import read_metrics, resolve

    infos = [resolve(runs_dir, ref) for ref in run_refs]
    curves = [Curves.of(i.run_id, read_metrics(i.dir)) for i in infos]
    for i, c in zip(infos, curves):
        if c.empty:
            click.secho(f"run {i.run_id}: no losses in {os.path.join(i.dir, 'metrics.jsonl')}", fg="yellow", err=True)
    if output is None:
        for line in render_text(curves):
            click.echo(line)
        return
    path = write_image(curves, output, _size(size))
    click.echo(f"wrote {path}", err=True)


def _cluster(inventory_path):
    from ..inventory import Cluster

    return app.load(inventory_path) if inventory_path else Cluster.this_machine(os.getcwd())


hosts_or_here_option = click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
                                    help="The inventory. Default: this machine.")


def _age(seconds: int) -> str:
    if seconds < 3600:
        return f"{seconds // 60}:{seconds % 60:02d}"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _print_failures(found) -> bool:
    failed = [h for h in found if h.error]
    for h in failed:
        click.secho(f"[{h.host}] error: {h.error}", fg="red", err=True)
    return bool(failed)


@app.command("clusterctl ps --hosts inventory.yaml")
@hosts_or_here_option
@click.option("-v", "--verbose", is_flag=True,
              help="Also the shells and ssh clients that carry the ranks, and a detached run's keeper.")
@app.connect_timeout_option()
@app.json_option
def ps_cmd(inventory_path, verbose, connect_timeout, as_json):
    """List the processes of clusterctl runs on every host."""
    from ..observe.procs import list_processes

    from ..observe.runs import service_urls

    found = list_processes(app.connector(_cluster(inventory_path), connect_timeout))
    urls = service_urls()          # serve jobs: run id -> the URL they answer at (from the runs index)
    if as_json:
        click.echo(json.dumps([{"host": h.host, "error": h.error,
                                "processes": [{**p.as_json(), **({"url": urls[p.run_id]} if p.run_id in urls else {})}
                                              for p in h.processes]}
                               for h in found], indent=2))
    else:
        rows, shown = [], set()
        for p in (p for h in found for p in h.processes if verbose or p.kind in ("rank", "launcher", "supervisor")):
            rows.append({"host": p.host, "run": p.run_id, "rank": "-" if p.rank is None else p.rank, "kind": p.kind,
                         "pid": p.pid, "age": _age(p.age_s), "cpu%": f"{p.cpu:.1f}", "mem": f"{p.rss_kb / 1024:.1f} MiB",
                         "url": urls.get(p.run_id, "") if p.run_id not in shown else ""})   # on a run's first row
            shown.add(p.run_id)
        if rows:
            columns = ["host", "run", "rank", "kind", "pid", "age", "cpu%", "mem"]
            table(rows, columns + (["url"] if any(r["url"] for r in rows) else []))
        else:
            click.echo(f"no clusterctl runs on {len(found)} host(s)", err=True)
    if _print_failures(found):
        sys.exit(1)


@app.command("clusterctl kill latest --hosts inventory.yaml")
@click.argument("run_ref", metavar="RUN", required=False)
@click.option("--all", "every_run", is_flag=True, help="Every clusterctl run on the hosts, not one.")
@hosts_or_here_option
@runs_dir_option
@click.option("--wait", "wait_s", type=app.Seconds(), default=60.0, show_default=True, metavar="S",
              help="How long the ranks have to end by themselves (the bundled trainer finishes its step and writes a "
                   "checkpoint): a run supervised here is stopped through its own process, which asks them, any other "
                   "run's ranks are each sent SIGTERM; then everything left is killed. 0: ask no rank.")
@app.connect_timeout_option()
def kill_cmd(run_ref, every_run, inventory_path, runs_dir, wait_s, connect_timeout):
    """Stop a run's processes on every host (or --all runs').

    A detached run (run --detach, serve --detach) is stopped through its supervisor on its host, which asks its
    ranks to stop with their work kept and restarts nothing."""
    from ..errors import UsageError
    from ..observe.procs import kill_runs
    from ..observe.runs import RUN_ID, list_all, resolve

    if (run_ref is None) == (not every_run):
        raise click.UsageError("give a RUN or --all (not both)")
    if run_ref is not None and _stop_detached(runs_dir, run_ref, wait_s, connect_timeout):
        return
    cluster = _cluster(inventory_path)
    unstopped = _stop_every_detached(cluster, runs_dir, wait_s, connect_timeout) if every_run else 0
    if every_run:       # the runs this machine supervises are stopped through their own process first
        run_id, run_dirs = None, [i.dir for i in list_all(runs_dir) if i.status == "running"]
    else:
        try:
            info = resolve(runs_dir, run_ref)
        except UsageError:
            if not RUN_ID.fullmatch(run_ref):
                raise
            info = None     # a run of another machine's: its processes on the hosts are swept all the same
        run_id, run_dirs = (info.run_id, [info.dir]) if info is not None else (run_ref, [])
    if run_id is not None and not RUN_ID.fullmatch(run_id):     # a directory named otherwise: never a pattern
        raise UsageError(f"{run_ref!r} is not a run of clusterctl's (a run id looks like 20250101-120000-abcdef)")
    what = "every clusterctl run" if run_id is None else f"run {run_id}"
    result = kill_runs(app.connector(cluster, connect_timeout), run_id, run_dirs, wait_s, runs_dir)
    if result.asked:
        click.echo(f"kill: asked {len(result.asked)} rank(s) to stop (SIGTERM): "
                   + ("they ended by themselves" if result.ended else f"not all ended within {wait_s:g}s"), err=True)
    failed = _print_failures(result.remaining)
    for h in result.remaining:
        for p in h.processes:
            click.secho(f"[{h.host}] still there: pid {p.pid} ({p.kind}) {p.command[:100]}", fg="red", err=True)
    if result.left or result.unconfirmed or failed or unstopped:
        names = ", ".join(result.unconfirmed) or "some host"
        click.secho(f"kill: could not confirm that every process of {what} is gone on {names}", fg="red", err=True)
        sys.exit(1)
    click.echo(f"kill: {what}: no process left on {len(result.remaining)} host(s)", err=True)


@app.command("clusterctl attach latest")
@click.argument("run_ref", metavar="RUN", default="latest")
@click.option("--plain", is_flag=True, help="Plain lines only, no live panel (the panel is drawn on a terminal).")
@runs_dir_option
@app.connect_timeout_option()
def attach_cmd(run_ref, plain, runs_dir, connect_timeout):
    """Follow a detached run (run --detach) as it goes.

    A run started with `run --detach` is followed from its supervising host: everything it printed, as it comes,
    under the live panel its supervisor keeps (as `run` draws it). Once it ended, its run directory comes home and
    attach exits with the run's exit code."""
    from ..detach import follow as detached
    from ..errors import UsageError
    from ..hosts.scripts.contract import SUPERVISOR_LOG
    from ..observe.live import Replayed
    from ..observe.runs import resolve
    from .launch import panel_wanted

    info = resolve(runs_dir, run_ref)
    record = detached.Record.read(info.dir)
    if record is None:
        raise UsageError(f"run {info.run_id} was not detached: its supervisor is the `clusterctl run` that started "
                         f"it (`clusterctl logs {info.run_id} -f` follows its ranks)")
    if detached.is_home(info.dir):
        click.echo(open(os.path.join(info.dir, SUPERVISOR_LOG), encoding="utf-8", errors="replace").read(), nl=False)
        sys.exit(_detached_end(info.dir, record, None))
    drawn, source, panel = panel_wanted(plain), Replayed(), None

    def live(doc):              # the supervisor's panel, drawn here from its first snapshot on
        nonlocal panel
        source.seen(doc)
        if drawn and panel is None:
            from .panel import Panel      # imports rich: only when a panel is drawn
            panel = Panel(source)

    def out(line):
        if panel is not None:
            panel.print(line)
        else:
            click.echo(line)

    try:
        state = detached.follow(record, out, connect_timeout=connect_timeout, live=live)
    except KeyboardInterrupt:
        if panel is not None:
            panel.stop()
        click.secho(f"\nattach: detached from run {record.run_id}; it goes on under its supervisor on "
                    f"{record.supervisor} (`clusterctl attach {record.run_id}` follows it again, `clusterctl kill "
                    f"{record.run_id}` stops it)", fg="yellow", err=True)
        sys.exit(0)
    if panel is not None:
        panel.stop()
    sys.exit(_detached_end(info.dir, record, state))


def _detached_end(run_dir: str, record, state: dict | None) -> int:
    """A detached run that ended: its run directory home (once), its outcome said; its exit code."""
    from ..detach import follow as detached
    from ..observe.runs import run_info

    if state is not None and not detached.is_home(run_dir):
        files, nbytes = detached.settle(record, run_dir, state)
        click.echo(f"attach: run {record.run_id} came home from {record.supervisor}: {files} files, "
                   f"{nbytes / 1e6:.1f} MB in {run_dir}", err=True)
    info = run_info(run_dir)
    click.echo(f"attach: run {record.run_id}: {info.outcome}", err=True)
    return info.exit_code if info.exit_code is not None and 0 <= info.exit_code < 256 else 1


def _stop_detached(runs_dir: str, run_ref: str, wait_s: float, connect_timeout: float) -> bool:
    """kill RUN for a detached run still under its supervisor: SIGTERM to the supervisor, which stops the ranks
    with their checkpoint as `run` does; the run then comes home. False: not such a run (kill goes on as for any)."""
    from ..detach import follow as detached
    from ..errors import UsageError
    from ..observe.runs import resolve

    try:
        info = resolve(runs_dir, run_ref)
    except UsageError:
        return False
    record = detached.Record.read(info.dir)
    if record is None or detached.is_home(info.dir):
        return False
    _said_stopped(record, info.dir, detached.stop(record, info.dir, wait_s, connect_timeout), wait_s)
    return True


def _stop_every_detached(cluster, runs_dir: str, wait_s: float, connect_timeout: float) -> int:
    """kill --all: every detached run of runs_dir not yet home on one of `cluster`'s hosts, stopped through its
    supervisor first, all at once (a rank stopped under it would only be restarted); each said in a line. The
    number that could not be stopped (kill then sweeps their ranks as any run's)."""
    from ..detach import follow as detached
    from ..errors import ClusterctlError

    waiting = detached.waiting_on(runs_dir, cluster)
    failures = 0
    for (record, run_dir), now in zip(waiting, detached.stop_all(waiting, wait_s, connect_timeout)):
        try:
            _said_stopped(record, run_dir, now, wait_s)
        except ClusterctlError as e:
            click.secho(str(e), fg="red", err=True)
            failures += 1
    return failures


def _said_stopped(record, run_dir: str, now: dict, wait_s: float) -> None:
    """A detached run's supervisor asked to stop: its end said in one line, or ClusterctlError when it still runs
    after wait_s or could not be asked."""
    from ..errors import ClusterctlError

    if now.get("state") == SupervisorState.RUNNING:
        raise ClusterctlError(f"kill: run {record.run_id}'s supervisor on {record.supervisor} still runs after "
                              f"{wait_s:g}s (its ranks may still be writing their checkpoint); kill it again later")
    if now.get("state") not in SupervisorState.OVER:
        raise ClusterctlError(f"kill: run {record.run_id}'s supervisor on {record.supervisor} could not be asked: "
                              f"{now.get('why') or now.get('state')}")
    click.echo(f"kill: run {record.run_id} stopped by its supervisor on {record.supervisor}; its run directory came "
               f"home: {run_dir}", err=True)


@app.command("clusterctl completion bash >> ~/.bashrc")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion_cmd(shell):
    """Print the shell completion script (bash, zsh, fish): click's own."""
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)(click.get_current_context().find_root().command, {}, "clusterctl",
                                           "_CLUSTERCTL_COMPLETE")
    click.echo(complete.source())


@app.command("clusterctl stacks latest")
@click.argument("run_ref", metavar="RUN")
@click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
              help="The inventory the run was started with. Default: the one it recorded (launch.json).")
@click.option("--native", is_flag=True,
              help="Add native frames with py-spy where it is installed on a host (pip install py-spy there).")
@click.option("--saved", is_flag=True,
              help="The stacks saved last (a stall's, or an earlier `stacks`'s) instead of asking the ranks now.")
@runs_dir_option
@app.connect_timeout_option()
@app.json_option
def stacks_cmd(run_ref, inventory_path, native, saved, runs_dir, connect_timeout, as_json):
    """Where each rank of a running job is: its Python stacks, grouped.

    RUN is an id, a prefix of one, or latest. The run goes on unharmed; the stacks are saved in
    runs/<id>/stacks/<time>/rank-N.txt. A run that is no longer running (or --saved) shows the stacks saved last:
    a stall's. A detached run's ranks are asked through the cluster it recorded; its saved stacks are fetched from
    its supervising host."""
    from ..detach import follow as detached
    from ..errors import EXIT_STALLED, ClusterctlError
    from ..inventory import Cluster
    from ..launch.stacks import Stacks, collect
    from ..observe.runs import resolve, run_info

    info = resolve(runs_dir, run_ref)
    now = detached.look(info.dir, connect_timeout,       # its saved stacks, an attempt's too (attempt-K/stacks/)
                        only=lambda rel: re.match(r"(attempt-\d+/)?stacks/", rel) is not None or detached.small_files(rel))
    info = run_info(info.dir)
    running = now.get("state") == SupervisorState.RUNNING if now is not None else info.status in ("running", "unknown")
    if saved or not running:
        taken = Stacks.newest(info.dir)
        if taken is None:
            raise ClusterctlError(f"run {info.run_id} has no saved stacks (`clusterctl stacks {info.run_id}` asks its "
                                  "ranks)" if running else
                                  f"run {info.run_id} is not running ({info.outcome}): there are no ranks to ask")
        _show_stacks(taken, as_json, f"saved {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(taken.taken))}"
                     + (", the stall's" if info.exit_code == EXIT_STALLED else "")
                     + ("" if running else f"; the run ended: exit {info.exit_code}"))
        return
    record = detached.Record.read(info.dir) if now is not None else None
    try:
        with open(os.path.join(info.dir, "launch.json"), encoding="utf-8") as f:
            described = json.load(f)
    except (OSError, ValueError):
        described = {}
    folders = described.get("rank_files") or None
    inventory = inventory_path or described.get("inventory")
    if record is not None and not inventory_path:     # detached: the cluster as this machine reaches it
        cluster = record.cluster
    elif inventory:
        cluster = app.load(inventory)
    else:      # a run on this machine alone (no inventory)
        cluster = Cluster.this_machine(os.getcwd())
        folders = {cluster.hosts[0].name: next(iter(folders.values()))} if folders else None
    taken = collect(app.connector(cluster, connect_timeout), info.run_id, folders=folders, native=native)
    if taken.ranks:
        taken.save(info.dir)
    _show_stacks(taken, as_json)
    if taken.errors or not taken.ranks:
        sys.exit(1)


def _show_stacks(taken, as_json: bool, note: str | None = None) -> None:
    if as_json:
        click.echo(json.dumps({"run_id": taken.run_id, "folder": taken.folder, "taken": taken.taken,
                               "saved": note is not None, "errors": taken.errors,
                               "ranks": [{"rank": r.rank, "host": r.host, "pid": r.pid, "where": r.where(),
                                          "error": r.error} for r in taken.ranks]}, indent=2))
        return
    lines = taken.screen()
    if note:
        lines[0] = lines[0].rstrip(":") + f" ({note}):"
    for line in lines:
        click.echo(line)
