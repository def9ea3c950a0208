"""This machine as a transport: commands under /bin/sh in a session of their own, files in place.

    LocalTransport().run(command, timeout, env, cwd)   # /bin/sh; a timeout kills the whole process group
    LocalTransport().stream(command, lines, env, stdin) -> LocalProcess   # behind the same watchdog as a host's
    stop_process_group(popen)                          # TERM the group, KILL it after the grace period

Local commands still running when clusterctl exits are killed with their whole process group (the process
registry below). Remote commands need no such list: when this process exits its SSH connections close, and
each host's watchdog kills what was left (hosts/remote.py).
"""
from __future__ import annotations

import atexit
import os
import queue
import shlex
import signal
import subprocess
import threading

from ..errors import CommandTimeout
from .files import FileSession, LocalFiles
from .quoting import shell_command, short
from .remote import KILL_GRACE_S, env_input, reading_env, remote_command
from .scripts.writeall import write_all
from .stdinfeed import StdinFeed
from .transport import Process, Result, Transport


# An MPI process's identity in an environment: what Open MPI puts there for a singleton (a process that called
# MPI_Init with no mpirun: MLX's mx.distributed.init() in a notebook) or for a rank of an outer job. An mpirun
# started with it believes it is part of that job and exits 1 without a word.
_MPI_IDENTITY_PREFIXES = ("PMIX_", "OMPI_COMM_WORLD_", "OMPI_APP_CTX_", "OMPI_MCA_ess", "OMPI_MCA_orte_ess_")
_MPI_IDENTITY = {"OMPI_MCA_orte_launch", "OMPI_MCA_orte_precondition_transports", "OMPI_MCA_pmix",
                 "ORTE_SCHIZO_DETECTION"}


def mpi_identity(name: str) -> bool:
    """Whether an environment variable is part of an MPI process's identity (above)."""
    return name.startswith(_MPI_IDENTITY_PREFIXES) or name in _MPI_IDENTITY


def environment() -> dict[str, str]:
    """What a local command inherits: os.environ, never the C environment beneath it, and without an MPI
    process's identity (docs/facts/launchers.md#mpirun-under-an-mpi-singleton). MLX's MPI backend, initialised
    in this process, puts a singleton's identity in the C environment with putenv, where os.environ does not
    see it; a process started by one that had done so (a notebook's `!clusterctl run`) has it in os.environ."""
    return {k: v for k, v in os.environ.items() if not mpi_identity(k)}


class LocalTransport(Transport):
    """This machine: /bin/sh in a new session, so a timeout can kill the whole process group."""

    is_local = True

    def __init__(self, host: str = "localhost"):
        self.host = host

    def run(self, command, timeout, env=None, cwd=None) -> Result:
        script = shell_command(command, cwd)
        proc = subprocess.Popen(["/bin/sh", "-c", reading_env(script)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                env=environment())
        with _LIVE_LOCK:
            _LIVE.add(proc)
        try:
            out, err = proc.communicate(env_input(env), timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _kill_group(proc)
            raise CommandTimeout(self.host, short(command), timeout,
                                 out.decode(errors="replace"), err.decode(errors="replace")) from None
        except BaseException:   # Ctrl-C: never leave the group behind
            _kill_group(proc)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
        return Result(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def files(self) -> FileSession:
        return LocalFiles()

    def connect_tcp(self, address, port, timeout):
        import socket
        return socket.create_connection((address, port), timeout=timeout)

    def stream(self, command, lines, env=None, stdin=None) -> Process:
        """`command` (an argv, or a script of ours) under /bin/sh and the watchdog, `env` exported by the
        shell that starts it (read from its stdin: never on a command line)."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        return LocalProcess(argv, dict(env or {}), lines, stdin)


class LocalProcess(Process):
    """A process of this machine in its own process group, so stop() ends everything it started. It runs
    behind the same watchdog as a remote command, reading a pipe from us: if clusterctl dies, even by
    SIGKILL, the pipe closes and the watchdog kills the whole tree, so no launcher or rank outlives us."""

    def __init__(self, argv: list[str], env: dict[str, str], lines: queue.Queue,
                 stdin: StdinFeed | bool | None = None):
        self.proc = subprocess.Popen(["/bin/sh", "-c", remote_command(shlex.join(argv), env=True,
                                                                      stdin=stdin not in (None, False))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, env=environment())
        self.proc.stdin.write(env_input(env))
        self.proc.stdin.flush()
        if isinstance(stdin, StdinFeed):
            stdin.attach(self.feed)
        self.readers = [threading.Thread(target=_read_lines, args=(stream, is_err, lines), daemon=True)
                        for stream, is_err in ((self.proc.stdout, False), (self.proc.stderr, True))]
        for t in self.readers:
            t.start()

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float) -> int:
        # Popen.wait(timeout) polls with sleeps of up to 50 ms; a blocking wait in a thread returns the
        # moment the process exits.
        waiter = threading.Thread(target=self.proc.wait, daemon=True)
        waiter.start()
        waiter.join(timeout)
        if self.proc.returncode is None:
            raise TimeoutError(f"still running after {timeout:g}s")
        return self.proc.returncode

    def feed(self, data: bytes) -> None:
        # os.write in a loop, not the BufferedWriter: a signal mid-write must not lose frames (scripts/writeall.py)
        write_all(self.proc.stdin.fileno(), data)

    def stop(self) -> None:
        stop_process_group(self.proc)
        self.proc.stdin.close()


def _read_lines(stream, is_err: bool, lines: queue.Queue) -> None:
    for raw in iter(stream.readline, b""):
        lines.put((is_err, raw.decode(errors="replace").rstrip("\r\n")))


# Local commands still running when clusterctl exits (Ctrl-C reaches only the main thread, while fan-out
# runs them in worker threads) are killed with their whole process group.
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _kill_live_local_commands() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        stop_process_group(proc)


def stop_process_group(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group that `proc` leads (it was started with start_new_session), and SIGKILL it
    if the leader is still there after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_group(proc: subprocess.Popen) -> tuple[bytes, bytes]:
    stop_process_group(proc)
    return proc.communicate()
