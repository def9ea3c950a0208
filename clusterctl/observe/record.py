"""What `run` records about a run, beside the logs supervise writes (docs/observe.md#what-run-records).

    record = RunRecord.start(run_id, run_dir, world=2, backend="ring", hosts=[...], program="clusterctl.train",
                             described=program.kind.describe(program.args))
    ...                                   # the job runs; log-times.jsonl is sampled meanwhile
    record.end(exit_code=0, reason="all 2 ranks finished")          # stopped=True: the user stopped it

What a run is comes from its program's kind (program.Capabilities.describe): its kind (train, fine-tune, serve,
program: trainer_contract.TRAINER_KINDS for the bundled trainer's), its model and its strategy.

In runs/<id>/:
  clusterctl.pid    "PID HOSTNAME" of the `clusterctl run` process, written when the run starts: `logs
                    --follow` knows the run ended when that process is gone (or summary.json appears).
  run.json          what the run is, written when it starts ({"format": 1, "run_id", "started", "world",
                    "backend", "hosts", "program", "kind", "model", "strategy", and "service" for `serve`}),
                    so that `runs` tells a running serve from a training run.
  log-times.jsonl   {"t": epoch seconds, "sizes": [bytes of rank-0.log, rank-1.log, ...]} whenever a rank
                    log grew, sampled every SAMPLE_S: the time each log line arrived, to within SAMPLE_S,
                    without a timestamp in the logs themselves (supervise.py writes them as the ranks print).
  rank-metrics.jsonl  {"t": epoch seconds, "rank", and the fields of its metrics line (progress.py)} for each
                    metrics line a rank printed, every attempt's (launch/ranklines.py): each rank's own curves, which
                    the rank logs do not hold (a metrics line is neither shown nor logged); the dashboard reads it.
  hosts.jsonl       one line each time a host of the run starts or stops swapping or being throttled, as run's
                    output says it (observe/hostwatch.py, from the hosts' telemetry sampled every few seconds while
                    the job runs): {"t": epoch seconds, "host", "flag" ("swapping" or "throttled"), "event"
                    ("started" or "ended"), "step" (the job's, or null), and "why" (a start's reasons) or
                    "duration_s" (an end's)}; absent when no host was flagged. It lives beside the trainer's
                    metrics.jsonl, not in it: that file is written on rank 0's host and fetched over this one's.
  summary.json      written once, atomically, when the run has ended (after fetching its outputs):
                    {"format": 1, "run_id", "started", "ended" (ISO 8601, local time with offset),
                     "duration_s", "exit_code", "reason", "outcome" ("ok", "failed", or "stopped": by Ctrl-C,
                     SIGTERM or `clusterctl kill`), "failed_rank", "world", "backend", "hosts", "program", "kind",
                     "model", "strategy" (the bundled trainer's own, from its trainer.json, once it has said)};
                    for `clusterctl serve`, "service": {"url", "model", ...}; for
                    `run --max-restarts`: "restarts" and "attempts", one entry per
                    attempt (run.attempt_record: world, hosts, times, outcome, failing rank and host, last
                    lines, resumed_from, steps_lost, and "stacks" when it stalled); for a run that ended
                    stalled, "stacks": the folder (relative to runs/<id>/) of every rank's stacks; for the
                    bundled trainer, "trainer": its trainer.json (shares of the batch, replica sync checks); when
                    a host was flagged, "host_events": hosts.jsonl's lines. Its
                    appearing means the run is over. Readers ignore
                    keys they do not know, so it may grow without breaking them.
The runs index, INDEX_NAME in the cache directory: one JSON line appended when a run starts
({"event": "start", "run_id", "dir", "started", "pid", "host", "world", "backend", "hosts", "program", "kind",
"model", "strategy", and "service" for `serve`}) and
one when it ends ({"event": "end", "run_id", "ended", "duration_s", "exit_code", "reason", "outcome",
"strategy"}). Each line is one
write(2) to a file opened O_APPEND, so concurrent runs never interleave inside a line.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from ..atomic import write_text
from ..program import ANY_PROGRAM
from ..progress import RANK_METRICS  # noqa: F401 (runs/<id>/'s files are named here; the name is progress.py's)
from ..trainer_contract import TRAINER_SUMMARY

SUMMARY = "summary.json"
FACTS = "run.json"
PID_FILE = "clusterctl.pid"
LOG_TIMES = "log-times.jsonl"
HOST_EVENTS = "hosts.jsonl"
INDEX_NAME = "runs.jsonl"
SAMPLE_S = 0.25


def cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "clusterctl")


def index_path() -> str:
    return os.path.join(cache_dir(), INDEX_NAME)


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def append_line(path: str, record: dict) -> None:
    """One JSON line, appended with a single write(2) on an O_APPEND descriptor."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class LogClock:
    """Samples the sizes of a run's rank logs every SAMPLE_S in a daemon thread and appends a line to
    log-times.jsonl whenever one grew."""

    def __init__(self, run_dir: str, world: int):
        self.paths = [os.path.join(run_dir, f"rank-{r}.log") for r in range(world)]
        self.out = os.path.join(run_dir, LOG_TIMES)
        self.last: list[int] = [0] * world
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="log-clock", daemon=True)

    def _sizes(self) -> list[int]:
        sizes = []
        for path in self.paths:
            try:
                sizes.append(os.stat(path).st_size)
            except FileNotFoundError:
                sizes.append(0)
        return sizes

    def sample(self) -> None:
        sizes = self._sizes()
        if sizes != self.last:
            self.last = sizes
            append_line(self.out, {"t": round(time.time(), 3), "sizes": sizes})

    def _loop(self) -> None:
        while not self.done.wait(SAMPLE_S):
            try:
                self.sample()
            except OSError:        # the run directory went away: nothing left to time
                return

    def start(self) -> "LogClock":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.done.set()
        self.thread.join(2 * SAMPLE_S + 1)
        try:
            self.sample()          # the last lines, written after the last tick
        except OSError:
            pass


