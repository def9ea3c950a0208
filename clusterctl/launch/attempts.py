"""The attempts of one job: the first, then, while it fails and the restart policy allows it
(`run --max-restarts N [--elastic MIN]`), the next ones, each launched, supervised and told to the use case.

    attempts = Attempts(backend, settings, hooks, connector, program, stdin)   # settings: AttemptSettings
    launch, outcome = attempts.first(plan, preflight)       # outcome None: a dry run, nothing started
    launch, outcome = attempts.restart_while_failing(launch, outcome)
    attempts.cluster, attempts.connector                    # the hosts the last attempt ran on

An attempt whose pre-flight finds the hosts changed since the cached plan is launched again at once from
the fresh plan. Between attempts: --restart-delay, the re-check of the hosts (the pre-flight; with
--elastic, every host of the inventory, keeping those that answer; without, a host that does not answer over SSH is
waited for, up to --host-wait), the sweep of what is left of the run, and, after a data-plane fault, the wait for
the hosts to reach each other again (launch/dataplane.py).
What the use case adds (its events, the run's record, data re-staged for a new world, the checkpoint the
next attempt resumes from) comes through an AttemptHooks object.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Callable

from ..errors import ClusterctlError, RestartError, SignalReceived
from ..hosts.connector import Connector
from ..hosts.fanout import run_all
from ..hosts.stdinfeed import StdinFeed
from ..hosts.quoting import quote_path
from ..inventory import Cluster
from . import causes, dataplane
from .backends import Backend
from .job import Launch, prepare
from .launchers import choose_site, sweep
from .plan import LaunchPlan, discover, discover_reachable, remember_plan
from ..program import Program
from ..trainer_contract import RUNS_DIR, STEP_GLOB, checkpoint_step, last_step
from .restart import HOST_POLL_S, RestartPolicy
from .site import LaunchSite
from .outcome import AttemptState, Outcome
from .supervise import Settings, Status, Supervisor, signals_stop, stopped


@dataclass(frozen=True)
class AttemptSettings:
    """How every attempt of a job is launched and watched: made once from the command line (`run`'s, `serve`'s)
    and handed down as it is, the supervisor reading `watch` (torchrun's LaunchConfig is such an object)."""

    runs_dir: str = RUNS_DIR          # runs/<id>/ here: logs, launch.json, what comes home
    launch_from: str = "auto"         # one of launchers.LAUNCH_FROM
    dry_run: bool = False             # prepare the first attempt, start nothing
    preflight: bool = True            # check the hosts (beside the first launch, or before it) and before a restart
    restart: RestartPolicy = RestartPolicy()   # --max-restarts, --restart-delay, --elastic, --elastic-batch
    watch: Settings = Settings()      # rank0_only, --start-timeout, --hang-timeout as given (the restart policy
                                      # may watch anyway), --stall-timeout's StallPolicy
    run_id: str | None = None         # the run's id, when it was chosen before (a detached run's); else a new one

    def with_progress(self, health: Callable[[], float | None]) -> AttemptSettings:
        """These settings with a service's progress (when its endpoint last answered a health request) as what
        the stall watchdog watches (launch/stall.py); with the watchdog off, as they are."""
        if not self.watch.stall.enabled:
            return self
        return replace(self, watch=replace(self.watch, stall=replace(self.watch.stall, health=health)))


class AttemptHooks:
    """What the attempts ask of the use case and tell it, one method each. The use case says what the
    ranks run; every other method of the base class does nothing."""

    def ranks(self) -> tuple[str, list[str], dict[str, str]]:
        """What every rank runs, asked afresh for each launch: (the bootstrap's script argument, a path or
        "-m"; its arguments; the ranks' extra environment)."""
        raise NotImplementedError

    def host_env(self) -> dict[str, dict[str, str]]:
        """Each host's own extra environment for its ranks (host name -> values), besides ranks()' for every
        rank: where a host keeps what the job reads (run's model, in that host's model store)."""
        return {}

    def watching(self, launch: Launch) -> Status:
        """What hears the ranks' events while the launch is supervised (supervise's `status`)."""
        return lambda rank, kind, value, now: None

    def launching_from(self, site: LaunchSite) -> None: ...
    def started(self, launch: Launch, cluster: Cluster) -> None: ...
    def output(self, text: str, is_err: bool) -> None: ...
    def watched(self, launch: Launch) -> None: ...   # supervision ended, whatever the way
    def relaunching(self, launch: Launch, outcome: Outcome, restartable: bool) -> None: ...
    def attempted(self, attempt: int, cluster: Cluster, launch: Launch, outcome: Outcome, started: float) -> None: ...
    def restarting(self, launch: Launch, restart: int, reason: str) -> None: ...
    def recheck_failed(self, restart: int, error: ClusterctlError) -> None: ...
    # after a data-plane fault: the restart waits for the hosts to reach each other again (launch/dataplane.py)
    def data_plane_down(self, launch: Launch, restart: int, broken: list[str]) -> None: ...
    def data_plane_up(self, launch: Launch, restart: int, waited_s: float | None) -> None: ...   # None: not in time
    # a restart's re-check could not reach a host over SSH (rebooting, waking): it asks again, up to --host-wait
    def host_down(self, launch: Launch, restart: int, host: str, detail: str) -> None: ...
    def host_up(self, launch: Launch, restart: int, host: str, waited_s: float | None) -> None: ...   # None: not in time
    def reshaped(self, cluster: Cluster, lost: dict[str, str], run_dir: str) -> None: ...   # another world
    def resuming(self, connector: Connector, launch: Launch) -> None: ...   # the next attempt is about to start


class Attempts:
    """One job's attempts (one, or up to 1 + --max-restarts) and what they share: the run's id and
    directory (a restartable run is one run), the restarts used, the hosts of the latest attempt."""

    def __init__(self, backend: Backend, settings: AttemptSettings, hooks: AttemptHooks, whole: Connector,
                 program: Program, stdin: StdinFeed | None = None):
        self.backend, self.settings, self.hooks = backend, settings, hooks
        self.policy = settings.restart
        self.program = program            # what the re-check looks for on every host: its script or module
        self.stdin = stdin                # what every rank reads (run's own stdin, read once for all attempts)
        self.whole = whole                # the inventory's hosts, all of them
        self.cluster, self.connector = whole.cluster, whole
        self.restarts = 0
        self.run_id: str | None = settings.run_id
        self.run_dir = ""

    def first(self, plan: LaunchPlan, preflight, copy=None) -> tuple[Launch, Outcome | None]:
        """The first attempt, to its end; `preflight` (a Future, or None) verifies the plan meanwhile; `copy` (a
        Deferred, or None) copies the project beside its launch, the ranks waiting for it (supervise.py _Copy)."""
        return self._attempt(plan, preflight, copy)

    def restart_while_failing(self, launch: Launch, outcome: Outcome) -> tuple[Launch, Outcome]:
        """Restart while the policy says so; the last attempt's (launch, outcome). A stop by the user
        between attempts ends the job with nothing running."""
        previous: Outcome | None = None
        while self.policy.should_restart(outcome.state, self.restarts):
            refusal = unfixable(outcome, previous)
            if refusal:
                outcome = replace(outcome, reason=f"{outcome.reason}; not restarted: {refusal}")
                break
            previous = outcome
            try:
                with signals_stop():
                    plan = self._restart(launch, outcome)
            except (KeyboardInterrupt, SignalReceived) as e:     # between attempts: nothing of the job runs
                outcome = stopped(e)
                outcome = replace(outcome, reason=f"{outcome.reason} before restart {self.restarts}: nothing was running")
                break
            launch, outcome = self._attempt(plan, None)
        return launch, outcome

    def _attempt(self, plan: LaunchPlan, preflight, copy=None) -> tuple[Launch, Outcome | None]:
        """Launch and supervise one attempt to its end, launching again at once when the pre-flight finds the
        hosts changed since the cached plan. (launch, outcome), outcome None for a dry run."""
        settings, backend, cluster, hooks = self.settings, self.backend, self.cluster, self.hooks
        site = choose_site(cluster, backend, settings.launch_from, self.connector)
        if site.host is not None:
            hooks.launching_from(site)
        attempt = self.restarts if self.policy.enabled else None
        started = time.time()
        while True:
            script, args, extra_env = hooks.ranks()
            launch = prepare(cluster, plan, script=script, args=args, backend=backend, runs_root=settings.runs_dir,
                             site=site, connector=self.connector, extra_env=extra_env,
                             run_id=self.run_id, restart=attempt, stdin=self.stdin, host_env=hooks.host_env())
            if settings.dry_run:
                return launch, None
            hooks.started(launch, cluster)
            if self.policy.enabled:        # every attempt of a restartable run is one run, with one id
                self.run_id, self.run_dir = launch.run_id, launch.run_dir
            outcome = self._supervise(launch, plan, preflight, copy)
            copy = None            # ended with the launch it was beside
            if outcome.state is not AttemptState.REPLAN:
                break
            hooks.relaunching(launch, outcome, self.policy.enabled)
            plan, preflight = outcome.fresh_plan, None
            remember_plan(cluster, plan)
        # waits for it: a short, bounded probe; one the job never needed started (it ended well before the
        # ranks were all up: supervise.py _Preflight) is not run now: the plan it would check just worked
        if preflight is not None and getattr(preflight, "started", True) and preflight.exception() is None:
            remember_plan(cluster, preflight.result())
        if self.policy.enabled:
            hooks.attempted(attempt, cluster, launch, outcome, started)
        return launch, outcome

    def _supervise(self, launch: Launch, plan: LaunchPlan, preflight, copy=None) -> Outcome:
        status = self.hooks.watching(launch)
        try:
            given = self.settings.watch
            watch = replace(given, hang_timeout=self.policy.hang_timeout(given.hang_timeout))
            return Supervisor(launch, self.connector, emit=self.hooks.output, settings=watch,
                              status=status).run(preflight, plan, copy)
        finally:
            self.hooks.watched(launch)

    def _restart(self, launch: Launch, outcome: Outcome) -> LaunchPlan:
        """Wait --restart-delay, re-check the hosts (the pre-flight) and make the next attempt's hosts
        current: the same, or with --elastic those that answer; returns its plan. A re-check that fails uses
        up a restart of its own (a Mac waking up may answer the next one); the last one's error is raised."""
        # an elastic restart asks every host of the inventory again: one that came back is used again
        whole = self.connector if self.policy.elastic is None else self.whole
        while True:
            self.restarts += 1
            self.hooks.restarting(launch, self.restarts, outcome.reason)
            time.sleep(self.policy.delay_s)
            try:
                cluster, connector, plan = self._recheck_waiting(whole, launch)
                # what an earlier attempt left on a host that did not answer when it was stopped (a Mac that
                # slept through it) would hold the ranks' ports: gone before the next launch
                sweep(connector, self.run_id)
                if outcome.cause is not None and outcome.cause.kind == causes.DATA_PLANE:
                    self._wait_for_data_plane(connector, launch)
                self.hooks.resuming(connector, launch)
                self.cluster, self.connector = cluster, connector
                return plan
            except ClusterctlError as e:
                self.hooks.recheck_failed(self.restarts, e)
                if self.restarts >= self.policy.max_restarts:
                    raise
                outcome = Outcome(e.exit_code, f"the pre-flight failed: {e}")

    def _recheck_waiting(self, whole: Connector, launch: Launch) -> tuple[Cluster, Connector, LaunchPlan]:
        """The re-check; while it fails on a host that may come back (restart.py waits_for: SSH refused or timed
        out), asked again every HOST_POLL_S, up to --host-wait; then its error is raised as it came."""
        began = time.monotonic()
        down: str | None = None
        while True:
            try:
                found = self._recheck(whole, self.cluster)
            except ClusterctlError as e:
                if not self.policy.waits_for(e):
                    raise
                if down is None:
                    down = e.host
                    self.hooks.host_down(launch, self.restarts, e.host, e.detail)
                left = self.policy.host_wait_s - (time.monotonic() - began)
                if left <= 0:
                    self.hooks.host_up(launch, self.restarts, e.host, None)
                    raise
                time.sleep(min(HOST_POLL_S, left))
                continue
            if down is not None:
                self.hooks.host_up(launch, self.restarts, down, time.monotonic() - began)
            return found

    def _wait_for_data_plane(self, connector: Connector, launch: Launch) -> None:
        """The attempt failed because its hosts could not reach each other: launching again into a dead link would
        fail at once, so this restart first waits, up to --data-plane-wait, for every host to reach the others."""
        limit = self.policy.data_plane_wait_s
        if limit <= 0:
            return
        waited = dataplane.wait_until_up(connector, limit, lambda broken: self.hooks.data_plane_down(
            launch, self.restarts, broken))
        if waited is None or waited > 0:
            self.hooks.data_plane_up(launch, self.restarts, waited)

    def _recheck(self, whole: Connector, before: Cluster) -> tuple[Cluster, Connector, LaunchPlan]:
        kwargs = {"script": self.program.script, "module": self.program.module, "needs_mpi": self.backend.needs_mpi}
        if not self.settings.preflight:
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
            self.hooks.reshaped(cluster, lost, self.run_dir)
        if not lost:
            return cluster, whole, plan
        return cluster, whole.narrowed(cluster), plan


def unfixable(outcome: Outcome, previous: Outcome | None) -> str | None:
    """Why a restart cannot fix this failure (pure), or None: a full disk or a missing file is met again by the
    next attempt, and so is running out of memory at the step where the attempt before did too."""
    ok, why = outcome.restartable
    if not ok:
        return why
    oom = causes.OUT_OF_MEMORY
    if (previous is not None and outcome.cause is not None and outcome.cause.kind == oom and previous.cause is not None
            and previous.cause.kind == oom and outcome.step is not None and outcome.step == previous.step):
        return f"out of memory at step {outcome.step} twice: the next attempt would run out there again"
    return None


def checkpoint_steps(connector: Connector, launch: Launch) -> dict[str, int | None]:
    """host -> the newest complete checkpoint step (a step-N directory with its state.json, as the trainer
    picks it) in the ranks' run directory there (each host keeps a full copy, train/checkpoint.py); None:
    none, or the host did not answer."""
    cluster = connector.cluster
    listing = f'for d in {STEP_GLOB}; do if [ -f "$d/state.json" ]; then echo "$d"; fi; done'

    def ask(host):
        # where the ranks ran it: the local run directory when every rank is on this machine (job.py)
        run_dir = launch.run_dir if all(h.local for h in cluster.hosts) else connector.run_dir(host, launch.run_id)
        with connector.transport(host) as t:
            names = t.run(f"cd {quote_path(run_dir + '/checkpoints')} 2>/dev/null && {listing}; true", timeout=15)
        return max((n for n in map(checkpoint_step, names.stdout.split()) if n is not None), default=None)

    group = run_all(cluster.hosts, ask, deadline=connector.deadline(15))
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
