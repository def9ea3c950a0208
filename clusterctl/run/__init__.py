"""`clusterctl run`, the use case, callable without click:

    stage -> plan / pre-flight -> launch site -> launch -> supervise -> fetch

    result = run(cluster_or_None, RunOptions(script="train.py", args=("--lr", "3e-4")), events)
    result.exit_code, result.outcome.reason, result.launch.run_dir

What the program needs (inputs, stdin, how it resumes, its checks, what it is) its kind says (program.py; the
bundled trainer's is trainer_program.py): run never asks a program's name. How each attempt is launched and
watched is one AttemptSettings (launch/attempts.py), made by the caller and handed down as it is.

1. Stage: copy the project (the current directory), clusterctl itself (for a clusterctl module such as the
   bundled trainer) and each host's own dataset shards to the hosts, all at once (transfer/stage.py).
2. Plan: launch at once from the plan the last verified launch on this cluster used, while the pre-flight
   (every host reachable, with its python and the script or module in place) verifies it beside the
   starting job; with no cached plan, the pre-flight runs first (launch/plan.py).
3. Site: the launcher runs here when it is installed here, else on the first host (launch/launchers.py).
4. Attempts (launch/attempts.py): launch and supervise (launch/job.py, launch/supervise.py); when the
   pre-flight finds the hosts changed, the job is stopped and launched again from the fresh plan; with
   --max-restarts, a failed attempt is followed by the next. run feeds and hears them (run/hooks.py).
5. Fetch: what the job wrote in its run directory on the first host comes home (checkpoints, metrics),
   and every `--fetch PATH` from rank 0's host, or from every host (transfer/fetch.py), whatever the outcome.
6. Record: runs/<id>/summary.json (exit code, reason, times) and the runs index (observe/record.py), and,
   for the bundled trainer, runs/<id>/loss.png when matplotlib is installed (observe/plot.py).

While the job runs (step 4), the hosts' telemetry is sampled every few seconds (observe/hostwatch.py): for the
live panel, and to tell (events.host_flagged) and record (runs/<id>/hosts.jsonl) a host that starts or stops
swapping or being throttled.

Everything the user sees goes through a RunEvents object (the CLI prints it; tests record it).
"""
from __future__ import annotations

import os
import re
import secrets
from contextlib import contextmanager
from functools import partial
from typing import BinaryIO, Callable, Iterator, Mapping, Sequence
from concurrent.futures import wait
from dataclasses import dataclass, replace

from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, ClusterctlError, ShardError, SignalReceived, UsageError
from ..hosts.connector import Connector
from ..hosts.fanout import Deferred, GroupResult, in_background
from ..hosts.stdinfeed import StdinFeed
from ..hosts.transport import DEFAULT_CONNECT_TIMEOUT_S
from ..inventory import Cluster
from ..launch import backends
from ..launch.attempts import Attempts, AttemptSettings
from ..launch.job import Launch, run_dir_of_ranks
from ..launch.plan import LaunchPlan, cached_plan, check_inputs_on_hosts, discover, remember_plan
from ..launch.outcome import AttemptState, Outcome
from ..observe.hostwatch import HostEvent
from ..observe.live import LiveRun
from ..observe.runs import latest_checkpoint
from ..program import Capabilities, PlannedLaunch, Program, kind_of
from ..trainer_contract import MODEL_DIR_ENV
from ..trainer_program import BundledTrainer
from ..transfer import hub
from ..transfer.fetch import Fetched, check_fetch_paths, fetch_outputs
from ..transfer.stage import fetch_run_dir, project_copy, ship_clusterctl, stage_data, stage_project
from .hooks import RunHooks, plot_losses

# `clusterctl run` (and serve) without --hosts: this machine alone, over MLX's ring (no MPI needed), two ranks
THIS_MACHINE_BACKEND = "ring"
DEFAULT_SLOTS = 2


# while a job runs, its hosts' telemetry is sampled this often (less often than `top`'s 3 s: a probe starts a Python
# on each host, a cost the run pays while it trains; docs/run.md#the-live-panel)
HOST_SAMPLE_S = 5.0