@dataclass
class RunRecord:
    run_id: str
    run_dir: str
    started: float
    facts: dict                            # world, backend, hosts, program
    clock: LogClock | None = None
    ended: bool = field(default=False)
    attempts: list[dict] = field(default_factory=list)   # run --max-restarts: one entry per attempt
    host_events: list[dict] = field(default_factory=list)   # a host started or stopped swapping, being throttled

    def host_event(self, event: dict) -> None:
        """A host started or stopped swapping or being throttled (observe/hostwatch.py HostEvent.as_json): a line
        of hosts.jsonl now, and summary.json's "host_events" at the end."""
        self.host_events.append(event)
        try:
            append_line(os.path.join(self.run_dir, HOST_EVENTS), event)
        except OSError:        # the run directory went away: summary.json may still say it
            pass

    def attempt(self, entry: dict) -> None:
        self.attempts.append(entry)

    def lost(self, steps: int | None) -> None:
        """The steps the last attempt that ran lost: trained past the checkpoint the next one continues from."""
        ran = [a for a in self.attempts if "log_dir" in a]      # not a restart whose pre-flight failed
        if ran:
            ran[-1]["steps_lost"] = steps

    @classmethod
    def start(cls, run_id: str, run_dir: str, *, world: int, backend: str, hosts: list[str],
              program: str, described: dict | None = None, service: dict | None = None) -> "RunRecord":
        """`described`: what its program's kind says the run is (program.Capabilities.describe)."""
        now = time.time()
        facts = {"world": world, "backend": backend, "hosts": hosts, "program": program,
                 **(described or ANY_PROGRAM.describe(())), **({"service": service} if service else {})}
        write_text(os.path.join(run_dir, PID_FILE), f"{os.getpid()} {socket.gethostname()}\n")
        write_text(os.path.join(run_dir, FACTS), json.dumps({"format": 1, "run_id": run_id, "started": iso(now),
                                                            **facts}, indent=2) + "\n")
        record = cls(run_id, run_dir, now, facts, LogClock(run_dir, world).start())
        _index({"event": "start", "run_id": run_id, "dir": os.path.abspath(run_dir), "started": iso(now),
                "pid": os.getpid(), "host": socket.gethostname(), **facts})
        return record

    def end(self, exit_code: int, reason: str, failed_rank: int | None = None, stacks: str | None = None,
            stopped: bool = False) -> dict:
        """Stop timing the logs, write summary.json and the index's end line (once). `stopped`: the user stopped
        the run (Ctrl-C, SIGTERM, `clusterctl kill`), which is no failure whatever its exit code."""
        if self.ended:
            return {}
        self.ended = True
        if self.clock is not None:
            self.clock.stop()
        now = time.time()
        outcome = "stopped" if stopped else "ok" if exit_code == 0 else "failed"
        summary = {"format": 1, "run_id": self.run_id, "started": iso(self.started), "ended": iso(now),
                   "duration_s": round(now - self.started, 3), "exit_code": exit_code, "reason": reason,
                   "outcome": outcome, "failed_rank": failed_rank, **self.facts}
        if stacks:
            summary["stacks"] = stacks
        trainer = _trainer_summary(self.run_dir)
        if trainer is not None:
            summary["trainer"] = trainer
            if isinstance(trainer.get("strategy"), str):      # the strategy the trainer chose, where it chose
                summary["strategy"] = trainer["strategy"]
        if self.attempts:
            summary["restarts"] = len(self.attempts) - 1
            summary["attempts"] = self.attempts
        if self.host_events:
            summary["host_events"] = list(self.host_events)
        write_text(os.path.join(self.run_dir, SUMMARY), json.dumps(summary, indent=2) + "\n")
        _index({"event": "end", "run_id": self.run_id, "ended": summary["ended"],
                "duration_s": summary["duration_s"], "exit_code": exit_code, "reason": reason, "outcome": outcome,
                "strategy": summary.get("strategy")})
        return summary


def _trainer_summary(run_dir: str) -> dict | None:
    """What the bundled trainer left for summary.json (trainer_contract.TRAINER_SUMMARY: its shares of the batch,
    its replicas' sync checks), None when there is none or it cannot be read."""
    try:
        with open(os.path.join(run_dir, TRAINER_SUMMARY), encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _index(record: dict) -> None:
    """The index is a convenience for `runs --all`: a cache we cannot write costs only that."""
    try:
        append_line(index_path(), record)
    except OSError:
        pass
