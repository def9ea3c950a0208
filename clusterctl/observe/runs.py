"""The runs of a project's runs/ directory, or of every project (the runs index), as rows.

    infos = list_runs("runs")                 # newest first
    info = resolve("runs", "latest")          # or an id, a unique id prefix, a run directory
    info.outcome, info.final_loss

Everything is read from what a run left: launch.json (written before a run starts, by every clusterctl
version), run.json (what the run is: its kind, model and strategy, from its start), summary.json (at its end;
runs from before it existed show outcome "unknown"), clusterctl.pid (whether it is still running),
metrics.jsonl (the bundled trainer's losses). Nothing is required but the directory: a run killed before it
wrote anything is still listed, and a run recorded before clusterctl said what a run is lists without it.
"""
from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import asdict, dataclass
from datetime import datetime

from ..errors import UsageError
from ..hosts.scripts.contract import RUN_ID as RUN_ID_PATTERN
from ..hosts.scripts.contract import SupervisorState
from ..launch.stop import ranks_by_host
from ..trainer_contract import STEP_GLOB, checkpoint_step
from .record import FACTS, LOG_TIMES, PID_FILE, RANK_METRICS, SUMMARY, index_path, iso

RUN_ID = re.compile(RUN_ID_PATTERN)


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    dir: str
    start: str | None               # ISO 8601
    duration_s: float | None
    hosts: list[str]
    world: int | None
    backend: str | None
    status: str                     # "ok", "failed", "stopped" (by the user), "running", "unknown"
    exit_code: int | None
    reason: str | None
    final_loss: float | None
    final_val_loss: float | None
    restarts: int = 0               # run --max-restarts: attempts after the first (runs/<id>/attempt-K/)
    test_loss: float | None = None  # a fine-tune's test.jsonl, scored at its end (train/testset.py)
    test_perplexity: float | None = None
    # program.Capabilities.describe: train, fine-tune, adapters, serve, program (None: an older record)
    kind: str | None = None
    model: str | None = None
    strategy: str | None = None
    supervisor: str | None = None   # a detached run not yet home: the host its supervisor runs on

    def as_json(self) -> dict:
        return asdict(self)

    @property
    def outcome(self) -> str:
        after = f", after {self.restarts} restart{'s' * (self.restarts != 1)}" if self.restarts else ""
        if self.supervisor is not None:      # detached, not yet home
            return (f"{self.status} (detached, on {self.supervisor})" + (f": {self.reason}" if self.reason else "")
                    + after)
        if self.status in ("running", "unknown"):
            return self.status + after
        if self.status == "stopped":
            return (f"stopped: {self.reason}" if self.reason else "stopped") + after
        reason = _cause_only(self.reason) if self.reason else ""
        return (f"exit {self.exit_code}: {reason}" if reason else f"exit {self.exit_code}") + after


def _cause_only(reason: str) -> str:
    """A failure's reason as a table cell: its cause, without the fix and the ranks that followed from it
    (launch/supervise.py named; summary.json keeps the whole line)."""
    return re.sub(r" -> [^;]*|; (?:followed from it|also): .*?(?=; not restarted: |$)", "", reason)


def attempts(run_dir: str) -> list[int]:
    """The attempts of a restartable run that have logs (runs/<id>/attempt-K/), in order; [] for another run."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"attempt-(\d+)", n))
                  and os.path.isdir(os.path.join(run_dir, n)))


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def read_metrics(run_dir: str) -> list[dict]:
    """metrics.jsonl's records (a torn last line, from a run still writing, is skipped)."""
    records = []
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    records.append(value)
    except OSError:
        pass
    return records


def test_scores(records: list[dict]) -> dict:
    """The test.jsonl scores a fine-tune's end added to metrics.jsonl, as RunInfo's fields (none: {})."""
    last = next((r for r in reversed(records) if _number(r.get("test_loss")) is not None), None)
    return {} if last is None else {"test_loss": _number(last["test_loss"]),
                                    "test_perplexity": _number(last.get("test_perplexity"))}


def final_losses(records: list[dict]) -> tuple[float | None, float | None]:
    loss = next((n for r in reversed(records) if (n := _number(r.get("loss"))) is not None), None)
    val = next((n for r in reversed(records) if (n := _number(r.get("val_loss"))) is not None), None)
    return loss, val


# A record is read field by field: a field of the wrong type (a damaged or hand-edited file) reads as absent,
# so one bad run never breaks the listing of the others.
def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _names(value) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def run_pid(run_dir: str) -> int | None:
    """The pid of the `clusterctl run` process of this run as its pid file says, when it was started on this
    machine (None: no pid file, or another machine's)."""
    try:
        with open(os.path.join(run_dir, PID_FILE), encoding="utf-8") as f:
            pid_text, _, host = f.read().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return None if host and host != socket.gethostname() else pid


