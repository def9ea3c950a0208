"""run(): the `run` use case, callable without click (the package's docstring tells its steps):

    result = run(cluster_or_None, RunOptions(script="train.py", args=("--lr", "3e-4")), events)
    result.exit_code, result.outcome.reason, result.launch.run_dir

checked and resolved (ready.py) -> staged (staging.py) -> planned, the pre-flight first or beside the launch
(plan_launch) -> the attempts (launch/attempts.py, fed and heard through hooks.py) -> brought home (fetch.py) ->
recorded (its summary, hooks.py; its loss picture).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, ClusterctlError, SignalReceived
from ..hosts.connector import Connector
from ..hosts.fanout import Deferred
from ..hosts.stdinfeed import StdinFeed
from ..inventory import Cluster
from ..launch.attempts import Attempts, AttemptSettings
from ..launch.job import Launch
from ..launch.outcome import AttemptState, Outcome
from ..launch.plan import LaunchPlan, cached_plan, discover, remember_plan
from ..program import Program
from .events import RunEvents
from .fetch import fetch_paths, fetch_run
from .hooks import RunHooks, plot_losses
from .options import RunOptions
from .ready import Ready, check_program, get_ready
from .staging import BesideCopy, stage


@dataclass
class RunResult:
    launch: Launch
    outcome: Outcome | None           # None for a dry run

    @property
    def exit_code(self) -> int:
        if self.outcome is None:
            return 0
        code = self.outcome.exit_code
        return code if 0 <= code < 256 else EXIT_FAILED


def run(cluster: Cluster | None, options: RunOptions, events: RunEvents = RunEvents()) -> RunResult:
    ready = get_ready(cluster, options, events)
    program, cluster, backend, connector, project = (ready.program, ready.cluster, ready.backend, ready.connector,
                                                     ready.project)
    settings, policy = options.attempts, options.attempts.restart
    # a warm launch does not wait for the project's copy: it starts beside the launcher, each rank waiting for
    # its host's copy to end before its program runs (the copy's token: the bootstrap's gate)
    if options.staged is not None:      # a detached run's supervisor: staged by the command that detached it
        extra_env, copy, host_env = dict(options.staged.extra_env), None, dict(options.staged.host_env)
    else:
        extra_env, copy, host_env = ({}, None, {}) if settings.dry_run else stage(
            connector, options, program, project, events, beside=ready.warm, model=ready.model)
    if policy.elastic is not None:
        extra_env["CLUSTERCTL_ELASTIC_BATCH"] = policy.batch
    plan, preflight = plan_launch(cluster, connector, settings, program, needs_mpi=backend.needs_mpi)
    if ready.checks:       # and with what the pre-flight just found
        check_program(cluster, plan, program, project, options)
    return _attempts(ready, options, events, extra_env, copy, host_env, plan, preflight)


def plan_launch(cluster: Cluster, connector: Connector, settings: AttemptSettings, program: Program,
                needs_mpi: bool = False):
    """(the plan to launch from, the pre-flight Future verifying it meanwhile or None). `needs_mpi`: every
    host must have mpirun (the backend's daemons start there)."""
    if not settings.preflight:
        return LaunchPlan.from_inventory(cluster), None
    if settings.dry_run:
        return cached_plan(cluster) or discover(connector), None
    plan = cached_plan(cluster)

    def verify() -> LaunchPlan:
        return discover(connector, script=program.script, module=program.module, needs_mpi=needs_mpi)

    if plan is None:
        plan = verify()
        remember_plan(cluster, plan)
        return plan, None
    # Launch at once from the plan the last verified launch used; the pre-flight checks it once the ranks are up
    # (the supervisor starts it: launch/supervise.py _Preflight) and stops the job with the failing host named,
    # or launches again if the hosts changed.
    return plan, Deferred(verify)


def _attempts(ready: Ready, options: RunOptions, events: RunEvents, extra_env: dict[str, str], copy: BesideCopy | None,
              host_env: dict, plan: LaunchPlan, preflight) -> RunResult:
    """The job's attempts to their end, then what it produced brought home and its summary written."""
    program, settings = ready.program, options.attempts
    if not settings.watch.stall.enabled:
        extra_env["CLUSTERCTL_STALL"] = "off"      # nobody listens: the bundled trainer sends no step lines
    hooks = RunHooks(options, program, ready.backend, extra_env, events, ready.connector, copy, host_env)
    # one reader of the controller's stdin for every attempt (hosts/stdinfeed.py)
    # (a dry run reads none of it: StdinFeed.of looks into a pipe)
    stdin = StdinFeed.of(options.stdin) if program.kind.reads_stdin and not settings.dry_run else None
    attempts = Attempts(ready.backend, settings, hooks, ready.connector, program, stdin)
    try:
        launch, outcome = attempts.first(plan, preflight, copy.future if copy is not None else None)
        if outcome is None:
            return RunResult(launch, None)
        launch, outcome = attempts.restart_while_failing(launch, outcome)
        hooks.unwatch_hosts()           # the job is over: no more samples while its outputs come home
        _bring_home(attempts, launch, outcome, ready, options, events)
    except BaseException as e:
        hooks.unwatch_hosts()
        if hooks.record is not None:      # the run had started: its summary says how it ended, whatever that was
            _end_interrupted(hooks, e)
        raise
    result = RunResult(launch, outcome)
    hooks.end(result.exit_code, outcome.reason, outcome.failed_rank,
              stacks=os.path.relpath(outcome.stacks, launch.run_dir) if outcome.stacks else None,
              stopped=outcome.state is AttemptState.STOPPED)
    return result


def _bring_home(attempts: Attempts, launch: Launch, outcome: Outcome, ready: Ready, options: RunOptions,
                events: RunEvents) -> None:
    """After the last attempt, whatever its outcome: the first host's run directory (rank 0 runs there and says
    whether it left anything in it), the --fetch PATHs, and the loss picture of a program that draws one."""
    if options.fetch and not attempts.cluster.hosts[0].local and outcome.rank0_wrote is not False:
        fetch_run(attempts.connector, launch, ready.program, events)
    if ready.fetch_paths:
        fetch_paths(attempts.connector, launch, ready.fetch_paths, ready.project, options.fetch_all_ranks, events)
    if ready.program.kind.pictures_loss:
        plot_losses(launch)


def _end_interrupted(hooks: RunHooks, e: BaseException) -> None:
    """The summary of a run that an exception ended: its exit code, what it was, whether the user stopped it."""
    hooks.end(getattr(e, "exit_code", EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else EXIT_FAILED),
              f"{type(e).__name__}: {e}" if not isinstance(e, ClusterctlError) else str(e),
              stopped=isinstance(e, (KeyboardInterrupt, SignalReceived)))
