"""One contract for running commands and moving files on a host, whether it is this machine or a machine
over SSH. Code above it never knows which one it holds.

    run(command, timeout, env=None, cwd=None) -> Result(exit_code, stdout, stderr)
    put(local_path, remote_path, mode=None)      # atomic: a temporary name, then rename
    get(remote_path, local_path)                 # atomic on this machine too
    files() -> FileSession                       # many file operations over one session (hosts/files.py)
    stream(command, lines, env=None, stdin=None) -> Process  # a long-running command, its output line by line
    connect_tcp(address, port, timeout)          # a byte stream to address:port as the host sees it
    open()                                       # connect now (SSH); nothing to do locally
    is_local                                     # True for this machine

Two implementations: LocalTransport (hosts/local.py) and SSHTransport (hosts/ssh.py). `command` is either an
argv list (every word quoted) or a string that is a shell script of our own making (hosts/quoting.py). A
host runs it behind a watchdog, with its `env` read from stdin, never from a command line (hosts/remote.py).
A streamed command may be given a `stdin` (a StdinFeed: `run` gives the controller's own, read once for all
its attempts, hosts/stdinfeed.py): its bytes reach the command while the channel, and with it the watchdog,
stays open (docs/run.md#standard-input).

    read_until(process, lines, timeout)          # a streamed command's output until it ends or time is up
"""
from __future__ import annotations

import os
import queue
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping, Sequence

from .files import Closeable, FileSession
from .stdinfeed import StdinFeed

DEFAULT_CONNECT_TIMEOUT_S = 10.0     # the one default: every SSH connection clusterctl opens, unless told


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Process(ABC):
    """A command started by Transport.stream: its stdout and stderr lines go to the queue given, as
    (is_stderr, line) pairs, from the reader threads in `readers`."""

    readers: list[threading.Thread]

    @abstractmethod
    def poll(self) -> int | None:
        """The exit status, or None while it runs."""

    @abstractmethod
    def wait(self, timeout: float) -> int:
        """Block until it exits (TimeoutError after `timeout` seconds)."""

    @property
    def returncode(self) -> int | None:
        return self.poll()

    @abstractmethod
    def stop(self) -> None:
        """End it and everything it started."""

    def feed(self, data: bytes) -> None:
        """Write `data` (stdin_frames, then STDIN_END) to a command started with stdin=True; OSError once it is
        gone. Only such a command takes it: a process that wraps others (launch/stdinrelay.py) does not."""
        raise NotImplementedError(f"{type(self).__name__} takes no stdin")


class Transport(Closeable, ABC):
    """Base of LocalTransport (hosts/local.py) and SSHTransport (hosts/ssh.py)."""

    host: str
    is_local = False

    @abstractmethod
    def run(self, command: str | Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
            cwd: str | None = None) -> Result:
        """Run `command` (in `cwd`, with `env`) to its end, or CommandTimeout after `timeout` seconds with
        everything it started killed."""

    @abstractmethod
    def files(self) -> FileSession:
        """A file session on the host (hosts/files.py): close it, or use it in a `with` block."""

    @abstractmethod
    def stream(self, command: str | Sequence[str], lines: queue.Queue,
               env: Mapping[str, str] | None = None, stdin: StdinFeed | bool | None = None) -> Process:
        """Start `command`; with a StdinFeed, its bytes become the command's stdin (the feed's next attempt),
        else /dev/null; `stdin=True`: the caller feeds it, Process.feed() (one source for many commands)."""

    @abstractmethod
    def connect_tcp(self, address: str, port: int, timeout: float):
        """A byte stream (send, recv, close, fileno: a socket or an SSH channel) to address:port as the host
        sees it, e.g. its own loopback: for SSH a direct-tcpip channel on this connection, as `ssh -L` opens
        (hosts/forward.py)."""

    def open(self) -> None:
        """Connect now rather than at the first command (doctor times the connection)."""

    def host_key(self) -> tuple[str, str] | None:
        """(type, base64) of the host key this connection verified; None for this machine."""
        return None

    def put(self, local_path: str, remote_path: str, mode: int | None = None) -> None:
        """Copy one file to the host atomically, creating its directory."""
        with self.files() as files:
            parent = os.path.dirname(remote_path)
            if parent:
                files.makedirs(parent)
            files.put(local_path, remote_path, mode)

    def get(self, remote_path: str, local_path: str) -> None:
        with self.files() as files:
            files.get(remote_path, local_path)


def read_until(proc: Process, lines: queue.Queue, timeout: float, progress_s: float = 0.0,
               cap: float | None = None) -> tuple[list[str], list[str], bool]:
    """A streamed command's (stdout lines, stderr lines, whether it finished) after it ends or `timeout`
    seconds pass, whichever comes first; a command still running then is stopped, and what it had printed
    so far is kept. With `progress_s`, a command still printing is given more time: every line moves the
    end to at least `progress_s` seconds after it, never beyond `cap` seconds from the start."""

    start = time.monotonic()
    deadline = start + timeout
    out: list[str] = []
    err: list[str] = []
    while True:
        done = proc.poll() is not None and not any(t.is_alive() for t in proc.readers)
        try:
            is_err, line = lines.get(timeout=0 if done else max(0.0, min(0.2, deadline - time.monotonic())))
            (err if is_err else out).append(line)
            if progress_s:
                deadline = max(deadline, min(time.monotonic() + progress_s, start + (cap or timeout)))
            continue
        except queue.Empty:
            pass
        if done:
            return out, err, True
        if time.monotonic() >= deadline:
            proc.stop()
            return out, err, False
