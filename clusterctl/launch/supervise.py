"""Launch a job over mpirun or mlx.launch and supervise it to the end.

    prepare(cluster, ...) -> Launch      what will run: argv, env, run directory (pure but for mkdir)
    supervise(launch, ...) -> Outcome    run it; stream `[rank N host]` lines; keep per-rank logs

Every rank runs under the bootstrap (bootstrap.py), so the supervisor sees tagged lines, heartbeats and exit
codes from each rank whatever the launcher. It stops the job — SIGTERM to the launcher's process group,
SIGKILL after a grace period, then `pkill -f <run id>` on every host over SSH — when a rank exits non-zero,
on Ctrl-C, when no rank has started within --start-timeout, or when a started rank has been silent (no
output, no heartbeat) for --hang-timeout.
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import shlex
import signal
import threading
import time
from collections import deque
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

from .bootstrap import BOOTSTRAP, parse_line
from ..errors import EXIT_INTERRUPTED, EXIT_TIMEOUT, ClusterctlError, LaunchError, SignalReceived, exit_for_signal
from ..hosts.fanout import run_all
from .hostfile import render as render_hostfile
from ..inventory import Cluster
from ..atomic import write_text as _write
from .backends import mlx_launch_argv, mpirun_argv, ssh_shim, write_ssh_shim
from .plan import LaunchPlan
from ..hosts.connector import Connector
from ..hosts.sshconfig import openssh_options, rsh_agent
from ..hosts.transport import LocalTransport

HEARTBEAT_S = 1.0
FINISH_TIMEOUT_S = 30.0
TAIL_LINES = 10


@dataclass
class Launch:
    run_id: str
    run_dir: str
    backend: str
    argv: list[str]
    env: dict[str, str]              # for the launcher process on this machine (PATH for the ssh shim)
    rank_env: dict[str, str]         # what every rank gets
    rank_hosts: list[str]            # rank -> host name
    start: Callable | None = None    # starts the launcher elsewhere (on the first host); None: here

    def describe(self) -> dict:
        return {"run_id": self.run_id, "backend": self.backend, "argv": self.argv, "command": shlex.join(self.argv),
                "launcher_env": self.env, "rank_env": self.rank_env, "rank_hosts": self.rank_hosts}


@dataclass
class Outcome:
    exit_code: int
    reason: str                       # one line: what happened
    failed_rank: int | None = None
    tail: list[str] = field(default_factory=list)
    replan: LaunchPlan | None = None  # the pre-flight found other hosts than the cached plan: launch again


PREFLIGHT_WAIT_S = 30.0


class _Preflight:
    """The pre-flight running beside a launch that started from the cached plan. If it fails, the job
    is stopped and its error raised (a missing script or python is named, not just a rank's exit); if it
    finds the hosts changed, the job is stopped and launched again with the fresh plan."""

    def __init__(self, future, plan: LaunchPlan):
        self.future, self.plan = future, plan

    def verdict(self, wait: float = 0.0) -> Outcome | None:
        if self.future is None:
            return None
        try:
            fresh = self.future.result(timeout=wait)
        except FutureTimeout:
            return None
        self.future = None
        if fresh != self.plan:
            return Outcome(1, "the hosts changed since the plan was cached: launching again", replan=fresh)
        return None


def rank_hosts(cluster: Cluster) -> list[str]:
    return [h.name for h in cluster.hosts for _ in range(h.slots)]


def prepare(cluster: Cluster, plan: LaunchPlan, *, script: str, args: list[str], backend: str, runs_root: str,
            connect_timeout: float = 10.0, launcher: list[str] | None = None, remote=None,
            extra_env: dict[str, str] | None = None) -> Launch:
    """Write the run directory (hostfile, ssh shim) and build the launcher command. With `remote` (the
    first host's transport) the launcher runs there: its files are copied to <workdir>/.clusterctl/runs/."""
    run_id = datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
    run_dir = os.path.abspath(os.path.join(runs_root, run_id))
    os.makedirs(run_dir, exist_ok=True)
    host0 = cluster.hosts[0]
    # On other machines this machine's path means nothing: there the run directory is runs/<id> in the
    # host's workdir (the bootstrap makes it absolute), where the bundled trainer keeps its checkpoints.
    rank_run_dir = run_dir if all(h.local for h in cluster.hosts) else f"runs/{run_id}"
    rank_env = {**plan.env, "CLUSTERCTL_WORLD_SIZE": str(cluster.world_size), "CLUSTERCTL_RUN_DIR": rank_run_dir,
                "CLUSTERCTL_RUN_ID": run_id, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    workdirs = [h.workdir for h in cluster.hosts for _ in range(h.slots)]
    workdir = workdirs[0] if len(set(workdirs)) == 1 else json.dumps(workdirs)   # the bootstrap picks its rank's
    program = ["-c", BOOTSTRAP, f"clusterctl-run-{run_id}", workdir, str(HEARTBEAT_S), script, *args]
    if remote is not None:
        return _prepare_remote(cluster, plan, remote, run_id, run_dir, rank_env, program, backend, connect_timeout)
    env: dict[str, str] = {}
    if backend == "mpi":
        hostfile = os.path.join(run_dir, "hostfile")
        _write(hostfile, render_hostfile(cluster, "openmpi"))
        argv = mpirun_argv(cluster, hostfile=hostfile, program=[host0.python, *program], env=rank_env,
                           rsh_agent=rsh_agent(cluster, connect_timeout=connect_timeout),
                           if_include=plan.if_include, as_root=os.geteuid() == 0)
    else:
        hostfile = os.path.join(run_dir, "hosts.json")
        _write(hostfile, render_hostfile(cluster, "mlx", backend=backend, env={}))
        if launcher is None:
            raise LaunchError("mlx.launch is not installed on this machine (pip install mlx)")
        shim_dir = write_ssh_shim(os.path.join(run_dir, "ssh"), _which("ssh"),
                                  openssh_options(cluster, connect_timeout=connect_timeout))
        env["PATH"] = shim_dir + os.pathsep + os.environ.get("PATH", "")
        argv = mlx_launch_argv(cluster, hostfile=hostfile, backend=backend, python=host0.python,
                               program=program, env=rank_env, launcher=launcher)
    launch = Launch(run_id, run_dir, backend, argv, env, rank_env, rank_hosts(cluster))
    _write(os.path.join(run_dir, "launch.json"), json.dumps(launch.describe(), indent=2) + "\n")
    return launch


def _prepare_remote(cluster, plan, remote, run_id, run_dir, rank_env, program, backend, connect_timeout) -> Launch:
    host0 = cluster.hosts[0]
    facts = remote.run('printf "%s\\n%s\\n%s" "$HOME" "$(id -u)" "$(command -v ssh)"', timeout=30).stdout.split("\n")
    home, uid, ssh = (facts + ["", "", ""])[:3]
    workdir = home + host0.workdir[1:] if host0.workdir.startswith("~") else host0.workdir
    there = f"{workdir.rstrip('/')}/.clusterctl/runs/{run_id}"
    prefix = ""
    if backend == "mpi":
        _write(os.path.join(run_dir, "hostfile"), render_hostfile(cluster, "openmpi"))
        uploads = [("hostfile", f"{there}/hostfile", None)]
        argv = mpirun_argv(cluster, hostfile=f"{there}/hostfile", program=[host0.python, *program], env=rank_env,
                           rsh_agent=rsh_agent(cluster, connect_timeout=connect_timeout),
                           if_include=plan.if_include, as_root=uid.strip() == "0")
    else:
        if not ssh:
            raise LaunchError(f"{host0.name} has no OpenSSH client (ssh) for mlx.launch")
        _write(os.path.join(run_dir, "hosts.json"), render_hostfile(cluster, "mlx", backend=backend, env={}))
        _write(os.path.join(run_dir, "ssh-shim"), ssh_shim(ssh, openssh_options(cluster, connect_timeout=connect_timeout)))
        uploads = [("hosts.json", f"{there}/hosts.json", None), ("ssh-shim", f"{there}/ssh/ssh", 0o755)]
        launcher = [host0.python, "-c", "import sys; from mlx._distributed_utils.launch import main; sys.exit(main())"]
        argv = mlx_launch_argv(cluster, hostfile=f"{there}/hosts.json", backend=backend, python=host0.python,
                               program=program, env=rank_env, launcher=launcher)
        prefix = f'PATH={shlex.quote(there + "/ssh")}:"$PATH"; export PATH; '
    command = prefix + "exec " + shlex.join(argv)

    def start(lines):
        # Copied only when the launch really starts: a dry run writes nothing on any host.
        for name, dest, mode in uploads:
            remote.put(os.path.join(run_dir, name), dest, mode=mode)
        return remote.stream(command, lines)   # closing its channel kills the launcher's tree there

    launch = Launch(run_id, run_dir, backend, argv, {}, rank_env, rank_hosts(cluster), start=start)
    described = {**launch.describe(), "launcher_host": host0.name, "remote_command": command}
    _write(os.path.join(run_dir, "launch.json"), json.dumps(described, indent=2) + "\n")
    return launch


def _which(name: str) -> str:
    import shutil
    found = shutil.which(name)
    if found is None:
        raise LaunchError(f"{name} is not installed on this machine")
    return found


class _Rank:
    def __init__(self, rank: int, host: str, log_path: str):
        self.rank, self.host = rank, host
        self.log = open(log_path, "a", encoding="utf-8", errors="replace")
        self.started = False
        self.exit_code: int | None = None
        self.last_seen = time.monotonic()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)


def supervise(launch: Launch, connector: Connector | None, *, emit: Callable[[str, bool], None],
              rank0_only: bool = False, start_timeout: float | None = None,
              hang_timeout: float | None = None, preflight=None, plan: LaunchPlan | None = None) -> Outcome:
    """Run the launcher and watch every rank until the job ends one way or another. `preflight` (a
    Future of discover()) verifies, while the job starts, the cached `plan` it was launched from."""
    check = _Preflight(preflight, plan)
    preflight_error: BaseException | None = None
    ranks = [_Rank(r, h, os.path.join(launch.run_dir, f"rank-{r}.log")) for r, h in enumerate(launch.rank_hosts)]
    launcher_log = open(os.path.join(launch.run_dir, "launcher.log"), "a", encoding="utf-8", errors="replace")
    lines: queue.Queue = queue.Queue()
    proc = launch.start(lines) if launch.start is not None else LocalTransport().stream(launch.argv, lines, launch.env)
    readers = proc.readers
    started_at = time.monotonic()
    outcome: Outcome | None = None
    previous = _stop_on_signals()
    try:
        while outcome is None:
            try:
                is_err, line = lines.get(timeout=0.2)
            except queue.Empty:
                line = None
            if line is not None:
                outcome = _handle(line, is_err, ranks, launcher_log, emit, rank0_only)
                if outcome is not None and outcome.exit_code == 0:
                    outcome = _finish(proc, readers, lines, ranks, launcher_log, emit, rank0_only)
                continue
            if proc.poll() is not None and not any(t.is_alive() for t in readers) and lines.empty():
                outcome = _launcher_ended(proc.returncode, ranks, launcher_log)
                break
            outcome = check.verdict() or _check_timeouts(ranks, started_at, start_timeout, hang_timeout)
        if outcome.replan is None and check.future is not None:
            # The job ended before the pre-flight did: its verdict still decides what to report (a rank's
            # "No such file" is less useful than "host h2: train.py does not exist there") and what to cache.
            if outcome.exit_code != 0:
                outcome = check.verdict(wait=PREFLIGHT_WAIT_S) or outcome
    except KeyboardInterrupt:
        outcome = Outcome(EXIT_INTERRUPTED, "interrupted (Ctrl-C): stopped every rank")
    except SignalReceived as e:
        outcome = Outcome(exit_for_signal(e.signum), f"{signal.Signals(e.signum).name} received: stopped every rank")
    except ClusterctlError as e:   # the pre-flight failed: stop the job, then say why
        preflight_error = e
        outcome = Outcome(1, str(e))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if proc.poll() is None or outcome is None or outcome.exit_code != 0:
            proc.stop()    # mpirun then stops its daemons and ranks
            leftover = sweep(connector, launch.run_id) if connector is not None else []
            if leftover and outcome is not None:
                outcome.reason += (f"; could not confirm that every process of the run is gone on "
                                   f"{', '.join(leftover)} (look for clusterctl-run-{launch.run_id} there)")
        for r in ranks:
            r.log.close()
        launcher_log.close()
    if preflight_error is not None:
        raise preflight_error
    if outcome.failed_rank is not None:
        outcome.tail = list(ranks[outcome.failed_rank].tail)
    return outcome


def _stop_on_signals() -> dict:
    """SIGTERM and SIGHUP (a closed terminal) stop the job like Ctrl-C does, instead of leaving it running."""
    def handler(signum, frame):
        raise SignalReceived(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, handler)
    return previous


def _handle(line, is_err, ranks, launcher_log, emit, rank0_only) -> Outcome | None:
    parsed = parse_line(line)
    if parsed is None or not 0 <= parsed[0] < len(ranks):
        launcher_log.write(line + "\n")
        launcher_log.flush()
        if line.strip():
            emit(f"[launcher] {line}", True)
        return None
    rank, kind, payload = parsed
    r = ranks[rank]
    r.last_seen = time.monotonic()
    if kind == "start":
        r.started = True
    elif kind in ("out", "err"):
        r.log.write(payload + "\n")
        r.log.flush()
        r.tail.append(payload)
        if not rank0_only or rank == 0:
            emit(f"[rank {rank} {r.host}] {payload}", kind == "err")
    elif kind == "exit":
        r.exit_code = int(payload) if payload.lstrip("-").isdigit() else 1
        if r.exit_code != 0:
            return Outcome(r.exit_code, f"rank {rank} on {r.host} exited {r.exit_code}", failed_rank=rank)
        if all(x.exit_code == 0 for x in ranks):
            return Outcome(0, f"all {len(ranks)} ranks finished")
    return None


def _finish(proc, readers, lines, ranks, launcher_log, emit, rank0_only) -> Outcome:
    """Every rank reported success: let the launcher shut down in order, keep its last words, and hold it
    to its exit status (mpirun complains, and fails, when a rank skipped MPI_Finalize)."""
    try:
        proc.wait(timeout=FINISH_TIMEOUT_S)
    except TimeoutError:
        return Outcome(1, f"every rank finished but the launcher did not exit within {FINISH_TIMEOUT_S:g}s")
    for t in readers:
        t.join(5)
    while not lines.empty():
        is_err, line = lines.get()
        _handle(line, is_err, ranks, launcher_log, emit, rank0_only)
    if proc.returncode != 0:
        return Outcome(proc.returncode, f"every rank finished but the launcher exited {proc.returncode} "
                       f"(see {launcher_log.name})")
    return Outcome(0, f"all {len(ranks)} ranks finished")


def _launcher_ended(code: int, ranks, launcher_log) -> Outcome:
    if code == 0 and all(r.exit_code == 0 for r in ranks):
        return Outcome(0, f"all {len(ranks)} ranks finished")
    missing = [r for r in ranks if r.exit_code is None]
    who = ", ".join(f"rank {r.rank} on {r.host}" for r in missing[:4])
    return Outcome(code or 1, f"the launcher exited {code} before {who} reported an exit"
                   f" (see {launcher_log.name})", failed_rank=missing[0].rank if missing else None)


def _check_timeouts(ranks, started_at, start_timeout, hang_timeout) -> Outcome | None:
    now = time.monotonic()
    if start_timeout and now - started_at > start_timeout:
        silent = [r for r in ranks if not r.started]
        if silent:
            names = ", ".join(f"rank {r.rank} on {r.host}" for r in silent)
            return Outcome(EXIT_TIMEOUT, f"start timeout: no sign of {names} after {start_timeout:g}s", failed_rank=silent[0].rank)
    if hang_timeout:
        hung = [r for r in ranks if r.started and r.exit_code is None and now - r.last_seen > hang_timeout]
        if hung:
            names = ", ".join(f"rank {r.rank} on {r.host}" for r in hung)
            return Outcome(EXIT_TIMEOUT, f"hang timeout: no output and no heartbeat from {names} for {hang_timeout:g}s",
                           failed_rank=hung[0].rank)
    return None


def sweep(connector: Connector, run_id: str, timeout: float = 15.0) -> list[str]:
    """Kill whatever is left of this run on every host: every rank carries its run id on its command line.
    Returns the hosts where something may survive (unreachable, or a process that would not die)."""
    token = f"clusterctl-run-{run_id}"
    # A regular expression that matches the ranks' command lines but no command line holding the pattern
    # itself: not the sweeping shell, nor a pgrep / pkill of a sweep running beside it on the same machine.
    pattern = shlex.quote(token.replace("run-", "ru[n]-", 1))
    wait = f"i=0; while pgrep -f {pattern} >/dev/null 2>&1 && [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done"
    # TERM, wait for them to go; KILL what is left, and wait again, so that nothing of the run is still
    # there when `run` returns
    script = (f"pkill -TERM -f {pattern} 2>/dev/null; {wait}; pkill -KILL -f {pattern} 2>/dev/null; {wait}; "
              f"if pgrep -f {pattern} >/dev/null 2>&1; then ps -o pid=,stat=,args= -p \"$(pgrep -d, -f {pattern})\" | cut -c1-160; exit 1; fi")

    def one(host):
        with connector.transport(host) as t:
            return t.run(script, timeout=timeout)

    group = run_all(connector.cluster.hosts, one, deadline=connector.connect_timeout + timeout + 5)
    return [name for name, outcome in group.items() if not outcome.ok]
