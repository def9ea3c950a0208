"""A detached run from this machine: its record here, following it (attach) and bringing it home.

    record = Record.read(run_dir)                   # runs/<id>/detached.json: the supervisor, its host, the cluster
    code = follow(record, out)                      # supervisor.log from the start, as it grows, to its end
    snapshot(record, run_dir)                       # while it runs: its run directory as it is now (logs, stacks)
    home(record, run_dir)                           # once ended: the supervising host's run directory into run_dir

The record keeps the cluster as this machine reaches it (without the ranks' env values; 0600 all the same), so that
`attach`, `runs`, `logs`, `stacks` and `kill` reach the supervisor and the ranks without --hosts.
"""
from __future__ import annotations

import json
import os
import queue
import time
from dataclasses import dataclass
from typing import Callable

from ..atomic import write_text
from ..hosts import hostscript
from ..hosts.connector import Connector
from ..hosts.scripts.contract import END_MARK, LIVE_MARK, SupervisorState
from ..inventory import Cluster, Host
from . import handoff, supervisor

RECORD = "detached.json"
HOME_MARK = "detached-home.json"                  # written once the run directory came home
SUMMARY = "summary.json"                          # observe/record.py's: how the run ended


@dataclass(frozen=True)
class Record:
    run_id: str
    supervisor: str           # the supervising host's name
    folder: str               # its folder there (supervisor.folder)
    pid: int
    started: float
    cluster: Cluster          # as this machine reaches it

    @property
    def host(self) -> Host:
        return self.cluster.host(self.supervisor)

    def connector(self, connect_timeout: float) -> Connector:
        return Connector(self.cluster, connect_timeout=connect_timeout)

    def write(self, run_dir: str) -> None:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        write_text(os.path.join(run_dir, RECORD), json.dumps({
            "run_id": self.run_id, "supervisor": self.supervisor, "folder": self.folder, "pid": self.pid,
            "started": self.started, "cluster": handoff.cluster_to_dict(self.cluster)}, indent=1), mode=0o600)

    @classmethod
    def read(cls, run_dir: str) -> Record | None:
        """The record of a detached run in run_dir, or None (an attached run's directory)."""
        try:
            with open(os.path.join(run_dir, RECORD), encoding="utf-8") as f:
                data = json.load(f)
            return cls(data["run_id"], data["supervisor"], data["folder"], int(data["pid"]), float(data["started"]),
                       handoff.cluster_from_dict(data["cluster"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def is_home(run_dir: str) -> bool:
    return os.path.exists(os.path.join(run_dir, HOME_MARK))


def state(record: Record, connect_timeout: float = 10.0, op: str = "state") -> dict:
    """How the supervisor is ({"state": "running"|"ended"|"lost"|"unreachable"|..., ...}), asked on its host
    (op "stop": SIGTERM to it first, supervisor.state)."""
    connector = record.connector(connect_timeout)
    try:
        return supervisor.state(connector, record.host, record.run_id, op=op)
    except Exception as e:        # noqa: BLE001 - any way of not reaching it is "unreachable", said with its reason
        return {"state": SupervisorState.UNREACHABLE, "why": str(e).splitlines()[0] if str(e) else type(e).__name__}


def follow(record: Record, write: Callable[[str], None], offset: int = 0, connect_timeout: float = 10.0,
           live: Callable[[dict], None] | None = None) -> dict:
    """Write the supervisor's output from byte `offset` as it comes, to the supervisor's end; its state then.
    `live` is given the live panel's snapshots as they come (observe/live.py to_json). KeyboardInterrupt stops
    following (the run goes on)."""
    connector = record.connector(connect_timeout)
    host = record.host
    lines: queue.Queue = queue.Queue()
    with connector.transport(host) as t:
        proc = hostscript.start(t, host.python, "follow.py", record.folder, "follow", str(offset), lines=lines)
        try:
            final = None
            while True:
                try:
                    item = lines.get(timeout=0.5)
                except queue.Empty:
                    if proc.poll() is not None and lines.empty():
                        break
                    continue
                text = item[1] if isinstance(item, tuple) else item
                if text is None:
                    continue
                if text.startswith(END_MARK):
                    final = hostscript.message(text[len(END_MARK):])
                    continue
                if text.startswith(LIVE_MARK):
                    if live is not None:
                        try:
                            live(hostscript.message(text[len(LIVE_MARK):]))
                        except ValueError:
                            pass
                    continue
                write(text)
            return final or {"state": SupervisorState.UNKNOWN, "why": "the follow ended without the supervisor's state"}
        finally:
            proc.stop()


def snapshot(record: Record, run_dir: str, connect_timeout: float = 10.0,
             only: Callable[[str], bool] | None = None) -> tuple[int, int]:
    """The supervising host's run directory as it is now (with `only`: the files whose relative path it accepts)
    into run_dir, not marked home (the run goes on): what `logs`, `stacks` and `runs` read of a running one. Asked
    again and again (`logs -f`), it fetches what grew or is new, not the logs and checkpoints already here."""
    from ..transfer.stage import fetch_tree

    return fetch_tree(record.connector(connect_timeout), record.host, record.folder, run_dir, only=only, growing=True)


def small_files(rel: str) -> bool:
    """What `runs` shows of a running detached run: its launch, facts and metrics (not its logs, not stacks)."""
    return "/" not in rel and (rel.endswith(".json") or rel == "metrics.jsonl")


def with_curves(rel: str) -> bool:
    """What the dashboard shows of a running detached run: small_files and every rank's metrics lines (its
    curves: progress.py RANK_METRICS)."""
    from ..progress import RANK_METRICS

    return small_files(rel) or rel == RANK_METRICS


def home(record: Record, run_dir: str, connect_timeout: float = 10.0) -> tuple[int, int]:
    """The supervising host's run directory of an ended run into run_dir (files, bytes), marked home."""
    from ..transfer.stage import fetch_tree

    connector = record.connector(connect_timeout)
    got = fetch_tree(connector, record.host, record.folder, run_dir)
    write_text(os.path.join(run_dir, HOME_MARK), json.dumps({"at": time.time(), "files": got[0], "bytes": got[1]}))
    return got


def settle(record: Record, run_dir: str, state: dict) -> tuple[int, int]:
    """A detached run whose supervisor is no longer running ("ended" or "lost"): its run directory home; where the
    supervisor left no summary (killed, or its host lost), one written here that says so. (files, bytes)."""
    from ..errors import ClusterctlError

    if state.get("state") not in SupervisorState.OVER:
        raise ClusterctlError(f"run {record.run_id}: its supervisor on {record.supervisor} is "
                              f"{state.get('state')}: {state.get('why') or 'nothing more is known'}")
    got = home(record, run_dir)
    summary = os.path.join(run_dir, SUMMARY)
    if not os.path.exists(summary):
        code = state.get("code")
        if state["state"] == SupervisorState.LOST:
            why = f"its supervisor on {record.supervisor} was lost ({state.get('why') or 'no exit code'})"
        elif isinstance(code, int) and code < 0:
            why = f"its supervisor on {record.supervisor} was killed by signal {-code} before the run ended"
        else:
            why = f"its supervisor on {record.supervisor} exited {code} without a summary"
        write_text(summary, json.dumps({"run_id": record.run_id, "exit_code": 1, "outcome": "failed",
                                        "reason": why + "; the ranks stop within their hang timeout, and "
                                        "`clusterctl run --resume latest` continues from the newest checkpoint",
                                        "supervisor": record.supervisor, "hosts": record.cluster.names}, indent=1))
    return got


STATE_FILE = "detached-state.json"                # what the supervisor's host said last (runs reads it)


def refresh(run_dir: str, connect_timeout: float = 10.0, only: Callable[[str], bool] | None = small_files
            ) -> dict | None:
    """A detached run not yet home: asked how it is; once ended (or lost), brought home (settle); while it runs,
    what `only` picks of its run directory fetched (snapshot; None: all of it); its state kept in run_dir for
    `runs` to show. None for a run that is not detached, or home already."""
    record = Record.read(run_dir)
    if record is None or is_home(run_dir):
        return None
    now = state(record, connect_timeout)
    if now.get("state") in SupervisorState.OVER:
        try:
            settle(record, run_dir, now)
        except Exception as e:       # noqa: BLE001 - not home yet: said in its state, tried again next time
            now = {"state": SupervisorState.UNREACHABLE, "why": f"could not bring it home: {e}"}
    elif now.get("state") == SupervisorState.RUNNING:
        try:
            snapshot(record, run_dir, connect_timeout, only=only)
        except Exception:            # noqa: BLE001 - its step and loss are shown when they can be read
            pass
    write_text(os.path.join(run_dir, STATE_FILE), json.dumps({**now, "supervisor": record.supervisor,
                                                             "at": time.time()}))
    return now


def look(run_dir: str, connect_timeout: float = 10.0, only: Callable[[str], bool] | None = None) -> dict | None:
    """refresh() for a command that reads the run directory (logs, stacks): the supervisor's state, or one line
    (ClusterctlError) when it cannot be asked; None for a run that is not detached, or home already."""
    from ..errors import ClusterctlError

    now = refresh(run_dir, connect_timeout, only)
    if now is not None and now.get("state") not in (SupervisorState.RUNNING, *SupervisorState.OVER):
        record = Record.read(run_dir)
        raise ClusterctlError(f"run {os.path.basename(run_dir)}: its supervisor on "
                              f"{record.supervisor if record else '?'} could not be asked ({now.get('state')}: "
                              f"{now.get('why') or 'no reason given'}); try again once it answers")
    return now


def not_home(runs_dir: str) -> list[str]:
    """The run directories of runs_dir that hold a detached run's record and are not yet home, by name."""
    try:
        dirs = sorted(os.path.join(runs_dir, n) for n in os.listdir(runs_dir))
    except OSError:
        return []
    return [d for d in dirs if os.path.exists(os.path.join(d, RECORD)) and not is_home(d)]


def refresh_all(runs_dir: str, connect_timeout: float = 10.0, only: Callable[[str], bool] | None = small_files
                ) -> None:
    """refresh() for each detached run in runs_dir not yet home, all at once."""
    from concurrent.futures import ThreadPoolExecutor

    waiting = not_home(runs_dir)
    if waiting:
        with ThreadPoolExecutor(max_workers=min(8, len(waiting))) as pool:
            list(pool.map(lambda d: refresh(d, connect_timeout, only), waiting))


def stop(record: Record, run_dir: str, wait_s: float, connect_timeout: float = 10.0) -> dict:
    """SIGTERM to the supervisor, then up to wait_s for it to end (its ranks write their checkpoint and stop),
    then the run brought home; the last state."""
    now = state(record, connect_timeout, op="stop")
    deadline = time.monotonic() + wait_s
    while now.get("state") == SupervisorState.RUNNING and time.monotonic() < deadline:
        time.sleep(1.0)
        now = state(record, connect_timeout)
    if now.get("state") in SupervisorState.OVER:
        settle(record, run_dir, now)
    return now


def waiting_on(runs_dir: str, cluster: Cluster) -> list[tuple[Record, str]]:
    """The detached runs of runs_dir not yet home that run on one of `cluster`'s hosts (the same address and
    port): (record, run directory)."""
    ours = {(h.hostname or h.name, h.port) for h in cluster.hosts}
    found = [(Record.read(d), d) for d in not_home(runs_dir)]
    return [(r, d) for r, d in found if r is not None and ours & {(h.hostname or h.name, h.port) for h in r.cluster.hosts}]


def stop_all(runs: list[tuple[Record, str]], wait_s: float, connect_timeout: float = 10.0) -> list[dict]:
    """stop() for each (record, run directory), all at once: their last states, in order (one that could not be
    brought home: {"state": "unreachable", "why": ...})."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: tuple[Record, str]) -> dict:
        try:
            return stop(item[0], item[1], wait_s, connect_timeout)
        except Exception as e:       # noqa: BLE001 - said with its run, the others stopped all the same
            return {"state": SupervisorState.UNREACHABLE, "why": f"could not bring it home: {e}"}

    if not runs:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(runs))) as pool:
        return list(pool.map(one, runs))

