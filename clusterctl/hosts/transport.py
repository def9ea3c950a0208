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

`command` is either an argv list (every word quoted) or a string that is a shell script of our own making.
Values that come from users — host names, paths, env values — only ever reach a shell through `shlex.quote`
(or `quote_path`, which keeps a leading `~` meaning the remote home directory).

Remote commands run under /bin/sh whatever the user's login shell is (zsh on macOS), behind a small watchdog:
when the SSH channel closes — our timeout, Ctrl-C, a dropped connection — the watchdog sees its stdin end and
kills the command's whole process tree, so nothing is left running on the host.

The `env` given to run() and stream() never appears on a command line (any local user sees a process's argv
in `ps`, and inventories hold tokens): it is written to the command's stdin before anything else, and the
shell that starts the command reads it from there (env_input, remote_command; docs/security.md#where-secrets-go).
A streamed command may be given a `stdin` (a StdinFeed: `run` gives the controller's own, read once for all its
attempts, hosts/stdinfeed.py): its bytes follow the environment in frames the watchdog decodes into the
command's stdin, then an end frame, so the command sees EOF while the channel, and with it the watchdog, stays
open (docs/run.md#standard-input).
"""
from __future__ import annotations

import atexit
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import CommandTimeout
from .files import Closeable, FileSession, LocalFiles
from .stdinfeed import StdinFeed

KILL_GRACE_S = 2.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0     # the one default: every SSH connection clusterctl opens, unless told


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


# ---- quoting: pure functions ------------------------------------------------------------------------

def quote_path(path: str) -> str:
    """Quote a path for a POSIX shell, keeping `~` / `~/...` as the (remote) home directory."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def shell_command(command: str | Sequence[str], cwd: str | None = None) -> str:
    """The POSIX shell text that runs `command` in `cwd` (its environment comes on stdin: remote_command)."""
    body = command if isinstance(command, str) else shlex.join(command)
    lines = []
    if cwd:
        lines.append(f"cd {quote_path(cwd)} || exit 125")
    lines.append(body)
    return "\n".join(lines)


# The watchdog (docs/inventory.md#remote-commands): the command runs in the background; a watcher reads
# the channel's stdin (kept on fd 3: a background job's stdin would otherwise be /dev/null), which ends only
# when the channel closes. The watcher ends with its command: when the command exits, the main shell TERMs
# it (its pid confirmed, by ps, to still be the main shell's child) and reaps it, so nothing of ours is left
# on the host. When the channel closes first, the watcher (now ignoring TERM) signals only the command's
# tree as one ps listing shows it while the command's pid still has the main shell `$$` as its parent;
# after the grace period it SIGKILLs only those of them that are still the same processes (pid and start
# time, `lstart`, from a new listing: a pid reused in the meantime is spared, a descendant orphaned when
# the command died is not), and their new children. POSIX ps + awk only (macOS and Linux alike; dash has
# no job control, so no process groups, without a tty); `;`, not `&&`, between steps: a pid that exited
# after ps listed it makes `kill` return non-zero. The process lists go through ENVIRON: an awk -v value
# may not hold a newline (BSD awk).
_TREE = r"""ps -A -o pid= -o ppid= -o lstart= | T=$t C=$c M=$$ awk '{p[$1]=$2; s[$1]=$3" "$4" "$5" "$6" "$7}
    END{n=split(ENVIRON["T"], l, "\n"); for (i=1; i<=n; i++) {split(l[i], f, " "); w[f[1]]=substr(l[i], length(f[1])+2)}
      if (n == 0) {if (!(ENVIRON["C"] in p) || p[ENVIRON["C"]] != ENVIRON["M"]) exit; d[ENVIRON["C"]]=1}
      else for (x in w) if ((x in s) && s[x] == w[x]) d[x]=1
      m=1; while (m) {m=0; for (x in p) if (!(x in d) && (p[x] in d)) {d[x]=1; m=1}}
      for (x in d) print x " " s[x]}'"""
_KILL_ROUND = r"""trap '' TERM
  t=; t=$(@TREE@)
  [ -n "$t" ] || exit 0
  kill -TERM $(printf '%s\n' "$t" | awk '{print $1}')
  sleep @GRACE@
  t=$(@TREE@)
  [ -n "$t" ] && kill -KILL $(printf '%s\n' "$t" | awk '{print $1}')""".replace("@TREE@", _TREE)
_END = r"""w=$!
wait $c; s=$?
x=$(ps -A -o pid= -o ppid= | awk -v w="$w" -v m="$$" '$1 == w && $2 == m {print w}')
[ -n "$x" ] && kill -TERM "$x" 2>/dev/null
wait "$w" 2>/dev/null
exit $s"""
_WATCHDOG = r"""exec 3<&0
/bin/sh -c @SCRIPT@ </dev/null 3<&- &
c=$!
{ while IFS= read -r l <&3; do :; done
  @ROUND@
} >/dev/null 2>&1 &
exec 3<&-
@END@""".replace("@ROUND@", _KILL_ROUND).replace("@END@", _END)

# The same with the channel's data after the environment passed to the command's stdin
# (docs/run.md#standard-input): frames of one line each, `d<text>` (the text and a newline), `p<text>` (the
# text alone: a last line without one), and `e` (the end: the command's stdin closes, the channel stays
# open); in a text, a NUL byte and a backslash come as printf %b's octal escapes `\0000` and `\0134`
# (scripts/frames.py encodes them), so every byte passes. The watcher decodes them into a FIFO the command
# reads (the one pipe both the command, started first so that its pid is known, and the watcher can be
# given), under LC_ALL=C, its own: in a UTF-8 locale bash mangles `${l#d}` on a text that is not UTF-8
# (measured, docs/facts/macos.md#bash-locale-bytes); it ignores SIGPIPE, so a command that stops reading
# only ends the data.
_WATCHDOG_STDIN = r"""exec 3<&0
f=${TMPDIR:-/tmp}/.clusterctl-stdin.$$
rm -f "$f"; mkfifo -m 600 "$f" || exit 125
/bin/sh -c @SCRIPT@ <"$f" 3<&- &
c=$!
exec 4>"$f"; rm -f "$f"
{ trap '' PIPE
  LC_ALL=C
  while IFS= read -r l <&3; do case $l in d*) printf '%b\n' "${l#d}" || break;; p*) printf '%b' "${l#p}" || break;;
    *) break;; esac; done
  exec >/dev/null
  while IFS= read -r l <&3; do :; done
  @ROUND@
} >&4 4>&- 2>/dev/null &
exec 3<&- 4>&-
@END@""".replace("@ROUND@", _KILL_ROUND).replace("@END@", _END)


# The environment on stdin: a line with a count of lines, then that many lines of `NAME='value'; export
# NAME` text (a quoted value may span lines). The outermost shell reads exactly those lines (`read` takes
# one byte at a time from a pipe, so the watchdog's stdin is left as it was) and keeps the text in one
# variable; the innermost shell, the one that starts the program, evals it: exported by that shell itself,
# DYLD_* reach the program even though macOS SIP strips them from a /bin/sh's own environment
# (docs/facts/macos.md#sip-strips-dyld). A stdin that ends early stops the command (exit 125) before it runs.
ENV_TEXT = "CLUSTERCTL_ENV_TEXT"
_READ_ENV = f"""IFS= read -r n || exit 125
case $n in ''|*[!0-9]*) exit 125;; esac
e=
while [ "$n" -gt 0 ]; do IFS= read -r l || exit 125; e="$e$l
"; n=$((n - 1)); done
{ENV_TEXT}=$e; export {ENV_TEXT}; unset e l n
"""
_EVAL_ENV = f'eval "${ENV_TEXT}"; unset {ENV_TEXT}\n'


def export_text(env: Mapping[str, str] | None) -> str:
    """`env` as POSIX shell text that exports it, every value quoted."""
    lines = []
    for name, value in (env or {}).items():
        if not name.isidentifier() or not name.isascii():
            raise ValueError(f"not a valid environment variable name: {name!r}")
        lines.append(f"{name}={shlex.quote(value)}; export {name}")
    return "".join(line + "\n" for line in lines)


def env_input(env: Mapping[str, str] | None) -> bytes:
    """What a command started with `env` (remote_command, reading_env) must find first on its stdin."""
    lines = export_text(env).split("\n")[:-1]
    return f"{len(lines)}\n".encode() + "".join(line + "\n" for line in lines).encode()


def reading_env(script: str) -> str:
    """`script` for a /bin/sh run without the watchdog, with its environment read from stdin first."""
    return _READ_ENV + _EVAL_ENV + script


def remote_command(script: str, grace: float = KILL_GRACE_S, env: bool = False, stdin: bool = False) -> str:
    """What is sent to sshd: our script under /bin/sh behind the watchdog, whatever the login shell; with
    `env`, the script's environment is read from stdin first (send env_input() before anything else); with
    `stdin`, the script reads the data that follows, sent as stdin_frames() and ended by STDIN_END (without
    it, /dev/null)."""
    text = _EVAL_ENV + script if env else script
    wrapped = (_WATCHDOG_STDIN if stdin else _WATCHDOG).replace("@GRACE@", f"{grace:g}").replace(
        "@SCRIPT@", shlex.quote(text))
    return "exec /bin/sh -c " + shlex.quote(_READ_ENV + wrapped if env else wrapped)


# ---- the contract -------------------------------------------------------------------------------

class Process:
    """A command started by Transport.stream: its stdout and stderr lines go to the queue given, as
    (is_stderr, line) pairs, from the reader threads in `readers`."""

    readers: list[threading.Thread]

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        raise NotImplementedError

    def wait(self, timeout: float) -> int:
        """Block until it exits (TimeoutError after `timeout` seconds)."""
        raise NotImplementedError

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def stop(self) -> None:
        """End it and everything it started."""
        raise NotImplementedError

    def feed(self, data: bytes) -> None:
        """Write `data` (stdin_frames, then STDIN_END) to a command started with stdin=True; OSError once it is gone."""
        raise NotImplementedError


class Transport(Closeable):
    """Base of LocalTransport and SSHTransport (hosts/ssh.py)."""

    host: str
    is_local = False

    def run(self, command: str | Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
            cwd: str | None = None) -> Result:
        raise NotImplementedError

    def files(self) -> FileSession:
        raise NotImplementedError

    def stream(self, command: str | Sequence[str], lines: queue.Queue,
               env: Mapping[str, str] | None = None, stdin: StdinFeed | bool | None = None) -> Process:
        """Start `command`; with a StdinFeed, its bytes become the command's stdin (the feed's next attempt),
        else /dev/null; `stdin=True`: the caller feeds it, Process.feed() (one source for many commands)."""
        raise NotImplementedError

    def connect_tcp(self, address: str, port: int, timeout: float):
        """A byte stream (send, recv, close, fileno: a socket or an SSH channel) to address:port as the host
        sees it, e.g. its own loopback: for SSH a direct-tcpip channel on this connection, as `ssh -L` opens
        (hosts/forward.py)."""
        raise NotImplementedError

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


class LocalTransport(Transport):
    """This machine: /bin/sh in a new session, so a timeout can kill the whole process group."""

    is_local = True

    def __init__(self, host: str = "localhost"):
        self.host = host

    def run(self, command, timeout, env=None, cwd=None) -> Result:
        script = shell_command(command, cwd)
        proc = subprocess.Popen(["/bin/sh", "-c", reading_env(script)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
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
                                     start_new_session=True)
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
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def stop(self) -> None:
        stop_process_group(self.proc)
        self.proc.stdin.close()


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


def _read_lines(stream, is_err: bool, lines: queue.Queue) -> None:
    for raw in iter(stream.readline, b""):
        lines.put((is_err, raw.decode(errors="replace").rstrip("\r\n")))


# Local commands still running when clusterctl exits (Ctrl-C reaches only the main thread, while fan-out
# runs them in worker threads) are killed with their whole process group. Remote commands need no such
# list: when the process exits its SSH connections close, and each host's watchdog kills what was left.
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


def short(command) -> str:
    """A command as one line of at most 120 characters, for messages."""
    text = command if isinstance(command, str) else shlex.join(command)
    return text if len(text) <= 120 else text[:117] + "..."

