"""The command line. Only this package imports click: each command parses its options, calls the core
once, and prints what comes back. No command loops over hosts, starts threads or processes: that is the
core's work (run/, doctor/, bench/, transfer/, hosts/).

    app.py      the click group, the options several commands share, MODULES (command -> module)
    console.py  tables, sizes, one-line errors, progress bars; panel.py  run's live panel (rich)
    hosttable.py  the hosts' telemetry as rows (top, and under the ranks in run's panel)
    hosts.py    hosts, exec, init, ssh-close                  doctor.py  doctor
    launch.py   hostfile, run                                 sync.py    sync
    printedrun.py  run's events as lines (serve's add theirs)  runwords.py  run's words: clusterctl's, the program's
    data.py     data prepare, data push, generate, export     setup.py   setup mesh, setup python, setup network
    bench.py    bench                                         models.py  models, models push, models rm
    serve.py    serve
    observe.py  runs, logs, plot, ps, kill, stacks, attach, completion
    top.py      top                                           reference.py  docs/cli.md, written from the commands
    dashboard.py  dashboard

Each command module registers its commands on `cli` when it is imported: app.MODULES says which module
defines which command, and a module is imported only when its command is used (or --help lists it), so a
new command goes into MODULES too (CONTRIBUTING.md#adding-a-command).

main() is the one error boundary: a ClusterctlError becomes one red line and its exit code (errors.py
lists them), anything unexpected one line plus a traceback in ~/.cache/clusterctl/debug.log.
"""
from __future__ import annotations

import datetime
import os
import sys
import tempfile
import traceback

import click

from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, ClusterctlError
from .app import EXAMPLES, cli

__all__ = ["EXAMPLES", "cli", "main"]


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
    except (click.exceptions.Abort, KeyboardInterrupt):
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
        sys.exit(EXIT_FAILED)


def _version() -> str:
    from .. import __version__
    return __version__


def _write_debug_log() -> str:
    """~/.cache/clusterctl/debug.log (0600: a traceback may show arguments); when that cannot be written, a
    new file of our own under $TMPDIR, never a fixed name there that another user could have planted."""
    text = f"--- {datetime.datetime.now().isoformat()} clusterctl {_version()} {sys.argv}\n{traceback.format_exc()}"
    directory = os.path.join(os.path.expanduser("~"), ".cache", "clusterctl")
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "debug.log")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        fd, path = tempfile.mkstemp(prefix="clusterctl-debug-", suffix=".log")
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(text)
    return path
