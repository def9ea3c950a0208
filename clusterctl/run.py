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
4. Launch and supervise (launch/job.py, launch/supervise.py); when the pre-flight finds the hosts changed,
   the job is stopped and launched again from the fresh plan.
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
from concurrent.futures import wait
from dataclasses import dataclass

from .transfer.shards import MANIFEST
from .errors import (EXIT_FAILED, EXIT_INTERRUPTED, ClusterctlError, RestartError, ShardError, SignalReceived,
                     UsageError)
from .hosts.connector import Connector
from .hosts.fanout import GroupResult, in_background, run_all
from .hosts.transport import DEFAULT_CONNECT_TIMEOUT_S, quote_path
from .inventory import Cluster
from .launch import backends
from .launch.job import Launch, prepare
from .launch.launchers import choose_site, sweep
from .launch.plan import LaunchPlan, cached_plan, discover, discover_reachable, remember_plan
from .launch.restart import RestartPolicy, bundled_strategy, checkpoint_step, last_step
from .launch.supervise import Outcome, signals_stop, stopped, supervise
from .observe.live import LiveRun
from .observe.plot import plot_run
from .observe.record import RunRecord, iso
from .observe.runs import read_metrics
from .transfer.fetch import Fetched, check_fetch_paths, fetch_outputs
from .transfer.stage import fetch_run_dir, ship_clusterctl, spread_checkpoint, stage_data, stage_project

BUNDLED_TRAINER = "clusterctl.train"
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
    runs_dir: str = "runs"
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    launch_from: str = "auto"
    launcher: str | None = None       # what starts the ranks; default: the backend's own (backends.get)
    sync: bool = True                 # copy the project (and clusterctl, for its modules) first
    fetch: bool = True                # bring the first host's run directory home afterwards
    fetch_paths: tuple[str, ...] = () # and these (relative to rank 0's workdir, or absolute there)
    fetch_all_ranks: bool = False     # fetch_paths from every host, into runs/<id>/host-<name>/
    data_dir: str | None = None       # shards from `clusterctl data prepare`
    project_dir: str | None = None    # default: the current directory
    restart: RestartPolicy = RestartPolicy()   # --max-restarts, --restart-delay, --elastic, --elastic-batch


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
    backend = backends.get(options.backend or cluster.launch.backend, options.launcher)
    backend.check(cluster)       # --backend may ask for more than the inventory's own backend (jaccl: rdma lists)
    policy = options.restart
    policy.check(world=cluster.world_size, backend=backend.name, preflight=options.preflight,
                 bundled_fsdp=program.module == BUNDLED_TRAINER and bundled_strategy(program.args) == "fsdp")
    args = list(program.argv[1])
    extra_env: dict[str, str] = {}
    if not options.dry_run:
        extra_env = stage(cluster, options, program, project, events)
        if options.data_dir and program.module == BUNDLED_TRAINER:
            args = [args[0], "--data", extra_env["CLUSTERCTL_DATA_DIR"], *args[1:]]
    if policy.elastic is not None:
        extra_env["CLUSTERCTL_ELASTIC_BATCH"] = policy.batch
    connector = Connector(cluster, connect_timeout=options.connect_timeout)
    plan, preflight = _plan(cluster, connector, options, program, needs_mpi=backend.needs_mpi)
    job = _Job(options, program, backend, args, extra_env, events, connector)
    launch, outcome = job.attempt(cluster, connector, plan, preflight)
    if outcome is None:
        return RunResult(launch, None)
    try:
        while policy.should_restart(outcome.stopped_by_user, outcome.exit_code, job.restarts):
            try:
                with signals_stop():
                    cluster, connector, plan = job.restart(launch, outcome, cluster, connector)
            except (KeyboardInterrupt, SignalReceived) as e:     # between attempts: nothing of the job runs
                outcome = stopped(e)
                outcome.reason += f" before restart {job.restarts}: nothing was running"
                break
            launch, outcome = job.attempt(cluster, connector, plan, None)
        # rank 0 runs on the first host and says whether it left anything in the run directory there
        if options.fetch and not cluster.hosts[0].local and outcome.rank0_wrote is not False:
            _fetch(connector, launch, events)
        if fetch_paths:
            events.outputs_fetched(launch, fetch_outputs(connector, fetch_paths, project, launch.run_dir,
                                                         all_ranks=options.fetch_all_ranks))
        if program.module == BUNDLED_TRAINER:
            _plot_losses(launch)
    except BaseException as e:
        job.record.end(getattr(e, "exit_code", EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else EXIT_FAILED),
                       f"{type(e).__name__}: {e}" if not isinstance(e, ClusterctlError) else str(e))
        raise
    result = RunResult(launch, outcome)
    job.record.end(result.exit_code, outcome.reason, outcome.failed_rank)
    return result


