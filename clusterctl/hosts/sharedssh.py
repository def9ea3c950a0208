"""One command on a host through OpenSSH, over the connection `run`'s copies and launcher already share.

    if master_alive(ssh, ["-F", config], host_name):
        result = run_shared(ssh, ["-F", config], host_name, command, timeout, env=None, cwd=None)

Every OpenSSH client clusterctl starts reads the inventory's rendering (hosts/openssh.py), which keeps one
master connection per host alive for CONTROL_PERSIST_S seconds (docs/facts/ssh.md#connection-sharing). A
command sent through it opens a session on that connection: no new TCP connection, no key exchange, no login,
and no cryptography in this process. `run` uses it for the pre-flight that verifies a cached plan beside the
starting job (launch/plan.py), where a paramiko login per host would take CPU from the launch it runs beside.

The command is sent as every remote command is (hosts/remote.py): under /bin/sh behind the watchdog, its
environment on stdin, never on a command line. The watchdog ends the command when our stdin closes, so stdin
stays open until the command has ended (or its timeout kills ssh). Exit status 255 is ssh's own failure
(it could not connect, or log in); the caller then asks its transport, whose error names the cause. Only a
live master is used (`ssh -O check`, a local question): without one, a host that does not answer fails as it
always has, once, through the transport, rather than after one wait here and another there.
"""
from __future__ import annotations

import subprocess
import threading
from typing import Mapping, Sequence

from ..errors import CommandTimeout
from .quoting import shell_command, short
from .remote import env_input, remote_command
from .transport import Result

SSH_FAILED = 255         # what ssh exits with when it could not run the command at all


def master_alive(ssh: str, options: Sequence[str], host: str) -> bool:
    """Whether a master connection to `host` is up (asked of its socket here: nothing reaches the host)."""
    try:
        return subprocess.run([ssh, *options, "-O", "check", "--", host], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_shared(ssh: str, options: Sequence[str], host: str, command: str | Sequence[str], timeout: float,
               env: Mapping[str, str] | None = None, cwd: str | None = None) -> Result:
    """`command` on `host` (an inventory name the rendering `options` knows) to its end; CommandTimeout after
    `timeout` seconds, with ssh killed and so the command too (the watchdog sees its stdin end)."""
    argv = [ssh, *options, "-T", "--", host, remote_command(shell_command(command, cwd), env=True)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [threading.Thread(target=lambda s=s, into=into: into.append(s.read()), daemon=True)
               for s, into in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    try:
        try:
            proc.stdin.write(env_input(env))
            proc.stdin.flush()
        except OSError:        # ssh ended before reading it: its exit status says why
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            for t in readers:
                t.join(5)
            raise CommandTimeout(host, short(command), timeout, b"".join(out).decode(errors="replace"),
                                 b"".join(err).decode(errors="replace")) from None
        for t in readers:
            t.join()
    except BaseException:
        if proc.poll() is None:     # Ctrl-C: ssh ends, and with its channel the command
            proc.kill()
            proc.wait()
        raise
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
    return Result(proc.returncode, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"))
