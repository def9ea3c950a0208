"""Where the launcher runs, and the cleanup after a job.

    site = choose_site(cluster, backend, "auto", connector)   # here, or the first host over SSH
    left = sweep(connector, run_id)                           # kill whatever is left of a run, on every host

The launcher (mpirun, mlx.launch) runs on this machine when it is installed here; otherwise on the first
host, which has it if doctor passes there (`--launch-from` decides instead of `auto`).
"""
from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..hosts.fanout import run_all
from ..hosts.quoting import quote_path
from ..inventory import Cluster
from ..trainer_contract import CHECKPOINT_TMP_GLOB, CHECKPOINTS, RUNS_DIR
from .backends import Backend
from .site import LaunchSite

if TYPE_CHECKING:
    from ..hosts.connector import Connector

LAUNCH_FROM = ("auto", "here", "first-host")


def choose_site(cluster: Cluster, backend: Backend, launch_from: str, connector: Connector) -> LaunchSite:
    """Where `backend`'s launcher runs. UsageError when it can run nowhere asked for."""
    if launch_from not in LAUNCH_FROM:
        raise UsageError(f"--launch-from {launch_from!r}: one of {', '.join(LAUNCH_FROM)}")
    launcher = backend.launcher_here()
    missing = f"{backend.launcher_name} is not installed here ({backend.install_hint})"
    if launch_from == "here" and launcher is None:
        raise UsageError(missing)
    if launch_from == "first-host" or launcher is None:
        first = cluster.hosts[0]
        if first.local:
            raise UsageError(missing)
        return LaunchSite.first_host(first, connector.transport(first))
    return LaunchSite(launcher=launcher)       # this machine; job.prepare makes it ready (LaunchSite.here)


def sweep_pattern(run_id: str | None) -> str:
    """The pkill -f / pgrep -f pattern (extended regular expression) of one run's processes, or of every
    clusterctl run's (None). It matches the ranks' command lines but no command line holding the pattern
    itself: not the sweeping shell, nor a pgrep / pkill of a sweep running beside it on the same machine."""
    if run_id is None:
        return "clusterctl-ru[n]-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}"
    return f"clusterctl-ru[n]-{run_id}"


def sweep_script(run_id: str | None, rank_files: str | None = None, run_dir: str | None = None) -> str:
    """The POSIX sh a host runs to kill what is left of a run (None: of every clusterctl run): every rank
    carries its run id on its command line. Exit 1, listing them, when something would not die. Then the
    pid and stacks files killed ranks left in `rank_files` (hosts/scripts/stackdump.py) are removed, and in the
    run's directory there (`run_dir`) the checkpoint a killed writer left half written (trainer_contract)."""
    pattern = shlex.quote(sweep_pattern(run_id))
    wait = f"i=0; while pgrep -f {pattern} >/dev/null 2>&1 && [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done"
    # TERM, wait for them to go; KILL what is left, and wait again, so that nothing of the run is still
    # there when `run` returns
    tidy = ""
    if rank_files:
        folder = quote_path(rank_files)
        tidy = (f"rm -f {folder}/rank-*.pid {folder}/rank-*.stacks {folder}/rank-*.partial 2>/dev/null; "
                f"rmdir {folder} 2>/dev/null; ")
    if run_dir:
        tidy += f"rm -rf {quote_path(run_dir)}/{CHECKPOINTS}/{CHECKPOINT_TMP_GLOB} 2>/dev/null; "
    return (f"pkill -TERM -f {pattern} 2>/dev/null; {wait}; pkill -KILL -f {pattern} 2>/dev/null; {wait}; {tidy}"
            f"if pgrep -f {pattern} >/dev/null 2>&1; then "
            f"ps -o pid=,stat=,args= -p \"$(pgrep -d, -f {pattern})\" | cut -c1-160; exit 1; fi")


def sweep(connector: Connector, run_id: str | None, timeout: float = 15.0) -> list[str]:
    """Kill whatever is left of this run (None: of every clusterctl run) on every host (sweep_script).
    Returns the hosts where something may survive (unreachable, or a process that would not die)."""
    def one(host):
        script = sweep_script(run_id, connector.rank_files_dir(host, run_id) if run_id else None,
                              f"{host.workdir.rstrip('/')}/{RUNS_DIR}/{run_id}" if run_id else None)
        with connector.transport(host) as t:
            return t.run(script, timeout=timeout)

    group = run_all(connector.cluster.hosts, one, deadline=connector.deadline(timeout))
    return [name for name, outcome in group.items() if not outcome.ok]