class _Job:
    """One `run`: its attempts (one, or up to 1 + --max-restarts), each launched, supervised and recorded."""

    def __init__(self, options: RunOptions, program: Program, backend, args: list[str], extra_env: dict[str, str],
                 events: RunEvents, whole: Connector):
        self.options, self.program, self.backend, self.args = options, program, backend, args
        self.extra_env, self.events = extra_env, events
        self.policy = options.restart
        self.record: RunRecord | None = None
        self.run_id: str | None = None
        self.run_dir = ""
        self.restarts = 0
        self.whole = whole              # the inventory's hosts, all of them
        self.resume_point: int | None = None  # the checkpoint step the attempt about to start continues from

    def attempt(self, cluster: Cluster, connector: Connector, plan: LaunchPlan, preflight):
        """Launch and supervise one attempt to its end, launching again at once when the pre-flight finds the
        hosts changed since the cached plan. (launch, outcome), outcome None for a dry run."""
        options, backend, program = self.options, self.backend, self.program
        site = choose_site(cluster, backend, options.launch_from, connector)
        if site.host is not None:
            self.events.launching_from(site.name, backend.launcher_label)
        attempt = self.restarts if self.policy.enabled else None
        started = time.time()
        while True:
            launch = prepare(cluster, plan, script=program.argv[0], args=self.args, backend=backend,
                             runs_root=options.runs_dir, site=site, connect_timeout=options.connect_timeout,
                             extra_env=self.extra_env, run_id=self.run_id, restart=attempt)
            if options.dry_run:
                return launch, None
            self.events.started(launch, program.label, cluster.world_size, backend.name)
            if self.record is None:
                self.record = RunRecord.start(launch.run_id, launch.run_dir, world=cluster.world_size,
                                              backend=backend.name, hosts=[h.name for h in cluster.hosts],
                                              program=program.label)
            if self.policy.enabled:        # every attempt of a restartable run is one run, with one id
                self.run_id, self.run_dir = launch.run_id, launch.run_dir
            live = LiveRun(launch.rank_hosts, time.monotonic())
            self.events.watching(launch, live)
            try:
                outcome = supervise(launch, connector, emit=self.events.output, rank0_only=options.rank0_only,
                                    start_timeout=options.start_timeout,
                                    hang_timeout=self.policy.hang_timeout(options.hang_timeout),
                                    preflight=preflight, plan=plan, status=live.update)
            finally:
                self.events.watched(launch)
            if outcome.replan is None:
                break
            self.events.relaunching(launch, outcome.reason)
            if not self.policy.enabled:    # today's behaviour: the launch from the fresh plan is a run of its own
                self.record.end(outcome.exit_code, outcome.reason)
                self.record = None
            plan, preflight = outcome.replan, None
            remember_plan(cluster, plan)
        if preflight is not None and preflight.exception() is None:   # waits for it: a short, bounded probe
            remember_plan(cluster, preflight.result())
        if self.policy.enabled:
            self.record.attempt(attempt_record(attempt, cluster, launch, outcome, started, self._resumed_from()))
        return launch, outcome

    def restart(self, launch: Launch, outcome: Outcome, cluster: Cluster, connector: Connector):
        """Wait --restart-delay, re-check the hosts (the pre-flight) and return (cluster, connector, plan) of the
        next attempt: the same hosts, or with --elastic those that answer. A re-check that fails uses up a
        restart of its own (a Mac waking up may answer the next one); the last one's error is raised."""
        # an elastic restart asks every host of the inventory again: one that came back is used again
        whole = connector if self.policy.elastic is None else self.whole
        while True:
            self.restarts += 1
            self.events.restarting(launch, self.restarts, self.policy.max_restarts, outcome.reason,
                                   self.policy.delay_s)
            time.sleep(self.policy.delay_s)
            try:
                cluster, connector, plan = self._recheck(whole, cluster)
                # what an earlier attempt left on a host that did not answer when it was stopped (a Mac that
                # slept through it) would hold the ranks' ports: gone before the next launch
                sweep(connector, self.run_id)
                self._note_resume_point(connector, launch)
                return cluster, connector, plan
            except ClusterctlError as e:
                self.record.attempt({"attempt": self.restarts, "outcome": "pre-flight failed", "reason": str(e),
                                     "exit_code": e.exit_code, "started": iso(time.time())})
                if self.restarts >= self.policy.max_restarts:
                    raise
                outcome = Outcome(e.exit_code, f"the pre-flight failed: {e}")

    def _recheck(self, whole: Connector, before: Cluster):
        options, program = self.options, self.program
        kwargs = {"script": program.script, "module": program.module, "needs_mpi": self.backend.needs_mpi}
        if not options.preflight:
            return before, whole, LaunchPlan.from_inventory(before)
        if self.policy.elastic is None:
            plan = discover(whole, **kwargs)
            remember_plan(whole.cluster, plan)
            return before, whole, plan
        cluster, plan, lost = discover_reachable(whole, **kwargs)
        why = "; ".join(f"{name}: {reason}" for name, reason in lost.items())
        if not self.policy.world_ok(cluster.world_size):
            raise RestartError(f"--elastic {self.policy.elastic}: only {cluster.world_size} rank(s) on the hosts that "
                               f"answer ({why})")
        if cluster.world_size != before.world_size or cluster.names != before.names:
            self.events.reshaped(cluster.names, cluster.world_size, lost)
            if self.options.data_dir:
                self._restage_data(cluster, self.run_dir)
        if not lost:
            return cluster, whole, plan
        return cluster, Connector(cluster, connect_timeout=options.connect_timeout, targets=whole.targets), plan

    def _restage_data(self, cluster: Cluster, run_dir: str) -> None:
        """--data on a changed world: every rank reads one equal shard, and the ranks that remain are
        numbered again, so the shards are re-prepared (cut again from the same tokens, data.shards.reshard,
        into runs/<id>/data-world-N/) and each host is sent its new ones; the data directory's name on the
        hosts stays the same."""
        where = stage_data(cluster, self.options.data_dir, connect_timeout=self.options.connect_timeout,
                           reshard_into=os.path.join(run_dir, f"data-world-{cluster.world_size}"))
        self.extra_env["CLUSTERCTL_DATA_DIR"] = where
        if self.program.module == BUNDLED_TRAINER:      # run put `--data DIR` first among its arguments
            self.args[2] = where

    def _note_resume_point(self, connector: Connector, launch: Launch) -> None:
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
                spread_checkpoint(connector, launch.run_id, f"step-{step:06d}", holder, lacking, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            self.events.spread(f"step-{step:06d}", holder.name, [h.name for h in lacking])

    def _resumed_from(self) -> str | None:
        return None if self.resume_point is None else f"step-{self.resume_point:06d}"


def attempt_record(attempt: int, cluster: Cluster, launch: Launch, outcome: Outcome, started: float,
                   resumed_from: str | None) -> dict:
    """One attempt, as summary.json lists it (README "clusterctl run --max-restarts")."""
    failed = outcome.failed_rank
    return {"attempt": attempt, "world": cluster.world_size, "hosts": cluster.names, "started": iso(started),
            "ended": iso(time.time()), "outcome": "ok" if outcome.exit_code == 0 else
            ("stopped" if outcome.stopped_by_user else "failed"), "exit_code": outcome.exit_code,
            "reason": outcome.reason, "failed_rank": failed,
            "failed_host": launch.rank_hosts[failed] if failed is not None and failed < len(launch.rank_hosts) else None,
            "last_lines": outcome.tail, "resumed_from": resumed_from, "log_dir": os.path.basename(launch.log_dir)}


def checkpoint_steps(connector: Connector, launch: Launch) -> dict[str, int | None]:
    """host -> the newest complete checkpoint step (a step-N directory with its state.json, as the trainer
    picks it) in the ranks' run directory there (each host keeps a full copy, train/checkpoint.py); None:
    none, or the host did not answer."""
    cluster = connector.cluster
    listing = 'for d in step-*; do if [ -f "$d/state.json" ]; then echo "$d"; fi; done'

    def ask(host):
        # where the ranks ran it: the local run directory when every rank is on this machine (job.py)
        run_dir = launch.run_dir if all(h.local for h in cluster.hosts) else \
            f"{host.workdir.rstrip('/')}/runs/{launch.run_id}"
        with connector.transport(host) as t:
            names = t.run(f"cd {quote_path(run_dir + '/checkpoints')} 2>/dev/null && {listing}; true", timeout=15)
        return max((n for n in map(checkpoint_step, names.stdout.split()) if n is not None), default=None)

    group = run_all(cluster.hosts, ask, deadline=connector.connect_timeout + 20)
    return {name: o.value if o.error is None else None for name, o in group.items()}


def steps_lost(log_dir: str, resumed: int | None) -> int | None:
    """Steps the failed attempt trained past the checkpoint the next one continues from, by rank 0's last
    report line (so at least this many: the report interval hides the last few)."""
    try:
        with open(os.path.join(log_dir, "rank-0.log"), encoding="utf-8", errors="replace") as f:
            reached = last_step(f.read().splitlines()[-200:])
    except OSError:
        return None
    if reached is None:
        return None
    return max(reached - (resumed or 0), 0)


def _plot_losses(launch: Launch) -> None:
    """runs/<id>/loss.png when matplotlib is installed; a plot never fails the run it pictures."""
    try:
        plot_run(launch.run_dir, read_metrics(launch.run_dir), launch.run_id)
    except (OSError, ValueError, RuntimeError, ImportError, ClusterctlError):
        pass      # a picture of the run is a convenience (matplotlib broken, disk full): not the run's failure


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


def stage(cluster: Cluster, options: RunOptions, program: Program, project: str, events: RunEvents) -> dict[str, str]:
    """Copy what the job needs to the hosts before launching, the project, clusterctl and the shards at
    once (they are independent); returns the ranks' extra environment."""
    kwargs = {"connect_timeout": options.connect_timeout}
    if options.data_dir and not os.path.isfile(os.path.join(options.data_dir, MANIFEST)):
        # the trap of an option both accept: say whose --data this was (README "clusterctl run")
        what = "no such directory" if not os.path.isdir(options.data_dir) else f"no {MANIFEST} there"
        raise ShardError(f"--data {options.data_dir}: {what}. This --data is clusterctl's, for shards from "
                         f"`clusterctl data prepare`, because it came before the program; if it was meant for "
                         f"{program.label}, write it after {program.label}")
    jobs = {}
    if options.sync:
        jobs["project"] = in_background(stage_project, cluster, project, **kwargs)
        if program.module is not None and program.module.startswith("clusterctl."):
            jobs["clusterctl"] = in_background(ship_clusterctl, cluster, **kwargs)
    if options.data_dir:
        jobs["data"] = in_background(stage_data, cluster, options.data_dir, **kwargs)
    wait(jobs.values())
    for future in jobs.values():      # the first failure, after every copy has ended
        future.result()
    for what in ("project", "clusterctl"):
        group: GroupResult | None = jobs[what].result() if what in jobs else None
        if group is not None:
            events.staged(what, len(group), sum(len(o.value.moved) for o in group.values()),
                          sum(o.value.moved_bytes for o in group.values()))
    return {"CLUSTERCTL_DATA_DIR": jobs["data"].result()} if "data" in jobs else {}


def _fetch(connector: Connector, launch: Launch, events: RunEvents) -> None:
    """Bring home what the job left in its run directory on the first host (checkpoints, metrics)."""
    host = connector.cluster.hosts[0]
    remote_dir = f"{host.workdir}/runs/{launch.run_id}/"
    try:
        files, nbytes = fetch_run_dir(connector, launch.run_id, launch.run_dir)
    except (OSError, EOFError, ClusterctlError) as e:   # reported; the files stay on the host
        events.fetch_failed(launch, host.name, remote_dir, e)
        return
    if files:
        events.fetched(launch, host.name, remote_dir, files, nbytes)
