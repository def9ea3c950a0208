"""How `run` takes part in its job's attempts (launch/attempts.py's AttemptHooks): it feeds them (what every rank
runs, the data re-staged for a new world, the checkpoint a restart continues from), tells them (its RunEvents)
and records them (runs/<id>/summary.json, observe/record.py), each attempt as attempt_record() lists it.

From the record's start to the job's end it also watches the hosts (observe/hostwatch.py HostWatch, over the run's
connector): each sample of their telemetry goes to the attempt's live state (the panel's host rows), and a host
that starts or stops swapping or being throttled is told (RunEvents.host_flagged) and recorded
(runs/<id>/hosts.jsonl, summary.json's "host_events").
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from ..errors import ClusterctlError
from ..hosts.connector import Connector
from ..inventory import Cluster
from ..launch.attempts import AttemptHooks, checkpoint_steps, steps_lost
from ..launch.job import Launch
from ..launch.site import LaunchSite
from ..launch.outcome import AttemptState, Outcome
from ..observe.hostwatch import HostEvent, HostWatch
from ..observe.live import LiveRun
from ..observe.record import RunRecord, iso
from ..observe.runs import read_metrics
from ..program import Program
from ..trainer_contract import step_dir_name
from ..transfer.stage import COPY_GATE_ENV
from .events import RunEvents, told
from .options import RunOptions
from .staging import BesideCopy


class RunHooks(AttemptHooks):
    """The attempts as `run` feeds them (the program, the data re-staged for a new world, the checkpoint a
    restart continues from), tells them (its events) and records them (runs/<id>/summary.json)."""

    def __init__(self, options: RunOptions, program: Program, backend, extra_env: dict[str, str], events: RunEvents,
                 whole: Connector, copy: BesideCopy | None = None, host_env: dict[str, dict[str, str]] | None = None):
        self.options, self.program, self.backend, self.events = options, program, backend, events
        self.whole = whole                  # the inventory's hosts, all of them: a re-stage narrows it
        self.extra_env = extra_env          # CLUSTERCTL_DATA_DIR: where stage() (or a re-stage) put the shards
        self.policy = options.attempts.restart
        self.record: RunRecord | None = None
        self.resume_point: int | None = None  # the checkpoint step the attempt about to start continues from
        self.data_plane_waited: float | None = None   # seconds the restart before it waited for the link (dataplane.py)
        self.host_waited: float | None = None         # seconds the restart before it waited for a host to answer
        self.copy = copy                    # the project's copy beside the first launch, its ranks waiting for it
        self.own_env = host_env or {}       # each host's own (its model-store copy of the program's model)
        self.live: LiveRun | None = None    # the attempt being watched's live state
        self.hosts_watch: HostWatch | None = None
        self._hosts_sample: tuple[list, float] | None = None   # the last, and when (a new attempt's panel starts with it)

    def ranks(self) -> tuple[str, list[str], dict[str, str]]:
        script, _ = self.program.argv
        env = self.extra_env
        if self.copy is not None and not self.copy.future.done():      # a launch beside it: its ranks wait for it
            env = {**env, COPY_GATE_ENV: self.copy.token}
        return script, self.program.rank_args(self.extra_env.get("CLUSTERCTL_DATA_DIR")), env

    def host_env(self) -> dict[str, dict[str, str]]:
        return self.own_env

    def launching_from(self, site: LaunchSite) -> None:
        self.events.launching_from(site.name, self.backend.launcher_label)

    def started(self, launch: Launch, cluster: Cluster) -> None:
        self.events.started(launch, self.program.label, cluster.world_size, launch.backend)
        if self.record is None:
            self.record = RunRecord.start(launch.run_id, launch.run_dir, world=cluster.world_size,
                                          backend=launch.backend, hosts=[h.name for h in cluster.hosts],
                                          program=self.program.label, service=self.program.kind.service,
                                          described=self.program.kind.describe(self.program.args))
            self.watch_hosts()

    def watching(self, launch: Launch):
        live = LiveRun(launch.rank_hosts, time.monotonic())
        if self._hosts_sample is not None:
            live.hosts_seen(*self._hosts_sample)
        self.live = live
        self.events.watching(launch, live)
        return live.update

    # -- the hosts' telemetry, while the job runs --
    def watch_hosts(self) -> None:
        interval = self.options.telemetry_interval
        if interval is None or self.hosts_watch is not None:
            return
        self.hosts_watch = HostWatch(self.whole, on_sample=self._hosts_sampled, on_event=self._host_flagged,
                                     step=lambda: self.live.step() if self.live is not None else None,
                                     interval=interval, first_after=interval).start()

    def unwatch_hosts(self) -> None:
        """No more samples; the watch's thread and connections are gone (the job has ended)."""
        watch, self.hosts_watch = self.hosts_watch, None
        if watch is not None:
            watch.stop()

    def _hosts_sampled(self, hosts: list) -> None:
        self._hosts_sample = (hosts, time.monotonic())
        live = self.live
        if live is not None:
            live.hosts_seen(*self._hosts_sample)

    def _host_flagged(self, event: HostEvent) -> None:
        record = self.record
        if record is not None:
            record.host_event(event.as_json())
        self.events.host_flagged(event)

    def end(self, exit_code: int, reason: str, failed_rank: int | None = None, stacks: str | None = None,
            stopped: bool = False) -> None:
        """The run's record ends (summary.json), the hosts' watch first."""
        self.unwatch_hosts()
        self.record.end(exit_code, reason, failed_rank, stacks=stacks, stopped=stopped)

    def output(self, text: str, is_err: bool) -> None:
        self.events.output(text, is_err)

    def watched(self, launch: Launch) -> None:
        self.events.watched(launch)

    def relaunching(self, launch: Launch, outcome: Outcome, restartable: bool) -> None:
        self.events.relaunching(launch, outcome.reason)
        if not restartable:    # today's behaviour: the launch from the fresh plan is a run of its own
            self.end(outcome.exit_code, outcome.reason)
            self.record = None

    def attempted(self, attempt: int, cluster: Cluster, launch: Launch, outcome: Outcome, started: float) -> None:
        resumed_from = None if self.resume_point is None else step_dir_name(self.resume_point)
        record = attempt_record(attempt, cluster, launch, outcome, started, resumed_from)
        if self.data_plane_waited is not None:       # before this attempt, its restart waited for the link
            record["data_plane_wait_s"] = round(self.data_plane_waited, 1)
            self.data_plane_waited = None
        if self.host_waited is not None:             # ... or for a host to answer over SSH
            record["host_wait_s"] = round(self.host_waited, 1)
            self.host_waited = None
        self.record.attempt(record)

    def restarting(self, launch: Launch, restart: int, reason: str) -> None:
        self.events.restarting(launch, restart, self.policy.max_restarts, reason, self.policy.delay_s)

    def data_plane_down(self, launch: Launch, restart: int, broken: list[str]) -> None:
        self.events.data_plane_down(launch, restart, broken, self.policy.data_plane_wait_s)

    def data_plane_up(self, launch: Launch, restart: int, waited_s: float | None) -> None:
        self.data_plane_waited = self.policy.data_plane_wait_s if waited_s is None else waited_s
        self.events.data_plane_up(launch, restart, waited_s, self.policy.data_plane_wait_s)

    def host_down(self, launch: Launch, restart: int, host: str, detail: str) -> None:
        self.events.host_down(launch, restart, host, detail, self.policy.host_wait_s)

    def host_up(self, launch: Launch, restart: int, host: str, waited_s: float | None) -> None:
        self.host_waited = self.policy.host_wait_s if waited_s is None else waited_s
        self.events.host_up(launch, restart, host, waited_s, self.policy.host_wait_s)

    def recheck_failed(self, restart: int, error: ClusterctlError) -> None:
        record = {"attempt": restart, "outcome": "pre-flight failed", "reason": str(error),
                  "exit_code": error.exit_code, "started": iso(time.time())}
        if self.host_waited is not None:    # the wait for a host that never answered: this pre-flight's, no attempt's
            record["host_wait_s"] = round(self.host_waited, 1)
            self.host_waited = None
        self.record.attempt(record)

    def reshaped(self, cluster: Cluster, lost: dict[str, str], run_dir: str) -> None:
        """--data on a changed world: every rank reads one equal shard, and the ranks that remain are
        numbered again, so the shards are re-prepared (cut again from the same tokens, data.shards.reshard,
        into runs/<id>/data-world-N/) and each host is sent its new ones; the data directory's name on the
        hosts stays the same."""
        self.events.reshaped(cluster.names, cluster.world_size, lost)
        if self.options.data_dir:
            from ..transfer.stage import stage_data
            with told(self.events, "data") as progress:
                self.extra_env["CLUSTERCTL_DATA_DIR"] = stage_data(
                    self.whole.narrowed(cluster), self.options.data_dir,
                    reshard_into=os.path.join(run_dir, f"data-world-{cluster.world_size}"),
                    all_shards=self.options.all_shards, progress=progress)

    def resuming(self, connector: Connector, launch: Launch) -> None:
        """For a program that resumes from its checkpoints (the bundled trainer): the checkpoint the next attempt
        continues from (the newest any of its hosts holds, as the trainer picks it) and so the steps the failed
        attempt lost."""
        if not self.program.kind.resumes_from_checkpoints:
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
                from ..transfer.stage import spread_checkpoint
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
            "cause": outcome.cause.kind if outcome.cause is not None else None,
            "last_lines": outcome.tail, "resumed_from": resumed_from, "log_dir": os.path.basename(launch.log_dir),
            **({"stacks": os.path.relpath(outcome.stacks, launch.run_dir)} if outcome.stacks else {})}


def plot_losses(launch: Launch) -> None:
    """runs/<id>/loss.png when matplotlib is installed; a plot never fails the run it pictures."""
    try:
        from ..observe.plot import plot_run
        plot_run(launch.run_dir, read_metrics(launch.run_dir), launch.run_id)
    except (OSError, ValueError, RuntimeError, ImportError, ClusterctlError):
        pass      # a picture of the run is a convenience (matplotlib broken, disk full): not the run's failure