@dataclass(frozen=True)
class RunOptions:
    script: str | None = None         # a path (relative to the project, i.e. each host's workdir) ...
    args: tuple[str, ...] = ()
    module: str | None = None         # ... or a module; neither: the bundled trainer
    backend: str | None = None        # default: the inventory's launch.backend
    launcher: str | None = None       # what starts the ranks; default: the backend's own (backends.get)
    # how every attempt is launched and watched (runs_dir, launch_from, dry_run: describe the launch, start and
    # write nothing on any host; preflight, restart, the supervisor's watch): handed to the attempts as it is
    attempts: AttemptSettings = AttemptSettings()
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    sync: bool = True                 # copy the project (and clusterctl, for its modules) first
    fetch: bool = True                # bring the first host's run directory home afterwards
    fetch_paths: tuple[str, ...] = () # and these (relative to rank 0's workdir, or absolute there)
    fetch_all_ranks: bool = False     # fetch_paths from every host, into runs/<id>/host-<name>/
    data_dir: str | None = None       # shards from `clusterctl data prepare`
    all_shards: bool = False          # ... every shard to every host (the bundled trainer's balancing)
    direct_model: bool = False        # the program's model to each host from here, not relayed host to host
    env: tuple[tuple[str, str], ...] = ()  # run --env: every rank's, over the inventory's (parse_env_options)
    project_dir: str | None = None    # default: the current directory
    # what every rank reads on its stdin, the same bytes to each, then EOF (docs/run.md#standard-input), when
    # its kind reads stdin: the CLI gives its own stdin unless --no-stdin; None, the default here: EOF at once
    stdin: BinaryIO | None = None
    # the kinds of program run knows by the module they are (program.Capabilities): the bundled trainer (the CLI
    # gives it its checks before a launch, train/prelaunch.py; run never imports train/), or serve's Service;
    # any other program is a program of the user's (program.ANY_PROGRAM)
    kinds: tuple[Capabilities, ...] = (BundledTrainer(),)
    # the hosts' telemetry sampled every this many seconds while the job runs (observe/hostwatch.py: the live panel's
    # host rows, a host swapping or throttled told and recorded); None: not sampled
    telemetry_interval: float | None = HOST_SAMPLE_S
    # a detached run's supervisor: what the command that detached it staged (run/detached.py); run stages nothing
    staged: Staged | None = None


