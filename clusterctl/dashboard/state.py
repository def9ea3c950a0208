"""What the dashboard shows, as JSON-ready data, read from what clusterctl already keeps: the hosts' telemetry
(observe/telemetry.py), the runs' records (observe/runs.py; a detached run's asked of its supervising host every
DETACHED_S while a page is open: detach/follow.py), a run's rank logs (its metrics lines, progress.py), the stacks a
stall or `clusterctl stacks` saved, and the serve endpoints the runs index knows (endpoints.py: their health, the
chat).

    board = Board("runs", cluster)              # cluster: an inventory's Cluster, or None (no hosts shown)
    board.watch()                               # a page is open: sample the hosts (board.unwatch() when it closes)
    board.overview()                            # hosts, picture, runs, endpoints
    board.run("20261127-101500-1a2b3c")         # one run: its record, per-rank curves, held-out loss, stacks
    board.chat(run_id, messages)                # a served model's answer, through its endpoint

Board only puts together rooms with one job each: HostSamples (the hosts' last telemetry), HealthPoller and
ChatProxy (endpoints.py: the HTTP client), CurvesCache and EndedRuns (what is kept from one request to the next),
and the Sampler (sampler.py: the one thread, which runs the jobs that fetch while a page is open).

Reading a run's curves re-reads only what its logs grew by since the last call (Curves keeps each log's offset),
so a long run costs a page no more than its new lines.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time

from .. import progress
from ..detach import follow
from ..errors import UsageError
from ..inventory import Cluster
from ..launch import backends
from ..observe import runs as registry
from ..observe.logs import rank_hosts, split_lines
from ..observe.record import RANK_METRICS
from ..observe.telemetry import COLUMNS, HostTelemetry, Telemetry, cells
from .endpoints import HEALTH_S, ChatProxy, HealthPoller, running
from .sampler import Job, Sampler

MAX_RUNS = 50               # the newest runs listed
MAX_POINTS = 2000           # a curve keeps at most this many points (thinned evenly beyond)
STACKS_MAX_BYTES = 64 * 1024
DETACHED_S = 5.0            # how often detached runs not yet home are asked how they are, while a page is open


def picture(cluster: Cluster | None) -> dict:
    """The cluster as nodes and links (pure): this machine, each host (its SSH target and data-plane address),
    SSH from here to each, and the data plane between hosts that have an address: for a backend whose ranks talk to
    their neighbours only (ring) each host to the next in inventory order (the ring the ranks form), otherwise
    every pair (MPI and jaccl reach every rank)."""
    if cluster is None:
        return {"nodes": [], "links": []}
    hosts = list(cluster.hosts)
    nodes = [{"id": h.name, "ssh": h.hostname or h.name, "address": h.address,
              "slots": h.slots} for h in hosts]
    links = [{"a": "this machine", "b": h.name, "kind": "ssh"} for h in hosts]
    plane = [h for h in hosts if h.address]
    if len(plane) >= 2:
        if backends.get(cluster.launch.backend).neighbours_only:
            pairs = [(plane[i], plane[(i + 1) % len(plane)]) for i in range(len(plane) if len(plane) > 2 else 1)]
        else:
            pairs = [(a, b) for i, a in enumerate(plane) for b in plane[i + 1:]]
        links += [{"a": a.name, "b": b.name, "kind": "data", "label": f"{a.address} - {b.address}"} for a, b in pairs]
    return {"nodes": nodes, "links": links, "backend": cluster.launch.backend}


def thin(points: list, limit: int = MAX_POINTS) -> list:
    """At most `limit` points, evenly spaced, the last one kept (pure)."""
    if len(points) <= limit:
        return points
    step = len(points) / (limit - 1)
    return [points[int(i * step)] for i in range(limit - 1)] + [points[-1]]


class Curves:
    """Each rank's curves (step, loss, tokens/s, share) and the held-out losses of a run, from its
    rank-metrics.jsonl (every metrics line a rank printed, observe/record.py), read incrementally: each call reads
    only what was appended since the last. A run recorded before that file existed is drawn from metrics.jsonl,
    rank 0's global figures, as one curve ("all ranks", rank -1)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._offset = 0
        self._inode: int | None = None
        self.ranks: dict[int, list[dict]] = {}
        self.held_out: list[list[float]] = []
        self.latest: dict[int, dict] = {}                 # rank -> its newest figures

    def update(self, run_dir: str) -> None:
        with self._lock:            # two pages asking at once read each new line once
            if not self._append(os.path.join(run_dir, RANK_METRICS)) and not self.ranks:
                for record in registry.read_metrics(run_dir):
                    self._add(-1, record)

    def _append(self, path: str) -> bool:
        try:
            with open(path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                if inode != self._inode:          # a new file (or replaced): from its start
                    self._reset()
                    self._inode = inode
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return False
        lines, used = split_lines(data)
        self._offset += used
        for _, text in lines:
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("rank"), int):
                self._add(record["rank"], record)
        return True

    def _add(self, rank: int, record: dict) -> None:
        fields = {k: v for k, v in record.items() if k in progress.FIELDS and isinstance(v, (int, float))}
        step = fields.get("step")
        if step is None:
            return
        point = {k: fields[k] for k in ("loss", "tokens_per_s", "share") if k in fields}
        if point:
            self.ranks.setdefault(rank, []).append({"step": step, **point})
        if "val_loss" in fields and (not self.held_out or self.held_out[-1][0] != step):
            self.held_out.append([step, fields["val_loss"]])
        self.latest[rank] = {**self.latest.get(rank, {}), **fields}


