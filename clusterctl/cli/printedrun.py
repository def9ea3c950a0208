"""`run`'s events (run/events.py RunEvents, every method of it) as lines: progress on stderr, the ranks' output on
stdout / stderr, the ranks' live panel under them on a terminal (cli/panel.py); serve's (PrintedServe) add theirs.

    events = PrintedRun(live=panel_wanted(plain))       # what run() is given
    print_tail(launch, outcome)                         # the failing rank's last lines, after the outcome's line
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import threading

import click

from ..trainer_contract import ADAPTER_CONFIG
from .console import Bars, TransferProgress, one_line, size, stored_line


class PrintedRun:
    """`run`'s events (run/events.py RunEvents: every method of it) as lines: progress on stderr, the ranks' output
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

    def host_down(self, launch, restart, host, detail, limit_s):
        click.secho(f"run {launch.run_id}: restart {restart} waits for {host} to answer over SSH, up to {limit_s:g}s "
                    f"(--host-wait): {one_line(detail)}", fg="yellow", err=True)

    def host_up(self, launch, restart, host, waited_s, limit_s):
        if waited_s is None:
            click.secho(f"run {launch.run_id}: {host} still does not answer after {limit_s:g}s; restart {restart} "
                        "failed", fg="yellow", err=True)
        else:
            click.echo(f"run {launch.run_id}: {host} answers again after {waited_s:.0f}s; restart {restart} goes on",
                       err=True)

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

    def produced(self, launch, products):
        """What the run left for its user, as its kind names it (program.Capabilities.products): how to use it."""
        for what, path in products:
            if what == "model":          # an mlx-lm model directory (the bundled trainer's --model export)
                click.echo(f"run {launch.run_id}: the trained model is {path} (mlx_lm.generate --model "
                           f"{shlex.quote(path)})", err=True)
            elif what == "adapters":     # an --adapter run's adapters, in mlx-lm's layout
                base = _adapted_base(path)
                click.echo(f"run {launch.run_id}: the trained adapters are {path} (mlx_lm.generate --model "
                           f"{shlex.quote(base or 'BASE')} --adapter-path {shlex.quote(path)}; `clusterctl export "
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


def print_tail(launch, outcome) -> None:
    """The failing rank's last lines (run's and serve's failure screens)."""
    if outcome.failed_rank is not None and outcome.tail:
        click.echo(f"last lines of {os.path.join(launch.log_dir, f'rank-{outcome.failed_rank}.log')}:", err=True)
        for line in outcome.tail:
            click.echo(f"  {line}", err=True)


def _adapted_base(adapters: str) -> str | None:
    """The --model an adapter run adapted, as its adapter_config.json records it (relative to the project)."""
    try:
        with open(os.path.join(adapters, ADAPTER_CONFIG), encoding="utf-8") as f:
            model = json.load(f).get("model")
    except (OSError, ValueError):
        return None
    return model if isinstance(model, str) else None
