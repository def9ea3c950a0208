"""`clusterctl run`, the use case, callable without click:

    stage -> plan / pre-flight -> launch site -> launch -> supervise -> fetch

    result = run(cluster_or_None, RunOptions(script="train.py", args=("--lr", "3e-4")), events)
    result.exit_code, result.outcome.reason, result.launch.run_dir

1. Stage: copy the project (the current directory), clusterctl itself (for a clusterctl module such as the
   bundled trainer) and each host's own dataset shards to the hosts, all at once (transfer/stage.py).
2. Plan: launch at once from the plan the last verified launch on this cluster used, while the pre-flight
   (every host reachable, with its python and the script or module in place) verifies it beside the
   starting job; with no cached plan, the pre-flight runs first (launch/plan.py).
3. Site: the launcher runs here when it is installed here, else on the first host (launch/launchers.py).
4. Attempts (launch/attempts.py): launch and supervise (launch/job.py, launch/supervise.py); when the
   pre-flight finds the hosts changed, the job is stopped and launched again from the fresh plan; with
   --max-restarts, a failed attempt is followed by the next. run feeds and hears them (_RunHooks).
5. Fetch: what the job wrote in its run directory on the first host comes home (checkpoints, metrics),
   and every `--fetch PATH` from rank 0's host, or from every host (transfer/fetch.py), whatever the outcome.
6. Record: runs/<id>/summary.json (exit code, reason, times) and the runs index (observe/record.py), and,
   for the bundled trainer, runs/<id>/loss.png when matplotlib is installed (observe/plot.py).

Everything the user sees goes through a RunEvents object (the CLI prints it; tests record it).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from typing import BinaryIO, Callable
from concurrent.futures import wait
from dataclasses import dataclass

from .transfer.shards import MANIFEST
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, ClusterctlError, NotOnHosts, ShardError, SignalReceived, UsageError
from .hosts.connector import Connector
from .hosts.fanout import GroupResult, in_background
from .hosts.stdinfeed import StdinFeed
from .hosts.transport import DEFAULT_CONNECT_TIMEOUT_S
from .inventory import Cluster
from .launch import backends
from .launch.attempts import AttemptHooks, Attempts, AttemptSettings, checkpoint_steps, steps_lost
from .launch.job import Launch, run_dir_of_ranks
from .launch.plan import LaunchPlan, cached_plan, discover, discover_with_paths, remember_plan
from .launch.restart import RestartPolicy
from .launch.site import LaunchSite
from .launch.stall import StallPolicy
from .launch.outcome import AttemptState, Outcome
from .observe.live import LiveRun
from .observe.plot import plot_run
from .observe.record import RunRecord, describe, iso
from .observe.runs import latest_checkpoint, read_metrics
from .transfer.fetch import Fetched, check_fetch_paths, fetch_outputs
from .trainer_contract import (DATA, HOST_MEMORY, MODEL, OUT, RESUME, STRATEGY, TRAINER_MODULE, add_run_flag, flag_value,
                               replace_flag,
                               step_dir_name)
from .transfer.stage import fetch_run_dir, ship_clusterctl, spread_checkpoint, stage_data, stage_project

BUNDLED_TRAINER = TRAINER_MODULE
DEFAULT_SLOTS = 2                     # `clusterctl run` without --hosts: two ranks on this machine
DEFAULT_BACKEND = "ring"


@dataclass(frozen=True)
class RunOptions:
    script: str | None = None         # a path (relative to the project, i.e. each host's workdir) ...
    args: tuple[str, ...] = ()
    module: str | None = None         # ... or a module; neither: the bundled trainer
    backend: str | None = None        # default: the inventory's launch.backend
    dry_run: bool = False             # describe the launch; start nothing, write nothing on any host
    preflight: bool = True
    rank0_only: bool = False
    start_timeout: float | None = None
    hang_timeout: float | None = None
    stall_timeout: float | None = None   # --stall-timeout: None adaptive, 0 off (launch/stall.py)
    runs_dir: str = "runs"
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    launch_from: str = "auto"
    launcher: str | None = None       # what starts the ranks; default: the backend's own (backends.get)
    sync: bool = True                 # copy the project (and clusterctl, for its modules) first
    fetch: bool = True                # bring the first host's run directory home afterwards
    fetch_paths: tuple[str, ...] = () # and these (relative to rank 0's workdir, or absolute there)
    fetch_all_ranks: bool = False     # fetch_paths from every host, into runs/<id>/host-<name>/
    data_dir: str | None = None       # shards from `clusterctl data prepare`
    all_shards: bool = False          # ... every shard to every host (the bundled trainer's balancing)
    project_dir: str | None = None    # default: the current directory
    restart: RestartPolicy = RestartPolicy()   # --max-restarts, --restart-delay, --elastic, --elastic-batch
    # the bundled trainer's checks (cli passes clusterctl.train.prelaunch.check_before_launch; run does not
    # know the trainer): (its args, world, host -> bytes, host -> CLUSTERCTL_HOST_MEMORY, rank 0's OS, project,
    # data dir), raising a BadInput for a run that cannot fit or whose fine-tuning inputs the ranks would refuse
    trainer_check: Callable[..., object] | None = None
    # a service (`clusterctl serve`): when its endpoint last answered a health request (time.monotonic()), the
    # stall watchdog's only progress (launch/stall.py); and what the run's record says of it (its URL, model)
    health: Callable[[], float | None] | None = None
    service: dict | None = None
    project: bool = True              # with sync: the project too (a service needs only clusterctl itself)
    # what every rank reads on its stdin, the same bytes to each, then EOF (docs/run.md#standard-input): the
    # CLI gives its own stdin unless --no-stdin; None, the default here: EOF at once (/dev/null)
    stdin: BinaryIO | None = None


@dataclass(frozen=True)
class Program:
    """What every rank runs: a script path, or "-m" with a module first in `args`."""

    script: str | None                # the user's SCRIPT, None for a module
    module: str | None
    args: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.module or self.script

    @property
    def argv(self) -> tuple[str, list[str]]:
        """(bootstrap's script argument, its arguments): (path, args) or ("-m", [module, *args])."""
        return ("-m", [self.module, *self.args]) if self.module else (self.script, list(self.args))

    def rank_args(self, data_dir: str | None = None) -> list[str]:
        """The bootstrap's arguments after the script argument; the bundled trainer is told `--data DIR`
        first, DIR where run staged the shards (on a changed world, re-staged)."""
        if data_dir and self.module == BUNDLED_TRAINER:
            return [self.module, *add_run_flag(list(self.args), DATA, data_dir)]
        return self.argv[1]


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def program_for(script: str | None, args: tuple[str, ...], module: str | None) -> Program:
    """SCRIPT, `-m MODULE` or the bundled trainer, from run's arguments (pure). A module name is checked
    here, before anything starts: dotted Python identifiers, as `python -m` takes them."""
    if script is not None and script.startswith("-"):
        args, script = (script, *args), None     # `run -- --steps 100`: arguments for the default program
    if script is not None and module:
        raise UsageError("give a SCRIPT or --module, not both")
    if module is not None and not _MODULE_NAME.fullmatch(module):
        hint = (f"; to run the file, write `clusterctl run {module}`" if module.endswith(".py") or "/" in module
                else "")
        raise UsageError(f"-m {module!r} is not a module name (dotted Python identifiers, like pkg.train){hint}")
    if script is None:
        return Program(None, module or BUNDLED_TRAINER, tuple(args))
    return Program(script, None, tuple(args))


class RunEvents:
    """What `run` tells its user, one method per event; the base class says nothing."""

    def launching_from(self, host: str, launcher: str) -> None: ...
    def warning(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...
    def staged(self, what: str, hosts: int, files: int, nbytes: int) -> None: ...
    def started(self, launch: Launch, program: str, world: int, backend: str) -> None: ...
    def relaunching(self, launch: Launch, reason: str) -> None: ...
    def output(self, text: str, is_err: bool) -> None: ...
    def watching(self, launch: Launch, live: LiveRun) -> None: ...   # the ranks' live state, kept while supervised
    def watched(self, launch: Launch) -> None: ...                   # supervision ended, whatever the way
    def fetched(self, launch: Launch, host: str, remote_dir: str, files: int, nbytes: int) -> None: ...
    def fetch_failed(self, launch: Launch, host: str, remote_dir: str, error: BaseException) -> None: ...
    def outputs_fetched(self, launch: Launch, fetched: list[Fetched]) -> None: ...
    def restarting(self, launch: Launch, restart: int, max_restarts: int, reason: str, delay_s: float) -> None: ...
    def reshaped(self, hosts: list[str], world: int, lost: dict[str, str]) -> None: ...
    def spread(self, step: str, holder: str, hosts: list[str]) -> None: ...


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
    program = program_for(options.script, options.args, options.module)
    fetch_paths = check_fetch_paths(options.fetch_paths)          # a bad PATH: refused before anything starts
    if options.fetch_all_ranks and not fetch_paths:
        raise UsageError("--fetch-all-ranks says from where; --fetch PATH says what: give both")
    project = os.path.abspath(options.project_dir or os.getcwd())
    if cluster is None:     # this machine, working where run was started: a relative SCRIPT is the one here
        cluster = Cluster.this_machine(project, slots=DEFAULT_SLOTS, backend=DEFAULT_BACKEND)
    program = _resume_latest(program, cluster, options.runs_dir, events)
    backend = backends.get(options.backend or cluster.launch.backend, options.launcher)
    backend.check(cluster)       # --backend may ask for more than the inventory's own backend (jaccl: rdma lists)
    if backend.env_on_command_line and cluster.secrets:
        events.warning(f"{backend.launcher_label} takes the ranks' environment on its command line: the inventory's "
                       "secret env values are visible in `ps` on this machine and the hosts while the job runs "
                       "(clusterctl's own launchers never do that: docs/security.md#where-secrets-go)")
    policy = options.restart
    policy.check(world=cluster.world_size, backend=backend.name, preflight=options.preflight,
                 bundled_fsdp=program.module == BUNDLED_TRAINER and flag_value(program.args, STRATEGY) == "fsdp")
    connector = Connector(cluster, connect_timeout=options.connect_timeout)
    trainer = program.module == BUNDLED_TRAINER and not options.dry_run and options.trainer_check is not None
    if trainer:      # what is known before anything moves: the last plan's memory, the inventory's overrides
        _check_trainer(cluster, cached_plan(cluster) or LaunchPlan.from_inventory(cluster), program, project, options)
    uncopied = [(flag, path) for flag, path, copied in _trainer_inputs(program, options, project) if not copied]
    if uncopied and options.preflight and not options.dry_run and not all(h.local for h in cluster.hosts):
        _check_on_hosts(connector, uncopied, options)
    extra_env = {} if options.dry_run else stage(connector, options, program, project, events)
    if policy.elastic is not None:
        extra_env["CLUSTERCTL_ELASTIC_BATCH"] = policy.batch
    plan, preflight = _plan(cluster, connector, options, program, needs_mpi=backend.needs_mpi)
    if trainer:      # and with what the pre-flight just found
        _check_trainer(cluster, plan, program, project, options)
    if not StallPolicy.parse(options.stall_timeout).enabled:
        extra_env["CLUSTERCTL_STALL"] = "off"      # nobody listens: the bundled trainer sends no step lines
    hooks = _RunHooks(options, program, backend, extra_env, events, connector)
    attempts = Attempts(backend, policy, _attempt_settings(options, program), hooks, connector)
    try:
        launch, outcome = attempts.first(plan, preflight)
        if outcome is None:
            return RunResult(launch, None)
        launch, outcome = attempts.restart_while_failing(launch, outcome)
        # rank 0 runs on the first host and says whether it left anything in the run directory there
        if options.fetch and not attempts.cluster.hosts[0].local and outcome.rank0_wrote is not False:
            _fetch(attempts.connector, launch, events)
        if fetch_paths:
            events.outputs_fetched(launch, fetch_outputs(attempts.connector, fetch_paths, project, launch.run_dir,
                                                         all_ranks=options.fetch_all_ranks))
        if program.module == BUNDLED_TRAINER:
            _plot_losses(launch)
    except BaseException as e:
        if hooks.record is not None:      # the run had started: its summary says how it ended, whatever that was
            hooks.record.end(getattr(e, "exit_code", EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else EXIT_FAILED),
                             f"{type(e).__name__}: {e}" if not isinstance(e, ClusterctlError) else str(e),
                             stopped=isinstance(e, (KeyboardInterrupt, SignalReceived)))
        raise
    result = RunResult(launch, outcome)
    hooks.record.end(result.exit_code, outcome.reason, outcome.failed_rank,
                     stacks=os.path.relpath(outcome.stacks, launch.run_dir) if outcome.stacks else None,
                     stopped=outcome.state is AttemptState.STOPPED)
    return result


def _resume_latest(program: Program, cluster: Cluster, runs_dir: str, events: RunEvents) -> Program:
    """The bundled trainer's `--resume latest` without `--out`: under run every run has a directory of its own, so
    `latest` is the newest run here (in runs_dir) that holds a checkpoint, as its ranks name its directory
    (docs/trainer.md#resume); no such run is one line, exit 2."""
    if program.module != BUNDLED_TRAINER or flag_value(program.args, RESUME) != "latest" or flag_value(program.args, OUT):
        return program
    found = latest_checkpoint(runs_dir)
    if found is None:
        raise UsageError(f"--resume latest: no run in {runs_dir}/ holds a checkpoint (name one with --resume "
                         f"{runs_dir}/<id>, or start afresh without --resume)")
    run_id, step = found
    there = run_dir_of_ranks(cluster, run_id, os.path.abspath(os.path.join(runs_dir, run_id)))
    events.note(f"--resume latest: run {run_id}, from its {step} (--resume {there})")
    return Program(program.script, program.module, tuple(replace_flag(program.args, RESUME, there)))


def _attempt_settings(options: RunOptions, program: Program) -> AttemptSettings:
    return AttemptSettings(runs_dir=options.runs_dir, launch_from=options.launch_from,
                           dry_run=options.dry_run,
                           preflight=options.preflight, rank0_only=options.rank0_only,
                           start_timeout=options.start_timeout, hang_timeout=options.hang_timeout,
                           stall=StallPolicy.parse(options.stall_timeout, options.health),
                           script=program.script, module=program.module,
                           # one reader of the controller's stdin for every attempt (hosts/stdinfeed.py)
                           stdin=None if program.module == BUNDLED_TRAINER else StdinFeed.of(options.stdin))


class _RunHooks(AttemptHooks):
    """The attempts as `run` feeds them (the program, the data re-staged for a new world, the checkpoint a
    restart continues from), tells them (its events) and records them (runs/<id>/summary.json)."""

    def __init__(self, options: RunOptions, program: Program, backend, extra_env: dict[str, str], events: RunEvents,
                 whole: Connector):
        self.options, self.program, self.backend, self.events = options, program, backend, events
        self.whole = whole                  # the inventory's hosts, all of them: a re-stage narrows it
        self.extra_env = extra_env          # CLUSTERCTL_DATA_DIR: where stage() (or a re-stage) put the shards
        self.policy = options.restart
        self.record: RunRecord | None = None
        self.resume_point: int | None = None  # the checkpoint step the attempt about to start continues from

    def ranks(self) -> tuple[str, list[str], dict[str, str]]:
        script, _ = self.program.argv
        return script, self.program.rank_args(self.extra_env.get("CLUSTERCTL_DATA_DIR")), self.extra_env

    def launching_from(self, site: LaunchSite) -> None:
        self.events.launching_from(site.name, self.backend.launcher_label)

    def started(self, launch: Launch, cluster: Cluster) -> None:
        self.events.started(launch, self.program.label, cluster.world_size, launch.backend)
        if self.record is None:
            self.record = RunRecord.start(launch.run_id, launch.run_dir, world=cluster.world_size,
                                          backend=launch.backend, hosts=[h.name for h in cluster.hosts],
                                          program=self.program.label, service=self.options.service,
                                          described=describe(self.program.module, self.program.args,
                                                             self.options.service))

    def watching(self, launch: Launch):
        live = LiveRun(launch.rank_hosts, time.monotonic())
        self.events.watching(launch, live)
        return live.update

    def output(self, text: str, is_err: bool) -> None:
        self.events.output(text, is_err)

    def watched(self, launch: Launch) -> None:
        self.events.watched(launch)

    def relaunching(self, launch: Launch, outcome: Outcome, restartable: bool) -> None:
        self.events.relaunching(launch, outcome.reason)
        if not restartable:    # today's behaviour: the launch from the fresh plan is a run of its own
            self.record.end(outcome.exit_code, outcome.reason)
            self.record = None

    def attempted(self, attempt: int, cluster: Cluster, launch: Launch, outcome: Outcome, started: float) -> None:
        resumed_from = None if self.resume_point is None else step_dir_name(self.resume_point)
        self.record.attempt(attempt_record(attempt, cluster, launch, outcome, started, resumed_from))

    def restarting(self, launch: Launch, restart: int, reason: str) -> None:
        self.events.restarting(launch, restart, self.policy.max_restarts, reason, self.policy.delay_s)

    def recheck_failed(self, restart: int, error: ClusterctlError) -> None:
        self.record.attempt({"attempt": restart, "outcome": "pre-flight failed", "reason": str(error),
                             "exit_code": error.exit_code, "started": iso(time.time())})

    def reshaped(self, cluster: Cluster, lost: dict[str, str], run_dir: str) -> None:
        """--data on a changed world: every rank reads one equal shard, and the ranks that remain are
        numbered again, so the shards are re-prepared (cut again from the same tokens, data.shards.reshard,
        into runs/<id>/data-world-N/) and each host is sent its new ones; the data directory's name on the
        hosts stays the same."""
        self.events.reshaped(cluster.names, cluster.world_size, lost)
        if self.options.data_dir:
            self.extra_env["CLUSTERCTL_DATA_DIR"] = stage_data(
                self.whole.narrowed(cluster), self.options.data_dir,
                reshard_into=os.path.join(run_dir, f"data-world-{cluster.world_size}"), all_shards=self.options.all_shards)

    def resuming(self, connector: Connector, launch: Launch) -> None:
        """For the bundled trainer: the checkpoint the next attempt continues from (the newest any of its hosts
        holds, as the trainer picks it) and so the steps the failed attempt lost."""
        if self.program.module != BUNDLED_TRAINER:
            return
        steps = checkpoint_steps(connector, launch)
        step = max((s for s in steps.values() if s is not None), default=None)
        self.resume_point = step
        self.record.lost(steps_lost(launch.log_dir, step))
        lacking = [h for h in connector.cluster.hosts if steps.get(h.name) != step]
        if step is not None and lacking:     # a host that was away while it was written, back for this restart
            holder = next(h for h in connector.cluster.hosts if steps.get(h.name) == step)
            scratch = tempfile.mkdtemp(prefix=".spread-", dir=launch.run_dir)
            try:
                spread_checkpoint(connector, launch.run_id, step_dir_name(step), holder, lacking, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            self.events.spread(step_dir_name(step), holder.name, [h.name for h in lacking])


_RECORDED = {AttemptState.SUCCEEDED: "ok", AttemptState.STOPPED: "stopped", AttemptState.STALLED: "stalled"}  # or "failed"


def attempt_record(attempt: int, cluster: Cluster, launch: Launch, outcome: Outcome, started: float,
                   resumed_from: str | None) -> dict:
    """One attempt, as summary.json lists it (docs/run.md#restarts-and-elastic-runs)."""
    failed = outcome.failed_rank
    return {"attempt": attempt, "world": cluster.world_size, "hosts": cluster.names, "started": iso(started),
            "ended": iso(time.time()), "outcome": _RECORDED.get(outcome.state, "failed"), "exit_code": outcome.exit_code,
            "reason": outcome.reason, "failed_rank": failed,
            "failed_host": launch.rank_hosts[failed] if failed is not None and failed < len(launch.rank_hosts) else None,
            "last_lines": outcome.tail, "resumed_from": resumed_from, "log_dir": os.path.basename(launch.log_dir),
            **({"stacks": os.path.relpath(outcome.stacks, launch.run_dir)} if outcome.stacks else {})}


def _plot_losses(launch: Launch) -> None:
    """runs/<id>/loss.png when matplotlib is installed; a plot never fails the run it pictures."""
    try:
        plot_run(launch.run_dir, read_metrics(launch.run_dir), launch.run_id)
    except (OSError, ValueError, RuntimeError, ImportError, ClusterctlError):
        pass      # a picture of the run is a convenience (matplotlib broken, disk full): not the run's failure


def _check_trainer(cluster: Cluster, plan: LaunchPlan, program: Program, project: str, options: RunOptions) -> None:
    """Refuse a bundled-trainer run whose memory estimate exceeds the smallest host's, before any rank starts
    (docs/trainer.md#memory-planning), or whose --model / --data fine-tuning inputs the ranks would refuse
    (docs/finetune.md): options.trainer_check raises (exit 2)."""
    overrides = {h.name: h.env_dict[HOST_MEMORY] for h in cluster.hosts if h.env_dict.get(HOST_MEMORY)}
    options.trainer_check(program.args, cluster.world_size, plan.memory, overrides, plan.first_os, project,
                         options.data_dir)


def _plan(cluster: Cluster, connector: Connector, options: RunOptions, program: Program, needs_mpi: bool = False):
    """(the plan to launch from, the pre-flight Future verifying it meanwhile or None). `needs_mpi`: every
    host must have mpirun (the backend's daemons start there)."""
    if not options.preflight:
        return LaunchPlan.from_inventory(cluster), None
    if options.dry_run:
        return cached_plan(cluster) or discover(connector), None
    plan = cached_plan(cluster)

    def verify() -> LaunchPlan:
        return discover(connector, script=program.script, module=program.module, needs_mpi=needs_mpi)

    if plan is None:
        plan = verify()
        remember_plan(cluster, plan)
        return plan, None
    # Launch at once from the plan the last verified launch used; the pre-flight checks it meanwhile and
    # stops the job with the failing host named, or launches again if the hosts changed.
    return plan, in_background(verify)


def stage(connector: Connector, options: RunOptions, program: Program, project: str, events: RunEvents) -> dict[str, str]:
    """Copy what the job needs to the connector's hosts before launching, the project, clusterctl and the
    shards at once (they are independent); returns the ranks' extra environment."""
    if options.data_dir and not os.path.isfile(os.path.join(options.data_dir, MANIFEST)):
        # the trap of an option both accept: say whose --data this was (docs/run.md#the-command-line)
        what = "no such directory" if not os.path.isdir(options.data_dir) else f"no {MANIFEST} there"
        raise ShardError(f"--data {options.data_dir}: {what}. This --data is clusterctl's, for shards from "
                         f"`clusterctl data prepare`, because it came before the program; if it was meant for "
                         f"{program.label}, write it after {program.label}")
    jobs = {}
    if options.sync and options.project:
        needed = tuple(path for _, path, copied in _trainer_inputs(program, options, project) if copied)
        jobs["project"] = in_background(stage_project, connector, project, needed)
    if options.sync:
        if program.module is not None and program.module.startswith("clusterctl."):
            jobs["clusterctl"] = in_background(ship_clusterctl, connector)
    if options.data_dir:
        jobs["data"] = in_background(stage_data, connector, options.data_dir, all_shards=options.all_shards)
    wait(jobs.values())
    for future in jobs.values():      # the first failure, after every copy has ended
        future.result()
    for what in ("project", "clusterctl"):
        group: GroupResult | None = jobs[what].result() if what in jobs else None
        if group is not None:
            events.staged(what, len(group), sum(len(o.value.moved) for o in group.values()),
                          sum(o.value.moved_bytes for o in group.values()))
    return {"CLUSTERCTL_DATA_DIR": jobs["data"].result()} if "data" in jobs else {}


def _trainer_inputs(program: Program, options: RunOptions, project: str) -> list[tuple[str, str, bool]]:
    """(flag, path, whether run copies it with the project) for what the bundled trainer reads: its --model, and
    its --data when run gives none. A relative path inside the project is copied (unless --no-sync); an absolute
    one, or one that leads out of the project, must be on every host already (the ranks read it as given, from
    their workdir)."""
    if program.module != BUNDLED_TRAINER:
        return []
    flags = (MODEL,) if options.data_dir else (MODEL, DATA)
    root = os.path.realpath(project)
    found = []
    for flag in flags:
        path = flag_value(program.args, flag)
        if path:
            inside = not os.path.isabs(path) and \
                not os.path.relpath(os.path.realpath(os.path.join(root, path)), root).startswith(os.pardir)
            found.append((flag, path, inside and options.sync and options.project))
    return found


def _check_on_hosts(connector: Connector, uncopied: list[tuple[str, str]], options: RunOptions) -> None:
    """The pre-flight's probe, run before anything is copied when the bundled trainer reads paths run does not
    copy (`uncopied`: (flag, path)): each must be a directory on every host, or the run is refused with the
    hosts that lack it named (NotOnHosts, exit 2) instead of every rank failing after the copy. The plan it
    finds is kept, so the launch's own pre-flight verifies it beside the starting job instead of first."""
    plan, missing = discover_with_paths(connector, [path for _, path in uncopied])
    remember_plan(connector.cluster, plan)
    for flag, path in uncopied:
        hosts = missing.get(path)
        if not hosts:
            continue
        names = ", ".join(hosts)
        if not options.sync and not os.path.isabs(path):
            why, fix = "--no-sync copies nothing", "drop --no-sync, or run `clusterctl sync` first"
        else:
            where = path if os.path.isabs(path) else f"{path} from the workdir"
            why = "run copies only the project, and this path is outside it"
            fix = f"put it in the project and give its path there, or copy it to {where} on {names}"
        raise NotOnHosts(f"{flag} {path}: no such directory on {names} ({why}): {fix} (--no-preflight skips this check)")


def _fetch(connector: Connector, launch: Launch, events: RunEvents) -> None:
    """Bring home what the job left in its run directory on the first host (checkpoints, metrics)."""
    host = connector.cluster.hosts[0]
    remote_dir = connector.run_dir(host, launch.run_id) + "/"
    try:
        files, nbytes = fetch_run_dir(connector, launch.run_id, launch.run_dir)
    except (OSError, EOFError, ClusterctlError) as e:   # reported; the files stay on the host
        events.fetch_failed(launch, host.name, remote_dir, e)
        return
    if files:
        events.fetched(launch, host.name, remote_dir, files, nbytes)
