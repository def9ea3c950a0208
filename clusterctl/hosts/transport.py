"""One contract for running commands and copying files on a host, locally or over SSH (paramiko).

    run(command, timeout, env=None, cwd=None) -> Result(exit_code, stdout, stderr)
    put(local_path, remote_path)   # atomic: a temporary name, then rename

`command` is either an argv list (every word quoted) or a string that is a shell script of our own making.
Values that come from users — host names, paths, env values — only ever reach a shell through `shlex.quote`
(or `quote_path`, which keeps a leading `~` meaning the remote home directory).

Remote commands run under /bin/sh whatever the user's login shell is (zsh on macOS), behind a small watchdog:
when the SSH channel closes — our timeout, Ctrl-C, a dropped connection — the watchdog sees its stdin end and
kills the command's whole process tree, so nothing is left running on the host.
"""
from __future__ import annotations

import atexit
import fcntl
import os
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import CommandTimeout, ConnectError
from ..inventory import Host
from .sshconfig import SSHTarget

KILL_GRACE_S = 2.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0


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


def shell_command(command: str | Sequence[str], env: Mapping[str, str] | None = None,
                  cwd: str | None = None) -> str:
    """The POSIX shell text that runs `command` with `env` exported, in `cwd`."""
    body = command if isinstance(command, str) else shlex.join(command)
    lines = []
    for name, value in (env or {}).items():
        if not name.isidentifier() or not name.isascii():
            raise ValueError(f"not a valid environment variable name: {name!r}")
        lines.append(f"export {name}={shlex.quote(value)}")
    if cwd:
        lines.append(f"cd {quote_path(cwd)} || exit 125")
    lines.append(body)
    return "\n".join(lines)


# The watchdog: the command runs in the background with stdin from /dev/null; the watchdog reads the
# channel's stdin (kept on fd 3: a background job's stdin would otherwise be /dev/null), which only ends
# when the channel closes, then kills the command's process tree (found with POSIX ps + awk: macOS and
# Linux alike; dash has no job control, so no process groups, without a tty).
_WATCHDOG = r"""exec 3<&0
/bin/sh -c {script} </dev/null 3<&- &
c=$!
{{ cat <&3 >/dev/null
  t=$(ps -A -o pid= -o ppid= | awk -v r="$c" '{{p[$1]=$2}} END{{d[r]=1; n=1; while (n) {{n=0; for (x in p) if (!(x in d) && (p[x] in d)) {{d[x]=1; n=1}}}} for (x in d) print x}}')
  [ -n "$t" ] && kill -TERM $t && sleep {grace} && kill -KILL $t
}} >/dev/null 2>&1 &
exec 3<&-
wait $c"""


def remote_command(script: str, grace: float = KILL_GRACE_S) -> str:
    """What is sent to sshd: our script under /bin/sh behind the watchdog, whatever the login shell."""
    wrapped = _WATCHDOG.format(script=shlex.quote(script), grace=f"{grace:g}")
    return "exec /bin/sh -c " + shlex.quote(wrapped)


# ---- the contract -------------------------------------------------------------------------------

