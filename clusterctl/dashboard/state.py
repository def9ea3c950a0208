"""What the dashboard shows, as JSON-ready data, read from what clusterctl already keeps: the hosts' telemetry
(observe/telemetry.py, sampled in a thread while a page is open), the runs' records (observe/runs.py; a detached
run's asked of its supervising host every DETACHED_S while a page is open: detach/follow.py), a run's
rank logs (its metrics lines, progress.py), the stacks a stall or `clusterctl stacks` saved, and the serve
endpoints the runs index knows (their health asked here).

    board = Board("runs", cluster)              # cluster: an inventory's Cluster, or None (no hosts shown)
    board.watch()                               # a page is open: sample the hosts (board.unwatch() when it closes)
    board.overview()                            # hosts, picture, runs, endpoints
    board.run("20261127-101500-1a2b3c")         # one run: its record, per-rank curves, held-out loss, stacks
    board.chat(run_id, messages)                # a served model's answer, through its endpoint

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

MAX_RUNS = 50               # the newest runs listed
MAX_POINTS = 2000           # a curve keeps at most this many points (thinned evenly beyond)
HEALTH_S = 5.0              # how often the endpoints' health is asked while a page is open
HEALTH_TIMEOUT_S = 2.0
CHAT_TIMEOUT_S = 120.0
CHAT_MAX_TOKENS = 256
STACKS_MAX_BYTES = 64 * 1024
IDLE_S = 30.0               # the hosts are no longer sampled this long after the last page closed
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


class Board:
    """The dashboard's state: the hosts' last telemetry (sampled while a page watches), the endpoints' health,
    and each run's curves as read so far."""

    def __init__(self, runs_dir: str, cluster: Cluster | None = None, connector=None, interval: float = 3.0):
        self.runs_dir = runs_dir
        self.cluster = cluster
        self.connector = connector
        self.interval = interval
        self._picture = picture(cluster)
        self._hosts: list[dict] = []
        self._hosts_taken: float | None = None
        self._health: dict[str, dict] = {}
        self._curves: dict[str, Curves] = {}
        self._ended: dict[str, registry.RunInfo] = {}
        self._lock = threading.Lock()
        self._watchers = 0
        self._last_watch = 0.0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # -- sampling, while a page is open ---------------------------------------------------------------------
    def watch(self) -> None:
        with self._lock:
            self._watchers += 1
            self._last_watch = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._sample, name="dashboard-sampler", daemon=True)
                self._thread.start()
        self._wake.set()

    def unwatch(self) -> None:
        with self._lock:
            self._watchers = max(0, self._watchers - 1)
            self._last_watch = time.monotonic()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _watched(self) -> bool:
        with self._lock:
            return self._watchers > 0 or time.monotonic() - self._last_watch < IDLE_S

    def _sample(self) -> None:
        telemetry = None
        if self.cluster is not None and self.connector is not None:
            telemetry = Telemetry(self.connector, every=self.interval)
        next_health = next_detached = 0.0
        try:
            while not self._closed.is_set():
                if not self._watched():
                    if telemetry is not None:
                        telemetry.close()         # no page open: no connection held to any host
                    self._wake.wait(1.0)
                    self._wake.clear()
                    continue
                began = time.monotonic()
                if telemetry is not None:
                    hosts = telemetry.sample()
                    with self._lock:
                        self._hosts = [host_json(h) for h in hosts]
                        self._hosts_taken = time.time()
                if began >= next_health:
                    self._check_health()
                    next_health = began + HEALTH_S
                if began >= next_detached:
                    # a detached run: its state, record and curves from its supervising host (home once ended)
                    follow.refresh_all(self.runs_dir, only=follow.with_curves)
                    next_detached = began + DETACHED_S
                self._wake.clear()
                self._closed.wait(max(0.2, began + self.interval - time.monotonic()))
        finally:
            if telemetry is not None:
                telemetry.close()

    def _check_health(self) -> None:
        from ..serve.endpoint import healthy
        health = {}
        for run_id, service in self._services().items():
            health[run_id] = {"healthy": healthy(service["url"], HEALTH_TIMEOUT_S), "checked": time.time()}
        with self._lock:
            self._health = health

    # -- what a page reads ----------------------------------------------------------------------------------
    def _services(self, index: dict[str, dict] | None = None) -> dict[str, dict]:
        """run id -> {"url", "model", "dir"} of every `clusterctl serve` that is running now (from `index`, the runs
        index already read, when given)."""
        return {run_id: {"url": entry["service"]["url"], "model": entry["service"].get("model"), "dir": entry["dir"]}
                for run_id, entry in registry.services(index=index).items()
                if isinstance(entry.get("dir"), str) and "exit_code" not in entry and registry.run_alive(entry["dir"])}

    def _info(self, run_dir: str) -> registry.RunInfo:
        """run_info, kept for a run that has ended (its record no longer changes): a page asks every few seconds."""
        kept = self._ended.get(run_dir)
        if kept is not None:
            return kept
        info = registry.run_info(run_dir)
        if info.status not in ("running", "unknown"):
            self._ended[run_dir] = info
        return info

    def runs(self, index: dict[str, dict] | None = None) -> list[dict]:
        rows = []
        for info in registry.list_all(self.runs_dir, self._info, index)[:MAX_RUNS]:
            row = info.as_json()
            row["outcome"] = info.outcome
            rows.append(row)
        return rows

    def endpoints(self, index: dict[str, dict] | None = None) -> list[dict]:
        with self._lock:
            health = dict(self._health)
        return [{"run_id": run_id, "url": s["url"], "model": s["model"],
                 "healthy": health.get(run_id, {}).get("healthy")} for run_id, s in self._services(index).items()]

    def overview(self) -> dict:
        with self._lock:
            hosts, taken = list(self._hosts), self._hosts_taken
        if not hosts and self.cluster is not None:
            hosts = [host_json(HostTelemetry(name, "sampling")) for name in self.cluster.names]
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
        with self._lock:
            curves = self._curves.setdefault(run_dir, Curves())
        curves.update(run_dir)
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
        service = self._services().get(run_id)
        if service is None:
            raise UsageError(f"no running endpoint for run {run_id!r}")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str) for m in messages):
            raise UsageError("messages: a list of {role, content}")
        from ..serve.endpoint import request
        body = {"model": service["model"], "messages": messages, "max_tokens": CHAT_MAX_TOKENS}
        try:
            status, answer = request(service["url"], "/v1/chat/completions", body, timeout=CHAT_TIMEOUT_S)
        except OSError as e:
            raise UsageError(f"the endpoint {service['url']} did not answer: {e}") from None
        try:
            doc = json.loads(answer)
        except ValueError:
            doc = {}
        if status != 200:
            raise UsageError(f"the endpoint answered {status}: {answer[:200].decode('utf-8', 'replace')}")
        try:
            text = doc["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise UsageError("the endpoint's answer has no message") from None
        return {"content": text, "model": doc.get("model"), "usage": doc.get("usage")}


def host_json(h: HostTelemetry) -> dict:
    """A host's sample as the page reads it: its figures, and its row's cells as `top` prints them (telemetry.cells,
    in COLUMNS order: the page's table has those columns)."""
    return h.as_json() | {"cells": [cells(h)[c] for c in COLUMNS]}