def run_alive(run_dir: str) -> bool | None:
    """Whether the `clusterctl run` process of this run still exists: None when unknown (no pid file, or
    the run was started on another machine)."""
    pid = run_pid(run_dir)
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def id_time(run_id: str) -> float | None:
    """A run id starts with its local start time: 20250101-120000-abcdef."""
    try:
        return datetime.strptime(run_id[:15], "%Y%m%d-%H%M%S").timestamp()
    except ValueError:
        return None


def _last_write(run_dir: str) -> float | None:
    times = []
    for name in os.listdir(run_dir):
        if name.endswith(".log") or name in ("metrics.jsonl", LOG_TIMES, RANK_METRICS):
            try:
                times.append(os.stat(os.path.join(run_dir, name)).st_mtime)
            except OSError:
                pass
    return max(times) if times else None


def _status(record: dict) -> str:
    """An ended run's status from its summary.json (or the index's end line): "stopped" where it says the user
    stopped it, else by its exit code."""
    if record.get("outcome") == "stopped":
        return "stopped"
    return "ok" if _int(record.get("exit_code")) == 0 else "failed"


def _described(record: dict) -> dict:
    """kind, model and strategy as a record gives them (absent in records made before they were kept)."""
    return {key: _text(record.get(key)) for key in ("kind", "model", "strategy")}


def run_info(run_dir: str) -> RunInfo:
    """One run, from its directory."""
    run_dir = os.path.abspath(run_dir)
    run_id = os.path.basename(os.path.normpath(run_dir))
    launch = _read_json(os.path.join(run_dir, "launch.json")) or {}
    summary = _read_json(os.path.join(run_dir, SUMMARY))
    ranks = _names(launch.get("rank_hosts"))
    hosts = list(dict.fromkeys(ranks))
    metrics = read_metrics(run_dir)
    loss, val = final_losses(metrics)
    tested = test_scores(metrics)
    if summary is not None:
        code = _int(summary.get("exit_code"))
        return RunInfo(run_id, run_dir, _text(summary.get("started")), _number(summary.get("duration_s")),
                       _names(summary.get("hosts")) or hosts, _int(summary.get("world")) or len(ranks) or None,
                       _text(summary.get("backend")) or _text(launch.get("backend")),
                       _status(summary), code, _text(summary.get("reason")), loss, val,
                       max(_int(summary.get("restarts")) or 0, 0), **tested, **_described(summary))
    detached = _read_json(os.path.join(run_dir, "detached.json"))
    if detached is not None:        # a detached run not yet home (detach/follow.py): as its supervisor's host said
        said = _read_json(os.path.join(run_dir, "detached-state.json")) or {}
        state = said.get("state")
        status = "running" if state == SupervisorState.RUNNING else "unknown"
        why = None if state in (None, SupervisorState.RUNNING) else f"{state}" + (f": {said['why']}" if said.get("why") else "")
        if state == SupervisorState.RUNNING and isinstance(said.get("step"), int):        # its live panel's, on its host
            why = f"step {said['step']}" + (f"/{said['total_steps']}" if isinstance(said.get("total_steps"), int) else "")
        if loss is None and state == SupervisorState.RUNNING and isinstance(said.get("loss"), (int, float)):
            loss = float(said["loss"])
        start = id_time(run_id)
        facts = _read_json(os.path.join(run_dir, FACTS)) or {}      # what the last look brought (follow.snapshot)
        return RunInfo(run_id, run_dir, iso(start) if start is not None else None, None, hosts or
                       [h.get("name") for h in (detached.get("cluster") or {}).get("hosts", []) if isinstance(h, dict)],
                       len(ranks) or _int(facts.get("world")), _text(launch.get("backend")), status, None, why, loss,
                       val, max(len(attempts(run_dir)) - 1, 0), **tested, **_described(facts),
                       supervisor=_text(detached.get("supervisor")))
    facts = _read_json(os.path.join(run_dir, FACTS)) or {}
    start = id_time(run_id)
    alive = run_alive(run_dir)
    last = _last_write(run_dir) if os.path.isdir(run_dir) else None
    end = None if alive else last
    duration = round(end - start, 3) if start is not None and end is not None and end >= start else None
    return RunInfo(run_id, run_dir, iso(start) if start is not None else None, duration, hosts,
                   len(ranks) or _int(facts.get("world")), _text(launch.get("backend")),
                   "running" if alive else "unknown", None, None, loss, val, max(len(attempts(run_dir)) - 1, 0),
                   **tested, **_described(facts))


def _run_dirs(runs_dir: str) -> list[str]:
    try:
        names = os.listdir(runs_dir)
    except FileNotFoundError:
        return []
    return [os.path.join(runs_dir, n) for n in names
            if RUN_ID.fullmatch(n) and os.path.isdir(os.path.join(runs_dir, n))]


def list_runs(runs_dir: str, read=run_info) -> list[RunInfo]:
    """The runs in `runs_dir`, newest first (`read`: how one is read from its directory, run_info or a cache of it)."""
    return sorted((read(d) for d in _run_dirs(runs_dir)), key=lambda r: r.run_id, reverse=True)


