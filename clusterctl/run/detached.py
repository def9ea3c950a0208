"""`run --detach`: the run checked, staged and pre-flighted from here exactly as `run` does it, then handed to a
supervisor on one of its hosts, which is `run` itself (run(), its attempts, restarts, stall watchdog, record and
copy home), started there detached (clusterctl/detach/); this machine keeps a record and may go away.

    detached = detach(cluster, options, argv, supervisor_name, events)
    detached.run_id, detached.host, detached.pid

`argv`: the run command's own arguments for the supervisor, without what only applies here (the CLI makes it:
cli/runwords.py supervisor_argv). The supervisor gets the cluster as its host reaches the others (detach/handoff.py),
what staging gave the ranks (RunOptions.staged) and this run's id.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Sequence

from ..detach import follow, handoff, supervisor
from ..errors import UsageError
from ..hosts.stdinfeed import StdinFeed
from ..inventory import Cluster
from ..launch.job import new_run_id
from ..launch.plan import discover, remember_plan
from ..transfer.stage import ship_clusterctl
from .events import RunEvents
from .options import RunOptions
from .ready import check_program, get_ready
from .staging import stage


@dataclass(frozen=True)
class Detached:
    run_id: str
    host: str                 # where the supervisor runs
    pid: int
    run_dir: str              # runs/<id>/ here: the record now, the whole run once it came home


def detach(cluster: Cluster | None, options: RunOptions, argv: Sequence[str], supervisor_name: str | None,
           events: RunEvents | None = None) -> Detached:
    events = events or RunEvents()
    settings = options.attempts
    if cluster is None:
        raise UsageError("--detach needs --hosts: a job on this machine alone would stop with it")
    if settings.dry_run:
        raise UsageError("--detach and --dry-run: the dry run launches nothing; give one of them")
    ready = get_ready(cluster, options, events)
    if ready.program.kind.reads_stdin:
        _refuse_stdin(options)
    host = supervisor.choose(ready.cluster, supervisor_name)
    connector = ready.connector
    supervisor.check_python(connector, host)
    extra_env, _, host_env = stage(connector, options, ready.program, ready.project, events, beside=False,
                                   model=ready.model)
    if not (options.sync and ready.program.ships_clusterctl):     # the supervisor is clusterctl: it must be there
        ship_clusterctl(connector.narrowed(ready.cluster.subset([host.name])))
    if settings.preflight:           # what the supervisor will check again, said here while someone watches
        plan = discover(connector, script=ready.program.script, module=ready.program.module,
                        needs_mpi=ready.backend.needs_mpi)
        remember_plan(ready.cluster, plan)
        if ready.checks:
            check_program(ready.cluster, plan, ready.program, ready.project, options)
    if options.attempts.restart.elastic is not None:
        extra_env["CLUSTERCTL_ELASTIC_BATCH"] = options.attempts.restart.batch
    given = handoff.Handoff(new_run_id(), host.name, handoff.as_seen_from(ready.cluster, host.name), tuple(argv),
                            extra_env, host_env)
    return hand_over(connector, ready.cluster, host, given, settings.runs_dir)


def hand_over(connector, cluster: Cluster, host, given: handoff.Handoff, runs_dir: str) -> Detached:
    """The supervisor started on `host` with what it is `given`, and this machine's record of it written in
    runs_dir (what `attach`, `runs`, `logs`, `stacks` and `kill` read): run's and serve's last step."""
    pid = supervisor.start(connector, host, given)
    run_dir = os.path.abspath(os.path.join(runs_dir, given.run_id))
    # the record here reaches hosts, never runs ranks: the cluster without the env values (secrets among them)
    reach = replace(cluster, hosts=tuple(replace(h, env=(), secret_env=()) for h in cluster.hosts))
    follow.Record(given.run_id, host.name, supervisor.folder(host, given.run_id), pid, time.time(), reach).write(run_dir)
    return Detached(given.run_id, host.name, pid, run_dir)


def _refuse_stdin(options: RunOptions) -> None:
    """A detached job has no terminal, nor this command's stdin: bytes waiting on it would be lost, so they are
    refused in one line; a terminal is not read (the ranks get EOF, as with --no-stdin)."""
    source = options.stdin
    if source is None:
        return
    try:
        if os.isatty(source.fileno()):
            return
    except (AttributeError, OSError, ValueError):
        pass
    if StdinFeed.of(source) is not None:
        raise UsageError("--detach: a detached job reads no standard input (nothing of this machine stays with it); "
                         "give the program its input as a file in the project, or run attached")