class Transport:
    """Base of LocalTransport and SSHTransport. Code above this never knows which one it holds."""

    host: str

    def run(self, command: str | Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
            cwd: str | None = None) -> Result:
        raise NotImplementedError

    def put(self, local_path: str, remote_path: str, mode: int | None = None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalTransport(Transport):
    """This machine: /bin/sh in a new session, so a timeout can kill the whole process group."""

    def __init__(self, host: str = "localhost"):
        self.host = host

    def run(self, command, timeout, env=None, cwd=None) -> Result:
        script = shell_command(command, env, cwd)
        proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _kill_group(proc)
            raise CommandTimeout(self.host, _short(command), timeout,
                                 out.decode(errors="replace"), err.decode(errors="replace")) from None
        except BaseException:   # Ctrl-C: never leave the group behind
            _kill_group(proc)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
        return Result(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def put(self, local_path, remote_path, mode=None) -> None:
        dest = os.path.expanduser(remote_path)
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
        tmp = f"{dest}.clusterctl-tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(local_path, "rb") as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            os.chmod(tmp, mode if mode is not None else os.stat(local_path).st_mode & 0o7777)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


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


def _short(command) -> str:
    text = command if isinstance(command, str) else shlex.join(command)
    return text if len(text) <= 120 else text[:117] + "..."


class SSHTransport(Transport):
    """A host over SSH with paramiko, connecting as `ssh NAME` would (see sshconfig.resolve).

    Never prompts: no password is offered, an encrypted key without an agent is an error, and an unknown
    host key is either recorded (accept-new) or refused (strict). A changed host key is always refused.
    """

    def __init__(self, target: SSHTarget, host_key_checking: str = "accept-new",
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S):
        self.target = target
        self.host = target.alias
        self.host_key_checking = host_key_checking
        self.connect_timeout = connect_timeout
        self._client = None

    # -- connection --
    def connect(self):
        if self._client is not None:
            return self._client
        import paramiko

        t = self.target
        client = paramiko.SSHClient()
        for path in t.known_hosts_files:
            if os.path.isfile(path):
                try:
                    client.get_host_keys().load(path)
                except (OSError, paramiko.SSHException) as e:
                    raise ConnectError(self.host, f"cannot read known_hosts file {path}: {e}", "known-hosts") from None
        if self.host_key_checking == "strict":
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            record_in = t.known_hosts_files[0] if t.known_hosts_files else os.path.expanduser(
                "~/.ssh/known_hosts")
            client.set_missing_host_key_policy(AcceptNewPolicy(record_in))
        keys = [p for p in t.identity_files if os.path.isfile(p)]
        sock = self._proxy_sock()
        try:
            client.connect(t.hostname, port=t.port, username=t.user, key_filename=keys or None,
                           look_for_keys=False, allow_agent=True, timeout=self.connect_timeout,
                           banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                           channel_timeout=self.connect_timeout, sock=sock)
        except Exception as e:  # paramiko raises a zoo of types; each becomes one clear sentence
            client.close()
            reason, detail = describe_connect_error(e, t, keys)
            raise ConnectError(self.host, detail, reason) from None
        transport = client.get_transport()
        transport.set_keepalive(15)
        self._client = client
        return client

    def _proxy_sock(self):
        t = self.target
        command = t.proxy_command
        if command is None and t.proxy_jump:
            config = ["-F", t.config_file] if t.config_file else []
            command = shlex.join(["ssh", *config, "-o", "BatchMode=yes", "-W", f"{t.hostname}:{t.port}",
                                  "--", t.proxy_jump])
        if command is None:
            return None
        import paramiko
        return paramiko.ProxyCommand(command)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- the contract --
    def run(self, command, timeout, env=None, cwd=None) -> Result:
        client = self.connect()
        channel = client.get_transport().open_session(timeout=self.connect_timeout)
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        try:
            channel.exec_command(remote_command(shell_command(command, env, cwd)))
            while True:
                while channel.recv_ready():
                    out += channel.recv(65536)
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                if channel.exit_status_ready() and channel.eof_received:
                    while channel.recv_ready():
                        out += channel.recv(65536)
                    while channel.recv_stderr_ready():
                        err += channel.recv_stderr(65536)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandTimeout(self.host, _short(command), timeout,
                                         out.decode(errors="replace"), err.decode(errors="replace"))
                if not self._alive():
                    raise ConnectError(self.host, "the SSH connection dropped while the command ran", "dropped")
                select.select([channel], [], [], min(remaining, 0.5))
            return Result(channel.recv_exit_status(), out.decode(errors="replace"),
                          err.decode(errors="replace"))
        finally:
            channel.close()   # ends the watchdog's stdin: anything still running is killed

    def _alive(self) -> bool:
        transport = self._client.get_transport() if self._client else None
        return bool(transport and transport.is_active())

    def put(self, local_path, remote_path, mode=None) -> None:
        """Copy over SFTP to a temporary name beside the destination, then rename it into place, so a
        reader never sees a half-written file under the final name."""
        client = self.connect()
        sftp_path = remote_path[2:] if remote_path.startswith("~/") else remote_path  # SFTP starts in ~
        parent = os.path.dirname(sftp_path)
        if parent:
            self.run(["mkdir", "-p", "--", parent], timeout=30, cwd="~")
        tmp = f"{sftp_path}.clusterctl-tmp-{uuid.uuid4().hex[:8]}"
        sftp = client.open_sftp()
        try:
            sftp.put(local_path, tmp, confirm=True)
            sftp.chmod(tmp, mode if mode is not None else os.stat(local_path).st_mode & 0o7777)
            sftp.posix_rename(tmp, sftp_path)
        except BaseException:
            try:
                sftp.remove(tmp)
            except OSError:
                pass
            raise
        finally:
            sftp.close()


class AcceptNewPolicy:
    """OpenSSH's StrictHostKeyChecking=accept-new: trust a host's key the first time and record it in
    known_hosts (appending one line, under a lock); a key that differs from a recorded one is refused by
    paramiko before this policy is consulted."""

    def __init__(self, known_hosts_path: str):
        self.path = known_hosts_path

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


# Why a connection failed, as a word code can act on (doctor picks its fix by it); the sentence is for people.
CONNECT_REASONS = ("resolve", "host-key-changed", "encrypted-key", "auth", "refused", "timeout", "unknown-host-key",
                   "no-banner", "known-hosts", "dropped", "other")


def describe_connect_error(e: BaseException, t: SSHTarget, keys: list[str]) -> tuple[str, str]:
    """(reason, one sentence): why SSH failed, with the underlying message and what to do about it."""
    import paramiko

    where = f"{t.user}@{t.hostname}:{t.port}"
    if isinstance(e, socket.gaierror):
        return "resolve", (f"cannot resolve host name '{t.hostname}' ({e.strerror}); check DNS, /etc/hosts or "
                           "HostName in your ssh config")
    if isinstance(e, paramiko.BadHostKeyException):
        return "host-key-changed", (
            f"HOST KEY CHANGED for {where}: got {e.key.get_name()} {e.key.get_base64()[:16]}..., known_hosts has "
            f"another. If the machine was reinstalled, remove the old key with `ssh-keygen -R {_known_hosts_name(t)}`; "
            "otherwise someone may be intercepting the connection")
    if isinstance(e, paramiko.PasswordRequiredException):
        return "encrypted-key", f"a private key is encrypted and no ssh-agent holds it; run `ssh-add {keys[0] if keys else ''}`"
    if isinstance(e, paramiko.AuthenticationException):
        tried = ", ".join(keys) if keys else "no key files (and the ssh-agent)"
        return "auth", (f"{where} refused our keys (tried {tried}); it would ask for a password, and clusterctl "
                        f"never does. Fix: ssh-copy-id -i KEY {t.user}@{t.hostname}" + (f" -p {t.port}" if t.port != 22 else ""))
    if isinstance(e, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError)):
        return "refused", f"connection refused at {t.hostname}:{t.port} (is sshd running? Remote Login on a Mac)"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timeout", (f"no answer from {t.hostname}:{t.port} within the connect timeout (host down, asleep or "
                           "firewalled?)")
    if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
        return "unknown-host-key", (f"host key of {t.hostname}:{t.port} is unknown and host_key_checking is strict; "
                                    f"connect once with `ssh {t.alias}` to review and record it")
    if isinstance(e, paramiko.SSHException) and ("no existing session" in str(e).lower()
                                                  or "banner" in str(e).lower()):
        # paramiko says either, depending on where the silence hit
        return "no-banner", (f"{t.hostname}:{t.port} accepted the connection but SSH never got going (no banner or "
                             "key exchange within the connect timeout): sshd hung, overloaded, or the machine asleep?")
    if isinstance(e, OSError) and e.strerror:
        return "other", f"cannot connect to {t.hostname}:{t.port}: {e.strerror}"
    return "other", f"cannot connect to {where}: {type(e).__name__}: {e}"


def _known_hosts_name(t: SSHTarget) -> str:
    return t.hostname if t.port == 22 else shlex.quote(f"[{t.hostname}]:{t.port}")


def for_host(host: Host, target: SSHTarget | None = None, host_key_checking: str = "accept-new",
             connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> Transport:
    """The transport for an inventory host: local for `local: true`, SSH otherwise."""
    if host.local:
        return LocalTransport(host.name)
    if target is None:
        raise ValueError(f"{host.name}: an SSH host needs its resolved SSHTarget")
    return SSHTransport(target, host_key_checking, connect_timeout)
