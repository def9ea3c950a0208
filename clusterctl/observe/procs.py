"""The processes of clusterctl runs on every host, and stopping them.

    found = list_processes(connector)            # host -> RunProcess rows (or the error reaching it)
    killed = kill_runs(connector, run_id, [run_dir])   # None: every clusterctl run; its own process first

Every process `run` starts for a rank carries `clusterctl-run-<id>` on its command line (launch/job.py):
the rank's python (kind "rank"), the shells that wrap it ("shell"), the ssh that reaches its host from the
launching machine ("ssh"), and mpirun ("launcher"). They are found with one portable ps (PS_COMMAND: the
same options on macOS's BSD ps and Linux's procps; no /proc) parsed by parse_ps, a pure function. A rank's
number is read from the `MLX_RANK=N` its wrapping shell sets (ring and jaccl); under mpirun it is not on
any command line, and is left unknown.

A run whose `clusterctl run` (or `serve`) process is alive on this machine is stopped through that process
first (SIGTERM, as a closed terminal would): it stops every rank itself, records the run as stopped and
never restarts it; the sweep then removes whatever is left.
"""
from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field

from ..detach.supervisor import DETACHED_DIR
from ..hosts.local import LocalTransport
from ..hosts.scripts.contract import RUN_ID, RUN_TOKEN, SupervisorState
from ..launch.launchers import sweep
from ..launch.stop import ask_to_stop
from ..trainer_contract import RUNS_DIR
from .record import PID_FILE, SUMMARY
from .runs import rank_placement, run_pid

STOP_WAIT_S = 30.0    # a stopped run's own cleanup: every rank stopped, the sweep on every host, the record
PS_COMMAND = "ps -A -o pid= -o ppid= -o etime= -o pcpu= -o rss= -o args="
PS_TIMEOUT_S = 20.0
KILL_WAIT_S = 60.0        # how long a run's ranks have, once asked, to end by themselves (the trainer checkpoints)
TOKEN = re.compile(RUN_TOKEN + "(" + RUN_ID + ")")
# a detached run's supervisor (`clusterctl run --handoff <its folder>/handoff.json`) and the keeper that waits for it
SUPERVISOR = re.compile(r"--handoff \S*" + re.escape(DETACHED_DIR) + "/(" + RUN_ID + r")/handoff\.json")
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+((?:\d+-)?(?:\d+:)?\d+:\d+)\s+(\d+(?:[.,]\d+)?)\s+(\d+)(?:\s(.*))?$")
_MLX_RANK = re.compile(r"\bMLX_RANK=['\"]?(\d+)")
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish", "tcsh", "csh"}
LAUNCHERS = {"mpirun", "mpiexec", "orterun", "prterun", "prte", "mlx.launch"}


@dataclass(frozen=True)
class PsRow:
    pid: int
    ppid: int
    age_s: int
    cpu: float            # percent of one core, as ps reports it
    rss_kb: int
    args: str


@dataclass(frozen=True)
class RunProcess:
    host: str
    run_id: str
    rank: int | None
    kind: str             # rank, shell, ssh, launcher, supervisor, keeper
    pid: int
    age_s: int
    cpu: float
    rss_kb: int
    command: str

    def as_json(self) -> dict:
        return asdict(self)


def etime_seconds(text: str) -> int:
    """ps's elapsed time, `[[DD-]HH:]MM:SS`, in seconds (pure)."""
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


def parse_ps(text: str) -> list[PsRow]:
    """PS_COMMAND's output as rows (pure). A line that does not start with the numeric columns continues
    the previous row's command line (a command line with a newline in it, where a ps prints it raw)."""
    rows: list[PsRow] = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if m is None:
            if rows and line.strip():
                last = rows[-1]
                rows[-1] = PsRow(last.pid, last.ppid, last.age_s, last.cpu, last.rss_kb, f"{last.args}\n{line}")
            continue
        pid, ppid, etime, cpu, rss, args = m.groups()
        rows.append(PsRow(int(pid), int(ppid), etime_seconds(etime), float(cpu.replace(",", ".")), int(rss),
                          args or ""))
    return rows


