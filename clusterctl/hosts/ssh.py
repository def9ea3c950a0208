"""The SSH transport: a host reached with paramiko, exactly where `ssh NAME` would go (sshconfig.resolve).

Never prompts (docs/facts/ssh.md#batchmode-and-connecttimeout): no password is offered, an encrypted key without an
agent is an error, and an unknown host key is either recorded (accept-new) or refused (strict). A changed host
key is always refused. Every failure to connect becomes one ConnectError with a sentence for people and a
reason word for code.
"""
from __future__ import annotations

import fcntl
import logging
import os
import queue
import select
import shlex
import socket
import threading
import time
from typing import Mapping

from ..errors import CommandTimeout, ConnectError
from .files import SFTPFiles
from .sshconfig import SSHTarget
from .stdinfeed import StdinFeed
from .quoting import shell_command, short
from .remote import env_input, remote_command
from .transport import DEFAULT_CONNECT_TIMEOUT_S, Process, Result, Transport

# paramiko logs a failed negotiation from its transport thread as a traceback on stderr (logging's last-resort
# handler): the ConnectError this module raises already says it in one line (docs/facts/ssh.md#paramiko-key-exchange).
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class SSHTransport(Transport):
    """A host over SSH with paramiko, connecting as `ssh NAME` would (see sshconfig.resolve); one
    connection per transport, opened at the first use, its sessions (commands, SFTP) multiplexed on it."""

    def __init__(self, target: SSHTarget, host_key_checking: str = "accept-new",
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S):
        self.target = target
        self.host = target.alias
        self.host_key_checking = host_key_checking
        self.connect_timeout = connect_timeout
        self._client = None

    # -- connection --
    def open(self) -> None:
        self._connect()

    def host_key(self) -> tuple[str, str]:
        key = self._connect().get_transport().get_remote_server_key()
        return key.get_name(), key.get_base64()

    def _connect(self):
        if self._client is not None:
            return self._client
        import paramiko

        t = self.target
        client = paramiko.SSHClient()
        revoked: dict[tuple[str, str], str] = {}
        for path in t.known_hosts_files + t.global_known_hosts_files:     # the system's are read, never written
            if os.path.isfile(path):
                revoked.update(load_known_hosts(client.get_host_keys(), path, self.host))
        # the stricter wins: the inventory's strict, or the user's own StrictHostKeyChecking yes (ssh -G: true)
        if self.host_key_checking == "strict" or t.strict_host_key_checking in ("yes", "true"):
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
        key = transport.get_remote_server_key()
        if (key.get_name(), key.get_base64()) in revoked:
            client.close()
            raise ConnectError(self.host, f"the host key of {t.hostname}:{t.port} ({key.get_name()}) is marked "
                               f"@revoked in {revoked[key.get_name(), key.get_base64()]}: refused", "host-key-changed")
        transport.set_keepalive(15)
        self._client = client
        return client

    def _proxy_sock(self):
        t = self.target
        command = t.proxy_command
        if command is None and t.proxy_jump:
            # the jump host through the same rendering of the inventory as every other OpenSSH client
            config = ["-F", t.config_file] if t.config_file else ["-o", "BatchMode=yes"]
            command = shlex.join(["ssh", *config, "-W", f"{t.hostname}:{t.port}", "--", t.proxy_jump])
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
        channel = self._session()
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        try:
            channel.exec_command(remote_command(shell_command(command, cwd), env=True))
            channel.sendall(env_input(env))      # the environment goes on stdin, never on sshd's command line
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
                    raise CommandTimeout(self.host, short(command), timeout,
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

    def _session(self):
        return self._connect().get_transport().open_session(timeout=self.connect_timeout)

    def files(self) -> SFTPFiles:
        import paramiko

        client = self._connect()
        try:
            sftp = client.open_sftp()
        except paramiko.SSHException as e:
            raise ConnectError(self.host, f"cannot open an SFTP session: {e} (sshd needs `Subsystem sftp`)",
                               "other") from None
        return SFTPFiles(sftp, self.host, dropped=(paramiko.SSHException, EOFError))

    def connect_tcp(self, address, port, timeout):
        import paramiko

        if self._client is not None and not self._alive():
            self.close()          # the host came back (a restart): a new connection
        try:
            return self._connect().get_transport().open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0),
                                                                timeout=timeout)
        except paramiko.ChannelException as e:     # the host's sshd could not connect there (refused, forbidden)
            raise ConnectionRefusedError(f"{self.host}: {address}:{port}: {e.text or e}") from None
        except (paramiko.SSHException, EOFError) as e:
            raise ConnectionError(f"{self.host}: {e}") from None

    def stream(self, command, lines, env=None, stdin=None) -> Process:
        text = command if isinstance(command, str) else shlex.join(command)
        return RemoteProcess(self._session(), text, lines, env, stdin)