def latest_stacks(run_dir: str) -> dict | None:
    """The newest stacks saved for a run (runs/<id>/stacks/<time>/rank-N.txt): {"taken", "ranks": {rank: text}}."""
    base = os.path.join(run_dir, "stacks")
    try:
        taken = sorted(n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n)))
    except OSError:
        return None
    if not taken:
        return None
    folder = os.path.join(base, taken[-1])
    ranks = {}
    for name in sorted(os.listdir(folder)):
        if m := re.fullmatch(r"rank-(\d+)\.txt", name):
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    ranks[int(m.group(1))] = f.read(STACKS_MAX_BYTES).decode("utf-8", errors="replace")
            except OSError:
                continue
    return {"taken": taken[-1], "ranks": ranks}


class HostSamples:
    """The hosts' newest telemetry as the page shows it: sample() takes it (the sampler's job, every interval while a
    page is open; each host's probe kept running between samples), rest() stops the probes and closes the
    connections, rows() reads it: before the first sample, each host of the inventory as "sampling"."""

    def __init__(self, cluster: Cluster | None, connector=None, interval: float = 3.0):
        self.cluster = cluster
        self.telemetry = Telemetry(connector, every=interval) if cluster is not None and connector is not None else None
        self._lock = threading.Lock()
        self._rows: list[dict] = []
        self._taken: float | None = None

    def sample(self) -> None:
        hosts = self.telemetry.sample()
        with self._lock:
            self._rows = [host_json(h) for h in hosts]
            self._taken = time.time()

    def rest(self) -> None:
        self.telemetry.close()

    def rows(self) -> tuple[list[dict], float | None]:
        """(each host's row, when they were taken: None before the first sample)."""
        with self._lock:
            rows, taken = list(self._rows), self._taken
        if not rows and self.cluster is not None:
            rows = [host_json(HostTelemetry(name, "sampling")) for name in self.cluster.names]
        return rows, taken


class CurvesCache:
    """Each run's Curves, kept from one request to the next: reading a run's curves again reads only what its logs
    grew by."""

    def __init__(self):
        self._lock = threading.Lock()
        self._cache: dict[str, Curves] = {}

    def read(self, run_dir: str) -> Curves:
        with self._lock:
            curves = self._cache.setdefault(run_dir, Curves())
        curves.update(run_dir)
        return curves


class EndedRuns:
    """run_info, kept for a run that has ended (its record no longer changes): a page asks every few seconds."""

    def __init__(self):
        self._cache: dict[str, registry.RunInfo] = {}

    def info(self, run_dir: str) -> registry.RunInfo:
        kept = self._cache.get(run_dir)
        if kept is not None:
            return kept
        info = registry.run_info(run_dir)
        if info.status not in ("running", "unknown"):
            self._cache[run_dir] = info
        return info