def rank_placement(runs_dir: str, run_id: str) -> dict[str, list[int]] | None:
    """host -> the ranks the run's latest launch placed there, from its launch.json here (None: not here)."""
    launch = _read_json(os.path.join(runs_dir, run_id, "launch.json")) or {}
    hosts = launch.get("rank_hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return None
    return ranks_by_host(hosts)


def latest_checkpoint(runs_dir: str) -> tuple[str, str] | None:
    """(run id, its newest complete checkpoint's directory name) of the newest run in `runs_dir` that holds one
    (what `run` fetched home; a step directory with its state.json), None when no run does."""
    import glob

    for run_dir in sorted(_run_dirs(runs_dir), reverse=True):
        steps = [(step, os.path.basename(os.path.dirname(p)))
                 for p in glob.glob(os.path.join(glob.escape(run_dir), "checkpoints", STEP_GLOB, "state.json"))
                 if (step := checkpoint_step(os.path.basename(os.path.dirname(p)))) is not None]
        if steps:
            return os.path.basename(run_dir), max(steps)[1]
    return None


def read_index(path: str | None = None) -> dict[str, dict]:
    """run id -> its start line merged with its end line, from the runs index (pure reading; damaged
    lines are skipped)."""
    runs: dict[str, dict] = {}
    try:
        with open(path or index_path(), encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("run_id"), str):
                    runs.setdefault(record["run_id"], {}).update(record)
    except OSError:
        pass
    return runs


def services(path: str | None = None, index: dict[str, dict] | None = None) -> dict[str, dict]:
    """run id -> the index's entry of every `clusterctl serve` job it knows (its start line's "service" a dict
    with a URL), the start and end lines merged; from `index` when given (read_index's, already read)."""
    return {run_id: entry for run_id, entry in (read_index(path) if index is None else index).items()
            if isinstance(entry.get("service"), dict) and isinstance(entry["service"].get("url"), str)}


def service_urls(path: str | None = None) -> dict[str, str]:
    """run id -> URL of every `clusterctl serve` job the runs index knows (its start line's "service")."""
    return {run_id: entry["service"]["url"] for run_id, entry in services(path).items()}


def list_all(runs_dir: str, read=run_info, index: dict[str, dict] | None = None) -> list[RunInfo]:
    """Every run the index knows (every project on this machine), plus those of `runs_dir` it does not
    (made before the index existed); read from their directories when they still exist (with `read`, as
    list_runs). `index`: read_index()'s, when the caller has read it already. A run of `runs_dir` is shown as it
    is there, whatever else the index says of its id (a detached run's supervisor that shares this machine's
    index records its own directory, on its host)."""
    found: dict[str, RunInfo] = {r.run_id: r for r in list_runs(runs_dir, read)}
    listed = {os.path.abspath(r.dir) for r in found.values()}
    for run_id, entry in (read_index() if index is None else index).items():
        directory = entry.get("dir")
        if not isinstance(directory, str) or os.path.abspath(directory) in listed or run_id in found:
            continue
        if os.path.isdir(directory):
            found[run_id] = read(directory)
            continue
        code = _int(entry.get("exit_code"))
        status = "unknown" if "exit_code" not in entry else _status(entry)
        found[run_id] = RunInfo(run_id, directory, _text(entry.get("started")), _number(entry.get("duration_s")),
                                _names(entry.get("hosts")), _int(entry.get("world")), _text(entry.get("backend")),
                                status, code, (_text(entry.get("reason")) or "") + " (directory gone)", None, None,
                                **_described(entry))
    return sorted(found.values(), key=lambda r: r.run_id, reverse=True)


def resolve(runs_dir: str, ref: str) -> RunInfo:
    """A run from what a user types: `latest`, a run directory, a run id or a unique prefix of one (looked
    up in `runs_dir`, then in the runs index)."""
    if os.path.isdir(ref) and (os.path.exists(os.path.join(ref, "launch.json")) or
                               os.path.exists(os.path.join(ref, "metrics.jsonl"))):
        return run_info(ref)
    local = list_runs(runs_dir)
    if ref == "latest":
        if not local:
            raise UsageError(f"no runs in {runs_dir}/ (run `clusterctl run` first, or give --runs-dir)")
        return local[0]
    matches = [r for r in local if r.run_id.startswith(ref)]
    if not matches:
        matches = [run_info(e["dir"]) for i, e in read_index().items()
                   if i.startswith(ref) and isinstance(e.get("dir"), str) and os.path.isdir(e["dir"])]
    exact = [r for r in matches if r.run_id == ref]
    if exact:
        return exact[0]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"no run {ref!r} in {runs_dir}/ or the runs index (`clusterctl runs --all` lists them)")
    ids = ", ".join(r.run_id for r in matches[:5])
    raise UsageError(f"{ref!r} matches {len(matches)} runs ({ids}{', ...' if len(matches) > 5 else ''}): give more of the id")