class RemoteProcess(Process):
    """A command running on a host over one SSH channel. Its output streams back over the channel;
    stop() closes the channel, and the host's watchdog (remote.remote_command) kills the command's
    whole process tree."""

    def __init__(self, channel, script: str, lines: queue.Queue, env: Mapping[str, str] | None = None,
                 stdin: StdinFeed | bool | None = None):
        self.chan = channel
        self.chan.exec_command(remote_command(script, env=True, stdin=stdin not in (None, False)))
        self.chan.sendall(env_input(env))    # the environment goes on stdin, never on sshd's command line
        if isinstance(stdin, StdinFeed):      # then the data, in frames: the channel stays open after its end
            stdin.attach(self.feed)
        self._code: int | None = None
        self.readers = [threading.Thread(target=self._pump, args=(is_err, lines), daemon=True) for is_err in (False, True)]
        for t in self.readers:
            t.start()

    def _pump(self, is_err: bool, lines: queue.Queue) -> None:
        recv = self.chan.recv_stderr if is_err else self.chan.recv
        rest = b""
        while True:
            data = recv(65536)
            if not data:
                break
            *complete, rest = (rest + data).split(b"\n")
            for line in complete:
                lines.put((is_err, line.decode(errors="replace").rstrip("\r")))
        if rest:
            lines.put((is_err, rest.decode(errors="replace").rstrip("\r")))

    def poll(self) -> int | None:
        if self._code is None and self.chan.exit_status_ready():
            self._code = self.chan.recv_exit_status()
        return self._code

    def wait(self, timeout: float) -> int:
        if not self.chan.status_event.wait(timeout):
            raise TimeoutError(f"still running after {timeout:g}s")
        return self.poll()

    def stop(self) -> None:
        self.chan.close()

    def feed(self, data: bytes) -> None:
        self.chan.sendall(data)


def load_known_hosts(keys, path: str, host: str) -> dict[tuple[str, str], str]:
    """Load a known_hosts file into paramiko's `keys`; the keys its `@revoked` lines name, (type, base64) ->
    path, which the connection refuses. `@cert-authority` lines are skipped (paramiko checks no host
    certificates: such a host is judged by its plain key line, as if the CA line were not there).
    ConnectError naming the file for anything paramiko cannot read."""
    import tempfile

    import paramiko

    revoked, plain = {}, []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split()
                if words and words[0] == "@revoked" and len(words) >= 4:
                    revoked[(words[2], words[3])] = path
                elif not (words and words[0].startswith("@")):
                    plain.append(line)
        fd, copy = tempfile.mkstemp(prefix="clusterctl-known-hosts-")     # paramiko reads only files
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.writelines(plain)
            keys.load(copy)
        finally:
            os.unlink(copy)
    except (OSError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError) as e:
        raise ConnectError(host, f"cannot read known_hosts file {path}: {e}", "known-hosts") from None
    return revoked


class AcceptNewPolicy:
    """OpenSSH's StrictHostKeyChecking=accept-new: trust a host's key the first time and record it in
    known_hosts (appending one line, under a lock); a key that differs from a recorded one is refused by
    paramiko before this policy is consulted. See docs/facts/ssh.md#accept-new-host-keys."""

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
CONNECT_REASONS = ("resolve", "kex", "host-key-changed", "encrypted-key", "auth", "refused", "timeout", "unknown-host-key",
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
    if isinstance(e, getattr(paramiko.ssh_exception, "IncompatiblePeer", ())):
        return "kex", (f"{t.hostname}:{t.port} and clusterctl's SSH library share no algorithm ({e}): allow one "
                       "of paramiko's in sshd's KexAlgorithms / Ciphers / MACs there")
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