def kind_of(args: str) -> str:
    program = os.path.basename(args.split(None, 1)[0]) if args.strip() else ""
    if program.lstrip("-") in SHELLS:
        return "shell"
    if program == "ssh":
        return "ssh"
    if program in LAUNCHERS:
        return "launcher"
    return "rank"


def run_processes(host: str, rows: list[PsRow]) -> list[RunProcess]:
    """The rows of clusterctl runs, each with its run id, kind and (where a command line says it) rank;
    by run, rank, pid (pure)."""
    by_pid = {r.pid: r for r in rows}

    def rank_of(row: PsRow) -> int | None:
        seen = set()
        while row is not None and row.pid not in seen:      # the nearest MLX_RANK=N, self first
            seen.add(row.pid)
            m = _MLX_RANK.search(row.args)
            if m:
                return int(m.group(1))
            row = by_pid.get(row.ppid)
        return None

    found = []
    for row in rows:
        m = TOKEN.search(row.args)
        if m is not None:
            kind = kind_of(row.args)
        elif (m := SUPERVISOR.search(row.args)) is not None:        # the keeper's, or the shell starting it
            kind = "supervisor" if row.args.split()[1:3] == ["-m", "clusterctl"] else \
                "shell" if kind_of(row.args) == "shell" else "keeper"
        else:
            continue
        found.append(RunProcess(host, m.group(1), rank_of(row) if kind != "launcher" else None, kind, row.pid,
                                row.age_s, row.cpu, row.rss_kb, " ".join(row.args.split())[:200]))
    return sorted(found, key=lambda p: (p.run_id, p.kind not in ("supervisor", "keeper"),
                                        -1 if p.rank is None else p.rank, p.pid))


@dataclass(frozen=True)
class HostProcesses:
    host: str
    processes: list[RunProcess]
    error: str | None = None


def list_processes(connector, run_id: str | None = None) -> list[HostProcesses]:
    """Every host's clusterctl-run processes (of `run_id` only, when given), in inventory order."""
    group = connector.run_everywhere(PS_COMMAND, PS_TIMEOUT_S)
    found = []
    for name, outcome in group.items():
        if not outcome.ok:
            error = outcome.error or f"ps exited {outcome.value.exit_code}: {outcome.value.stderr.strip()}"
            found.append(HostProcesses(name, [], " ".join(str(error).split())))
            continue
        procs = [p for p in run_processes(name, parse_ps(outcome.value.stdout)) if run_id in (None, p.run_id)]
        found.append(HostProcesses(name, procs))
    return found


@dataclass(frozen=True)
class KillResult:
    unconfirmed: list[str]            # hosts the sweep could not reach, or where something would not die
    remaining: list[HostProcesses]    # what ps finds afterwards (run_id's, or every run's)
    asked: list[int] = field(default_factory=list)       # the ranks asked to stop first (SIGTERM), all runs together
    ended: bool = True                # and they all ended by themselves within the wait

    @property
    def left(self) -> int:
        return sum(len(h.processes) for h in self.remaining)


def supervisor(run_dir: str) -> int | None:
    """The pid of the process supervising the run in `run_dir` (`clusterctl run` or `serve`), when it runs on this
    machine and has not ended (no summary.json yet); None otherwise, and for a pid the system has given to
    another process since: its command line must name clusterctl and it must have started before the run
    wrote its pid file, or it is never signalled."""
    pid = run_pid(run_dir)
    if pid is None or os.path.exists(os.path.join(run_dir, SUMMARY)):
        return None
    try:
        written = os.stat(os.path.join(run_dir, PID_FILE)).st_mtime
    except OSError:
        return None
    # -ww: the whole command line whatever COLUMNS says (BSD ps and procps alike)
    r = LocalTransport().run(f"ps -ww -o pid= -o ppid= -o etime= -o pcpu= -o rss= -o args= -p {pid}", PS_TIMEOUT_S)
    row = next((row for row in parse_ps(r.stdout) if row.pid == pid), None)
    if row is None or "clusterctl" not in row.args or time.time() - row.age_s > written + 2:
        return None
    return pid