@dataclass(frozen=True)
class Staged:
    """What staging gave the ranks, when another process staged the run: every rank's extra environment and each
    host's own (where its ranks read the program's model)."""

    extra_env: Mapping[str, str]
    host_env: Mapping[str, Mapping[str, str]]


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_options(given: Sequence[str], here: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """run --env's words, NAME=VALUE or NAME (this machine's value, from `here`), as (name, value) pairs, the
    last of a name winning (pure). A name that is not a variable name, or a bare NAME not set here, is refused in
    one line: a variable a user meant to send must not silently not arrive."""
    out: dict[str, str] = {}
    for word in given:
        name, eq, value = word.partition("=")
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--env {word}: {name!r} is not a variable name (letters, digits and _, not starting "
                             "with a digit); write --env NAME=VALUE, or --env NAME for this machine's value")
        if not eq:
            if name not in here:
                raise UsageError(f"--env {name}: {name} is not set on this machine; give its value (--env "
                                 f"{name}=VALUE) or set it here first")
            value = here[name]
        out[name] = value
    return tuple(out.items())


def program_for(script: str | None, args: tuple[str, ...], module: str | None,
                kinds: tuple[Capabilities, ...] = RunOptions.kinds) -> Program:
    """SCRIPT, `-m MODULE` or the bundled trainer, from run's arguments (pure), of the kind `kinds` know its
    module as. A module name is checked here, before anything starts: dotted Python identifiers, as `python -m`
    takes them."""
    if script is not None and script.startswith("-"):
        args, script = (script, *args), None     # `run -- --steps 100`: arguments for the default program
    if script is not None and module:
        raise UsageError("give a SCRIPT or --module, not both")
    if module is not None and not _MODULE_NAME.fullmatch(module):
        hint = (f"; to run the file, write `clusterctl run {module}`" if module.endswith(".py") or "/" in module
                else "")
        raise UsageError(f"-m {module!r} is not a module name (dotted Python identifiers, like pkg.train){hint}")
    if script is None:
        module = module or BundledTrainer.module
        return Program(None, module, tuple(args), kind_of(module, kinds))
    return Program(script, None, tuple(args))


class RunEvents:
    """What `run` tells its user, one method per event; the base class says nothing."""

    def launching_from(self, host: str, launcher: str) -> None: ...
    def warning(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...
    def staged(self, what: str, hosts: int, files: int, nbytes: int) -> None: ...
    # the program's model (its kind's `store_model`) in a host's store: the StoreEntry, None for this machine, which reads
    # the model where it is
    def model_stored(self, host: str, entry, path: str) -> None: ...
    def model_progress(self, host: str, done: int, total: int) -> None: ...   # bytes of the model's copy to a host
    # bytes of another long copy to or from a host, as it runs: `what` is "project" (run's copy of it), "data" (the
    # shards) or "fetch" (the run directory, then the --fetch PATHs); `total`: what it moves at most, as known before
    # it started (a host's last report is (moved, moved)); copy_ended: that copy has ended, whatever the way
    def copy_progress(self, what: str, host: str, done: int, total: int) -> None: ...
    def copy_ended(self, what: str) -> None: ...
    def model_route(self, lines: list[str]) -> None: ...     # how the model's bytes will travel (before they move)
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
    # a restart after a data-plane fault waits for the hosts to reach each other: what does not work, then how long
    # it took (None: not within limit_s)
    def data_plane_down(self, launch: Launch, restart: int, broken: list[str], limit_s: float) -> None: ...
    def data_plane_up(self, launch: Launch, restart: int, waited_s: float | None, limit_s: float) -> None: ...
    def spread(self, step: str, holder: str, hosts: list[str]) -> None: ...
    # a host started or stopped swapping or being throttled while the job ran (told once per change; from a thread
    # of its own)
    def host_flagged(self, event: HostEvent) -> None: ...


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


@dataclass(frozen=True)
class Ready:
    """A run checked and resolved, before anything moves (_ready): what run and a detached run's start share."""

    program: Program
    cluster: Cluster
    backend: backends.Backend
    connector: Connector
    project: str
    fetch_paths: tuple[str, ...]
    model: str | None          # the program's model as a directory here, which staging puts into the hosts' stores
    checks: bool               # the program's own checks before a launch apply
    warm: bool                 # a cached plan: launch at once, the pre-flight beside it


def run(cluster: Cluster | None, options: RunOptions, events: RunEvents = RunEvents()) -> RunResult:
    ready = _ready(cluster, options, events)
    program, cluster, backend, connector, project = (ready.program, ready.cluster, ready.backend, ready.connector,
                                                     ready.project)
    settings, policy, checks = options.attempts, options.attempts.restart, ready.checks
    # a warm launch does not wait for the project's copy: it starts beside the launcher, each rank waiting for
    # its host's copy to end before its program runs (the copy's token: the bootstrap's gate)
    if options.staged is not None:      # a detached run's supervisor: staged by the command that detached it
        extra_env, copy, host_env = dict(options.staged.extra_env), None, dict(options.staged.host_env)
    else:
        extra_env, copy, host_env = ({}, None, {}) if settings.dry_run else stage(
            connector, options, program, project, events, beside=ready.warm, model=ready.model)
    if policy.elastic is not None:
        extra_env["CLUSTERCTL_ELASTIC_BATCH"] = policy.batch
    plan, preflight = _plan(cluster, connector, settings, program, needs_mpi=backend.needs_mpi)
    if checks:       # and with what the pre-flight just found
        _check_program(cluster, plan, program, project, options)
    return _attempts(ready, options, events, extra_env, copy, host_env, plan, preflight)


def _ready(cluster: Cluster | None, options: RunOptions, events: RunEvents) -> Ready:
    """Everything run checks and resolves before anything moves: the program, the cluster (--env, data-plane
    addresses), the backend's and the restart policy's refusals, the program's own checks on the last plan, and
    the inputs that must already be on the hosts."""
    program = program_for(options.script, options.args, options.module, options.kinds)
    settings = options.attempts
    fetch_paths = check_fetch_paths(options.fetch_paths)          # a bad PATH: refused before anything starts
    if options.fetch_all_ranks and not fetch_paths:
        raise UsageError("--fetch-all-ranks says from where; --fetch PATH says what: give both")
    project = os.path.abspath(options.project_dir or os.getcwd())
    if cluster is None:     # this machine, working where run was started: a relative SCRIPT is the one here
        cluster = Cluster.this_machine(project, slots=DEFAULT_SLOTS, backend=THIS_MACHINE_BACKEND)
    cluster = cluster.with_env(dict(options.env))    # the inventory's env and --env's go the same way from here
    program = _resume_latest(program, cluster, settings.runs_dir, events)
    backend = backends.get(options.backend or cluster.launch.backend, options.launcher)
    if backend.needs_addresses and any(not h.address and not h.local for h in cluster.hosts):
        cluster = _addresses_from_ssh(cluster, backend.name, events)
    backend.check(cluster)       # --backend may ask for more than the inventory's own backend (jaccl: rdma lists)
    if backend.env_on_command_line and cluster.secrets:
        events.warning(f"{backend.launcher_label} takes the ranks' environment on its command line: the inventory's "
                       "secret env values are visible in `ps` on this machine and the hosts while the job runs "
                       "(clusterctl's own launchers never do that: docs/security.md#where-secrets-go)")
    policy = settings.restart
    policy.check(world=cluster.world_size, backend=backend.name, preflight=settings.preflight,
                 shrink_refusal=program.kind.shrink_refusal(program.args))
    # hosts are resolved (`ssh -G`, a process each) when first needed: a launch from a cached plan that the
    # pre-flight verifies through OpenSSH's own connections may never need them; a first launch resolves them
    # now, so that a host ssh cannot use is named before anything moves
    warm = settings.preflight and not settings.dry_run and cached_plan(cluster) is not None
    connector = Connector(cluster, connect_timeout=options.connect_timeout, lazy=warm)
    staged = options.staged is not None      # the model is in the hosts' stores already (Staged.host_env)
    program, model = (program, None) if settings.dry_run or staged else _model_here(program, project)
    # a supervisor's checks ran where the run was detached from (its paths are that machine's)
    checks = program.kind.checks_before_launch and not settings.dry_run and not staged
    if checks:       # what is known before anything moves: the last plan's memory, the inventory's env
        _check_program(cluster, cached_plan(cluster) or LaunchPlan.from_inventory(cluster), program, project, options)
    uncopied = [(flag, path) for flag, path, copied in _program_inputs(program, options, project) if not copied]
    given = program.kind.store_model(program.args)
    if given is not None and model is None and not settings.dry_run and not staged:   # not here: on every host
        uncopied.append(("model", given))
    if uncopied and settings.preflight and not settings.dry_run and not all(h.local for h in cluster.hosts):
        check_inputs_on_hosts(connector, uncopied, synced=options.sync)
    return Ready(program, cluster, backend, connector, project, fetch_paths, model, checks, warm)


def _attempts(ready: Ready, options: RunOptions, events: RunEvents, extra_env: dict[str, str], copy,
              host_env: dict, plan: LaunchPlan, preflight) -> RunResult:
    """The job's attempts to their end, then what it produced brought home and its summary written."""
    program, connector, project, fetch_paths = ready.program, ready.connector, ready.project, ready.fetch_paths
    settings, backend = options.attempts, ready.backend
    if not settings.watch.stall.enabled:
        extra_env["CLUSTERCTL_STALL"] = "off"      # nobody listens: the bundled trainer sends no step lines
    hooks = RunHooks(options, program, backend, extra_env, events, connector, copy, host_env)
    # one reader of the controller's stdin for every attempt (hosts/stdinfeed.py)
    # (a dry run reads none of it: StdinFeed.of looks into a pipe)
    stdin = StdinFeed.of(options.stdin) if program.kind.reads_stdin and not settings.dry_run else None
    attempts = Attempts(backend, settings, hooks, connector, program, stdin)
    try:
        launch, outcome = attempts.first(plan, preflight, copy.future if copy is not None else None)
        if outcome is None:
            return RunResult(launch, None)
        launch, outcome = attempts.restart_while_failing(launch, outcome)
        hooks.unwatch_hosts()           # the job is over: no more samples while its outputs come home
        # rank 0 runs on the first host and says whether it left anything in the run directory there
        if options.fetch and not attempts.cluster.hosts[0].local and outcome.rank0_wrote is not False:
            _fetch(attempts.connector, launch, events)
        if fetch_paths:
            with told(events, "fetch") as progress:
                fetched = fetch_outputs(attempts.connector, fetch_paths, project, launch.run_dir,
                                        all_ranks=options.fetch_all_ranks, progress=progress)
            events.outputs_fetched(launch, fetched)
        if program.kind.pictures_loss:
            plot_losses(launch)
    except BaseException as e:
        hooks.unwatch_hosts()
        if hooks.record is not None:      # the run had started: its summary says how it ended, whatever that was
            hooks.end(getattr(e, "exit_code", EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else EXIT_FAILED),
                      f"{type(e).__name__}: {e}" if not isinstance(e, ClusterctlError) else str(e),
                      stopped=isinstance(e, (KeyboardInterrupt, SignalReceived)))
        raise
    result = RunResult(launch, outcome)
    hooks.end(result.exit_code, outcome.reason, outcome.failed_rank,
              stacks=os.path.relpath(outcome.stacks, launch.run_dir) if outcome.stacks else None,
              stopped=outcome.state is AttemptState.STOPPED)
    return result


def _resume_latest(program: Program, cluster: Cluster, runs_dir: str, events: RunEvents) -> Program:
    """A program that asks for the latest checkpoint (the bundled trainer's `--resume latest` without `--out`):
    under run every run has a directory of its own, so `latest` is the newest run here (in runs_dir) that holds a
    checkpoint, as its ranks name its directory (docs/trainer.md#resume); no such run is one line, exit 2."""
    if not program.kind.asks_latest(program.args):
        return program
    found = latest_checkpoint(runs_dir)
    if found is None:
        raise UsageError(f"--resume latest: no run in {runs_dir}/ holds a checkpoint (name one with --resume "
                         f"{runs_dir}/<id>, or start afresh without --resume)")
    run_id, step = found
    there = run_dir_of_ranks(cluster, run_id, os.path.abspath(os.path.join(runs_dir, run_id)))
    events.note(f"--resume latest: run {run_id}, from its {step} (--resume {there})")
    return replace(program, args=tuple(program.kind.resuming_from(program.args, there)))


def _check_program(cluster: Cluster, plan: LaunchPlan, program: Program, project: str, options: RunOptions) -> None:
    """The program's own checks of the launch as planned, before any rank starts: the bundled trainer refuses a
    run whose memory estimate exceeds the smallest host's (docs/trainer.md#memory-planning), or whose --model /
    --data fine-tuning inputs the ranks would refuse (docs/finetune.md), in one line (exit 2)."""
    program.kind.check(PlannedLaunch(program.args, cluster.world_size, plan.memory,
                                     {h.name: h.env_dict for h in cluster.hosts}, plan.first_os, project,
                                     options.data_dir))


def _plan(cluster: Cluster, connector: Connector, settings: AttemptSettings, program: Program, needs_mpi: bool = False):
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


@dataclass(frozen=True)
class BesideCopy:
    """The project's copy, started with the launcher rather than before it (a warm launch: the plan cached,
    the copy most often one rsync round trip that moves nothing): `future` (a Deferred) copies, marking each
    host's copy as ended (transfer/stage.py project_copy), and says so (RunEvents.staged); the ranks of the
    launch it is beside wait for the mark of `token` (COPY_GATE_ENV) before their program runs."""

    token: str
    future: Deferred


def stage(connector: Connector, options: RunOptions, program: Program, project: str, events: RunEvents,
          beside: bool = False, model: str | None = None
          ) -> tuple[dict[str, str], BesideCopy | None, dict[str, dict[str, str]]]:
    """Copy what the job needs to the connector's hosts before launching, the project, clusterctl, the shards
    and the program's `model` (a directory here: into every other host's model store) at once (they are
    independent); returns the ranks' extra environment, with `beside` the project's copy to start with the
    launcher (BesideCopy: what the project's ignore rules leave out of it is refused here all the same, before
    anything moves), and each host's own environment (where its ranks read the model: MODEL_DIR_ENV)."""
    if options.data_dir and not os.path.isfile(os.path.join(options.data_dir, _manifest())):
        # the trap of an option both accept: say whose --data this was (docs/run.md#the-command-line)
        what = "no such directory" if not os.path.isdir(options.data_dir) else f"no {_manifest()} there"
        raise ShardError(f"--data {options.data_dir}: {what}. This --data is clusterctl's, for shards from "
                         f"`clusterctl data prepare`, because it came before the program; if it was meant for "
                         f"{program.label}, write it after {program.label}")
    jobs = {}
    copy = None
    if model is not None:
        jobs["model"] = in_background(_push_model, connector, model, events, options.direct_model)
    if options.sync and program.kind.copies_project:
        needed = tuple(path for _, path, copied in _program_inputs(program, options, project) if copied)
        inside = model is not None and _inside(project, model)
        excludes = (f"/{os.path.relpath(model, os.path.realpath(project))}/",) if inside else ()   # the store has it
        if beside:
            copy = _beside_copy(connector, project, needed, events, excludes)
        else:
            jobs["project"] = in_background(_told_copy, events, "project", stage_project, connector, project, needed,
                                            excludes)
    if options.sync and program.ships_clusterctl:
        jobs["clusterctl"] = in_background(ship_clusterctl, connector)
    if options.data_dir:
        jobs["data"] = in_background(_told_copy, events, "data", stage_data, connector, options.data_dir,
                                     all_shards=options.all_shards)
    wait(jobs.values())
    for future in jobs.values():      # the first failure, after every copy has ended
        future.result()
    for what in ("project", "clusterctl"):
        group: GroupResult | None = jobs[what].result() if what in jobs else None
        if group is not None:
            events.staged(what, len(group), sum(len(o.value.moved) for o in group.values()),
                          sum(o.value.moved_bytes for o in group.values()))
    host_env = {host: {MODEL_DIR_ENV: path} for host, path in jobs["model"].result().items()} if "model" in jobs else {}
    return ({"CLUSTERCTL_DATA_DIR": jobs["data"].result()} if "data" in jobs else {}), copy, host_env


def _addresses_from_ssh(cluster: Cluster, backend: str, events: RunEvents) -> Cluster:
    """Hosts with no data-plane `address` under a backend that needs every rank's (ring, jaccl): the IPv4 address
    ssh reaches each at (its HostName as `ssh -G` gives it, an alias's too, resolved here), said in a note. A host
    with none (a name this machine cannot resolve to IPv4) is left for the backend's own refusal."""
    from ..hosts.sshconfig import address_of, resolve_cluster

    targets = resolve_cluster(cluster)
    found = {h.name: address_of(targets[h.name]) for h in cluster.hosts if not h.address and not h.local}
    found = {name: address for name, address in found.items() if address}
    if found:
        events.note(f"{', '.join(found)} {'has' if len(found) == 1 else 'have'} no `address` in the inventory: the "
                    f"{backend} backend's ranks reach {'it' if len(found) == 1 else 'them'} where ssh does "
                    f"({', '.join(f'{n} {a}' for n, a in found.items())}); give `address:` if the data plane is "
                    "another network (Thunderbolt)")
    return cluster.with_addresses(found)


def _model_here(program: Program, project: str) -> tuple[Program, str | None]:
    """The model the program reads (its kind's `store_model`) as a directory here, which run puts into the hosts'
    stores, or None (none, or not here: then it must be on every host as given). A Hugging Face id is resolved in
    the hub's cache here (transfer/hub.py: downloaded into it first when need be) and the program's arguments
    then name that snapshot (what its records keep)."""
    given = program.kind.store_model(program.args)
    if given is None:
        return program, None
    resolved = hub.resolve(given, project)
    if resolved != given:
        program = replace(program, args=tuple(program.kind.with_store_model(program.args, resolved)))
    path = os.path.realpath(os.path.join(project, os.path.expanduser(resolved)))
    return program, path if os.path.isdir(path) else None


def _inside(project: str, path: str) -> bool:
    rel = os.path.relpath(path, os.path.realpath(project))
    return rel != os.curdir and not rel.startswith(os.pardir)


@contextmanager
def told(events: RunEvents, what: str) -> Iterator[Callable[[str, int, int], None]]:
    """A copy's progress(host, done, total) for the block, told as events.copy_progress(what, ...); its end told
    (events.copy_ended) however the block ends."""
    try:
        yield partial(events.copy_progress, what)
    finally:
        events.copy_ended(what)


def _told_copy(events: RunEvents, what: str, copy: Callable, *args, **kwargs):
    """copy(*args, **kwargs, progress=...) with its progress told (told)."""
    with told(events, what) as progress:
        return copy(*args, progress=progress, **kwargs)


def push_model(connector: Connector, model: str, events: RunEvents, **push) -> dict:
    """`model` (a directory here) into the store of every host but this machine, verified there (transfer/
    models.py: once; a model already there moves nothing, a cut-off push continues; relayed between the hosts
    unless `push` says direct; `push`: its method, verify, files, direct), the route, each host's progress and
    outcome told (events.model_route, model_progress, model_stored); host name -> its
    StoreEntry. This machine's ranks read the model where it is. serve pushes its model with it too."""
    from ..transfer import models as store

    remote = [h for h in connector.cluster.hosts if not h.local]
    try:
        entries = store.require_all(store.push(connector, remote, store.describe(model), progress=events.model_progress,
                                               on_route=lambda route: events.model_route(route.lines()),
                                               **push)) if remote else {}
    except BaseException:
        events.copy_ended("model")       # its progress stops before the line that says why
        raise
    for host in connector.cluster.hosts:
        entry = entries.get(host.name)
        events.model_stored(host.name, entry, entry.path if entry is not None else model)
    return entries


def _push_model(connector: Connector, model: str, events: RunEvents, direct: bool = False) -> dict[str, str]:
    """push_model, for run: host name -> where its ranks read the model (its store's copy), this machine's none;
    on this machine alone, nothing to push or say."""
    if all(h.local for h in connector.cluster.hosts):
        return {}
    return {name: entry.path for name, entry in push_model(connector, model, events, direct=direct).items()}


def _beside_copy(connector: Connector, project: str, needed: tuple[str, ...], events: RunEvents,
                 excludes: tuple[str, ...] = ()) -> BesideCopy | None:
    token = secrets.token_hex(8)
    progress = partial(events.copy_progress, "project")
    send = project_copy(connector, project, needed, gate=token, excludes=excludes, progress=progress)   # its refusals now
    if send is None:
        return None

    def copy() -> GroupResult:
        try:
            group = send()
        finally:
            events.copy_ended("project")
        events.staged("project", len(group), sum(len(o.value.moved) for o in group.values()),
                      sum(o.value.moved_bytes for o in group.values()))
        return group

    return BesideCopy(token, Deferred(copy))


def _manifest() -> str:
    from ..transfer.shards import MANIFEST    # here: not every run loads the shards' code (30 ms)
    return MANIFEST


def _program_inputs(program: Program, options: RunOptions, project: str) -> list[tuple[str, str, bool]]:
    """(flag, path, whether run copies it with the project) for the directories the program reads (its kind's
    inputs: the bundled trainer's --model, and its --data when run gives none). A relative path inside the
    project is copied (unless --no-sync); an absolute one, or one that leads out of the project, must be on
    every host already (the ranks read it as given, from their workdir)."""
    root = os.path.realpath(project)
    copies = options.sync and program.kind.copies_project
    found = []
    for flag, path in program.kind.inputs(program.args, run_gives_data=bool(options.data_dir)):
        inside = not os.path.isabs(path) and \
            not os.path.relpath(os.path.realpath(os.path.join(root, path)), root).startswith(os.pardir)
        found.append((flag, path, inside and copies))
    return found


def _fetch(connector: Connector, launch: Launch, events: RunEvents) -> None:
    """Bring home what the job left in its run directory on the first host (checkpoints, metrics)."""
    host = connector.cluster.hosts[0]
    remote_dir = connector.run_dir(host, launch.run_id) + "/"
    try:
        with told(events, "fetch") as progress:
            files, nbytes = fetch_run_dir(connector, launch.run_id, launch.run_dir, progress=progress)
    except (OSError, EOFError, ClusterctlError) as e:   # reported; the files stay on the host
        events.fetch_failed(launch, host.name, remote_dir, e)
        return
    if files:
        events.fetched(launch, host.name, remote_dir, files, nbytes)