class Board:
    """What the page reads, put together from the rooms that keep it: the hosts' samples, the endpoints' health and
    chat, each run's curves, and the sampler that keeps the first two (and the detached runs' records) fresh while a
    page watches."""

    def __init__(self, runs_dir: str, cluster: Cluster | None = None, connector=None, interval: float = 3.0):
        self.runs_dir = runs_dir
        self.cluster = cluster
        self.connector = connector
        self.interval = interval
        self._picture = picture(cluster)
        self.hosts = HostSamples(cluster, connector, interval)
        self.health = HealthPoller()
        self.chats = ChatProxy()
        self.curves = CurvesCache()
        self.ended = EndedRuns()
        jobs = [Job(self.hosts.sample, rest=self.hosts.rest)] if self.hosts.telemetry is not None else []
        jobs += [Job(self.health.poll, every=HEALTH_S),
                 # a detached run: its state, record and curves from its supervising host (home once ended)
                 Job(lambda: follow.refresh_all(self.runs_dir, only=follow.with_curves), every=DETACHED_S)]
        self.sampler = Sampler(jobs, interval)

    # -- while a page is open ---------------------------------------------------------------------------------------
    def watch(self) -> None:
        """A page is open: sample the hosts, ask the endpoints' health and the detached runs (unwatch() when it
        closes)."""
        self.sampler.watch()

    def unwatch(self) -> None:
        self.sampler.unwatch()

    def close(self) -> None:
        self.sampler.close()

    # -- what a page reads ------------------------------------------------------------------------------------------
    def runs(self, index: dict[str, dict] | None = None) -> list[dict]:
        rows = []
        for info in registry.list_all(self.runs_dir, self.ended.info, index)[:MAX_RUNS]:
            row = info.as_json()
            row["outcome"] = info.outcome
            rows.append(row)
        return rows

    def endpoints(self, index: dict[str, dict] | None = None) -> list[dict]:
        health = self.health.health()
        return [{"run_id": run_id, "url": s["url"], "model": s["model"],
                 "healthy": health.get(run_id, {}).get("healthy")} for run_id, s in running(index).items()]

    def overview(self) -> dict:
        hosts, taken = self.hosts.rows()
        index = registry.read_index()           # once for both the runs and the endpoints
        return {"now": time.time(), "hosts": hosts, "hosts_taken": taken, "picture": self._picture,
                "runs": self.runs(index), "endpoints": self.endpoints(index)}

    def _run_dir(self, run_id: str) -> str:
        if not registry.RUN_ID.fullmatch(run_id):
            raise UsageError(f"not a run id: {run_id!r}")
        info = registry.resolve(self.runs_dir, run_id)
        return info.dir

    def run(self, run_id: str) -> dict:
        run_dir = self._run_dir(run_id)
        info = registry.run_info(run_dir)
        curves = self.curves.read(run_dir)
        hosts = rank_hosts(run_dir) if os.path.isdir(run_dir) else {}
        ranks = []
        for rank in sorted(set(curves.ranks) | (set(hosts) if -1 not in curves.ranks else set())):
            latest = curves.latest.get(rank, {})
            ranks.append({"rank": rank, "host": hosts.get(rank, "?") if rank >= 0 else "all ranks", "step": latest.get("step"),
                          "total_steps": latest.get("total_steps"), "loss": latest.get("loss"),
                          "tokens_per_s": latest.get("tokens_per_s"), "share": latest.get("share"),
                          "curve": thin(curves.ranks.get(rank, []))})
        return {"run": {**info.as_json(), "outcome": info.outcome}, "ranks": ranks,
                "held_out": thin(curves.held_out), "stacks": latest_stacks(run_dir)}

    def chat(self, run_id: str, messages: list) -> dict:
        """The served model's answer to `messages` (OpenAI chat format), asked of the endpoint a running
        `clusterctl serve` recorded; only those endpoints, only their own model."""
        return self.chats.ask(run_id, messages)


def host_json(h: HostTelemetry) -> dict:
    """A host's sample as the page reads it: its figures, and its row's cells as `top` prints them (telemetry.cells,
    in COLUMNS order: the page's table has those columns)."""
    return h.as_json() | {"cells": [cells(h)[c] for c in COLUMNS]}
