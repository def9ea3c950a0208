"""What `run`'s live panel shows, as plain data: the supervisor feeds it every rank's events, the CLI's
renderer (cli/panel.py) reads a snapshot a few times a second from its own thread.

    live = LiveRun(["h1", "h2"], now)            # one host name per rank
    live.update(rank, kind, value, now)          # supervise.py's status hook (kinds below)
    live.hosts_seen(hosts, now)                  # the hosts' telemetry (run/hooks.py's HostWatch, every few seconds)
    live.snapshot(now) -> Snapshot(ranks=[RankRow, ...], job=JobRow, hosts=[HostTelemetry, ...])
    doc = to_json(snapshot, taken)               # a detached run's supervisor writes it (.live.json) ...
    Replayed().seen(doc).snapshot(now)           # ... and `attach` draws the panel from it, aged to now
    LiveFile(live, path).start() ... .stop()     # the supervisor's writer of that file, every second

Kinds: "start" (the bootstrap started), "out" / "err" (an output line), "hb" and any other tagged line (a
sign of life), "metrics" (the fields of a progress.py metrics line, a dict), "exit" (the exit code, an int),
"lost" (the rank died without reporting its exit), "straggler" (the stall watchdog saw it fall behind the
other ranks: its state is "behind" until its next output or metrics line).
A program that prints no metrics lines still gets its state, heartbeat age and output rate.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import deque
from dataclasses import dataclass

from ..atomic import write_text

RATE_WINDOW_S = 10.0       # lines/s over the last this many seconds
STEP_WINDOW_S = 60.0       # the step rate behind the ETA, over about this long


@dataclass(frozen=True)
class RankRow:
    rank: int
    host: str
    state: str                      # starting, running, behind, finished, failed
    step: int | None
    total_steps: int | None
    loss: float | None
    tokens_per_s: float | None      # this rank's own
    peak_mem_mb: float | None       # this rank's own
    since_seen_s: float | None      # since its last heartbeat or output; None before the first
    lines_per_s: float
    share: float | None = None      # its part of the global batch (the bundled trainer's balancing), 0..1


@dataclass(frozen=True)
class JobRow:
    elapsed_s: float
    step: int | None                # the slowest reporting rank's
    total_steps: int | None
    eta_s: float | None             # from the step rate, counting down since the last step; None until two steps are known
    tokens_per_s: float | None      # the ranks' sum


@dataclass(frozen=True)
class Snapshot:
    ranks: list[RankRow]
    job: JobRow
    hosts: tuple = ()                   # the hosts' last telemetry sample (observe/telemetry.py HostTelemetry)
    hosts_age_s: float | None = None    # since it was taken; None before the first


class _Rank:
    def __init__(self, host: str):
        self.host = host
        self.state = "starting"
        self.metrics: dict[str, float] = {}
        self.last_seen: float | None = None
        self.lines: deque[float] = deque()


class LiveRun:
    def __init__(self, hosts: list[str], now: float):
        self.started = now
        self._ranks = [_Rank(h) for h in hosts]
        self._steps: deque[tuple[float, int]] = deque()      # (when, the job's step) each time it moved
        self._hosts: tuple = ()
        self._hosts_seen: float | None = None
        self._lock = threading.Lock()

    def hosts_seen(self, hosts, now: float) -> None:
        """The hosts' telemetry sample (observe/telemetry.py HostTelemetry, one per host), shown under the ranks."""
        with self._lock:
            self._hosts, self._hosts_seen = tuple(hosts), now

    def step(self) -> int | None:
        """The job's step: the slowest reporting rank's (None before the first metrics line)."""
        with self._lock:
            return self._job_step()

    def update(self, rank: int, kind: str, value, now: float) -> None:
        if not 0 <= rank < len(self._ranks):
            return
        with self._lock:
            r = self._ranks[rank]
            if kind == "straggler":          # not a sign of life: the lack of one
                if r.state in ("starting", "running"):
                    r.state = "behind"
                return
            r.last_seen = now
            if kind in ("exit", "lost"):     # lost: it died without reporting an exit
                r.state = "finished" if kind == "exit" and value == 0 else "failed"
                return
            if r.state == "starting" or (r.state == "behind" and kind in ("out", "err", "metrics")):
                r.state = "running"
            if kind in ("out", "err"):
                r.lines.append(now)
                while r.lines and r.lines[0] < now - RATE_WINDOW_S:
                    r.lines.popleft()
            elif kind == "metrics":
                r.metrics.update(value)
                if "step" in value:
                    self._step_moved(now)

    def _step_moved(self, now: float) -> None:
        step = self._job_step()
        if step is None or (self._steps and self._steps[-1][1] >= step):
            return
        self._steps.append((now, step))
        while len(self._steps) > 2 and self._steps[1][0] < now - STEP_WINDOW_S:
            self._steps.popleft()

    def _job_step(self) -> int | None:
        steps = [int(r.metrics["step"]) for r in self._ranks if "step" in r.metrics]
        return min(steps) if steps else None

    def snapshot(self, now: float) -> Snapshot:
        with self._lock:
            window = max(1.0, min(RATE_WINDOW_S, now - self.started))
            rows = [RankRow(i, r.host, r.state, _int(r.metrics.get("step")), _int(r.metrics.get("total_steps")),
                            r.metrics.get("loss"), r.metrics.get("tokens_per_s"), r.metrics.get("peak_mem_mb"),
                            None if r.last_seen is None else max(0.0, now - r.last_seen),
                            sum(1 for t in r.lines if t >= now - RATE_WINDOW_S) / window,
                            r.metrics.get("share"))
                    for i, r in enumerate(self._ranks)]
            step = self._job_step()
            totals = [row.total_steps for row in rows if row.total_steps]
            total = max(totals) if totals else None
            eta = None
            if step is not None and total and len(self._steps) >= 2:
                (t0, s0), (t1, s1) = self._steps[0], self._steps[-1]
                if t1 > t0 and s1 > s0:
                    eta = max(0.0, max(0, total - step) / ((s1 - s0) / (t1 - t0)) - (now - t1))
            rates = [row.tokens_per_s for row in rows if row.tokens_per_s is not None]
            job = JobRow(now - self.started, step, total, eta, sum(rates) if rates else None)
            age = None if self._hosts_seen is None else max(0.0, now - self._hosts_seen)
            return Snapshot(rows, job, self._hosts, age)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