def stop_supervisor(run_dir: str, wait_s: float = STOP_WAIT_S) -> bool:
    """SIGTERM to the run's supervising process (supervisor()), then wait until it has recorded the end
    (summary.json) or is gone, up to `wait_s`. Whether there was one to stop."""
    pid = supervisor(run_dir)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not os.path.exists(os.path.join(run_dir, SUMMARY)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    return True


def stop_detached_supervisors(connector, listed: list[HostProcesses], wait_s: float) -> set[str]:
    """The detached runs' supervisors `ps` found on the hosts (`listed`): each sent SIGTERM through its folder there
    (detach/supervisor.py, op "stop": it stops its ranks with their checkpoint, and restarts nothing) and given
    wait_s to end; the ids of the runs so stopped. A run this machine has no record of (started from another one)
    is stopped this way too, where sweeping its ranks would only have its supervisor start them again."""
    from ..detach import supervisor

    found = sorted({(h.host, p.run_id) for h in listed for p in h.processes if p.kind == "supervisor"})
    hosts = {h.name: h for h in connector.cluster.hosts}
    asked = [(hosts[name], rid) for name, rid in found
             if supervisor.state(connector, hosts[name], rid, op="stop").get("signalled")]
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline:
        time.sleep(1.0)
        asked = [(h, rid) for h, rid in asked if supervisor.state(connector, h, rid).get("state") == SupervisorState.RUNNING]
    return {rid for _, rid in found}


def kill_runs(connector, run_id: str | None, run_dirs: list[str] = (), wait_s: float = KILL_WAIT_S,
              runs_dir: str = RUNS_DIR) -> KillResult:
    """Stop a run's processes (None: every clusterctl run's) on every host, then look again. `run_dirs`: the runs
    whose supervising process may be on this machine, stopped through it first (stop_supervisor, given `wait_s`
    more: it asks its ranks to stop with their work kept itself, docs/run.md#ctrl-c-and-sigterm). The ranks of
    every other run are each sent SIGTERM and given `wait_s` to end (the bundled trainer finishes its step and
    writes a checkpoint: launch/stop.py); a run recorded in `runs_dir` has each host ask only the ranks placed
    on it (hosts sharing a disk see each other's pid files). Then whatever is left is stopped as `run`'s own
    cleanup does (SIGTERM, then SIGKILL, waiting for them to go)."""
    through = {os.path.basename(os.path.normpath(d)) for d in run_dirs if stop_supervisor(d, STOP_WAIT_S + wait_s)}
    listed = list_processes(connector, run_id)         # once: the supervisors to ask, and every run's id
    through |= stop_detached_supervisors(connector, listed, wait_s)
    asked, ended = [], True
    if wait_s > 0:
        runs = [run_id] if run_id else sorted({p.run_id for h in listed for p in h.processes})
        runs = [rid for rid in runs if rid not in through]
        for rid in runs:                              # every run's ranks asked at once ...
            asked += ask_to_stop(connector, rid, signal.SIGTERM, ranks_of=rank_placement(runs_dir, rid)).ranks
        deadline = time.monotonic() + wait_s
        for rid in runs:                              # ... then waited for, within the one wait
            ended = not ask_to_stop(connector, rid, None, wait_s=max(deadline - time.monotonic(), 0)).left and ended
    unconfirmed = sweep(connector, run_id)
    return KillResult(unconfirmed, list_processes(connector, run_id), sorted(asked), ended)