MAX_AGE_S = 30.0           # a replayed snapshot is aged by at most this (clocks of two machines differ)


def to_json(snap: Snapshot, taken: float) -> dict:
    """A snapshot as JSON-ready data, with the (epoch) time it was taken."""
    return {"taken": taken, "ranks": [dataclasses.asdict(r) for r in snap.ranks], "job": dataclasses.asdict(snap.job),
            "hosts": [h.as_json() for h in snap.hosts], "hosts_age_s": snap.hosts_age_s}


def from_json(doc: dict, now: float) -> Snapshot:
    """to_json's snapshot as it would read at epoch time `now`: its ages grown, its ETA counted down (pure)."""
    from .telemetry import HostTelemetry, RankProcess

    age = min(max(0.0, now - float(doc.get("taken") or now)), MAX_AGE_S)
    ranks = [dataclasses.replace(RankRow(**r), since_seen_s=None if r["since_seen_s"] is None
                                 else r["since_seen_s"] + age) for r in doc["ranks"]]
    job = JobRow(**doc["job"])
    job = dataclasses.replace(job, elapsed_s=job.elapsed_s + age,
                              eta_s=None if job.eta_s is None else max(0.0, job.eta_s - age))
    names = {f.name for f in dataclasses.fields(HostTelemetry)}
    hosts = tuple(HostTelemetry(**{k: (tuple(RankProcess(**p) for p in v) if k == "ranks" else
                                       tuple(v) if isinstance(v, list) else v)
                                   for k, v in h.items() if k in names}) for h in doc.get("hosts") or [])
    hosts_age = doc.get("hosts_age_s")
    return Snapshot(ranks, job, hosts, None if hosts_age is None else hosts_age + age)


class Replayed:
    """The panel's source for `attach`: the last snapshot a detached run's supervisor wrote, aged to now."""

    def __init__(self):
        self._doc: dict | None = None
        self._lock = threading.Lock()

    def seen(self, doc: dict) -> "Replayed":
        with self._lock:
            self._doc = doc
        return self

    def snapshot(self, now: float) -> Snapshot:
        """`now` is the panel's monotonic clock; the age is read from this machine's epoch clock."""
        with self._lock:
            doc = self._doc
        if doc is None:
            return Snapshot([], JobRow(0.0, None, None, None, None))
        return from_json(doc, time.time())


class LiveFile:
    """The live panel's snapshot (to_json), written to `path` every `every_s` seconds from a thread
    of its own, atomically, until stop() (which writes the last one): a detached run's supervisor keeps it for
    `attach` (hosts/scripts/follow.py sends it along with the output)."""

    def __init__(self, live, path: str, every_s: float = 1.0):
        self.live, self.path, self.every_s = live, path, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="clusterctl-live-file", daemon=True)

    def start(self) -> LiveFile:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._write()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._write()

    def _write(self) -> None:
        try:
            write_text(self.path, json.dumps(to_json(self.live.snapshot(time.monotonic()), time.time())))
        except (OSError, ValueError, TypeError):
            pass        # the panel is a view: the run goes on without it
