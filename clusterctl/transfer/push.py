"""Getting files onto one host, the one place the route is chosen: rsync over ssh when this machine and the
host both have rsync, else the transport's file session (SFTP, or plain copies for this machine). `sync`
and `data push` both come through here; each brings its own rsync arguments and its own SFTP plan.
`run --fetch` pulls the other way with rsync_pull over the same RsyncTarget.

    pushed, method, note = rsync_else_sftp(options.method, rsync, with_rsync, with_sftp)

Either way every file lands atomically (rsync renames a finished `.NAME.XXXXXX`; hosts/files.py renames
a finished NAME.clusterctl-tmp-XXXXXXXX).
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from ..errors import RsyncMissing, SyncError
from ..hosts.files import FileSession
from ..hosts.connector import Connector
from ..hosts.transport import Transport
from ..inventory import Host
from .rsync import RsyncSummary, rsync_argv, run_rsync, ssh_command, supports_progress2

METHODS = ("auto", "rsync", "sftp")
T = TypeVar("T")


def local_rsync(method: str) -> str | None:
    """This machine's rsync, if the method may use it; --method rsync without one is bad input."""
    if method not in METHODS:
        raise SyncError(f"unknown transfer method {method!r} ({', '.join(METHODS)})")
    rsync = shutil.which("rsync") if method != "sftp" else None
    if method == "rsync" and rsync is None:
        raise SyncError("--method rsync: rsync is not installed on this machine")
    return rsync


def rsync_else_sftp(method: str, rsync: str | None, with_rsync: Callable[[], T],
                    with_sftp: Callable[[], T]) -> tuple[T, str, str]:
    """(what the route returned, "rsync" or "sftp", a note saying why SFTP was used, or "")."""
    if rsync and method != "sftp":
        try:
            return with_rsync(), "rsync", ""
        except RsyncMissing:
            if method == "rsync":
                raise
            note = "no rsync on the host: sent over SFTP"
    else:
        note = sftp_note(method)
    return with_sftp(), "sftp", note


def sftp_note(method: str) -> str:
    """What a copy sent over SFTP without rsync being tried says of it: why, when the method left it to us."""
    return "no rsync on this machine: sent over SFTP" if method == "auto" else ""


@dataclass(frozen=True)
class RsyncTarget:
    """Where rsync writes for one host: a `host:` over ssh (with rsync's -e), or a local directory."""

    host: str
    target: str | None        # what goes before `:.`, None for this machine
    rsh: str | None
    dest: str                 # the destination directory (expanded for this machine)


def rsync_target(connector: Connector, host: Host, dest: str) -> RsyncTarget:
    """rsync reaches a host as every OpenSSH client clusterctl starts does: `ssh -F <rendering> NAME`."""
    if host.local:
        return RsyncTarget(host.name, None, None, os.path.expanduser(dest))
    rsh = ssh_command(connector.ssh_options(), shutil.which("ssh") or "ssh")
    return RsyncTarget(host.name, host.name, rsh, dest)


def rsync_push(rsync: str, src_root: str, items: Sequence[str], to: RsyncTarget, *, excludes: bool = False,
               checksum: bool = False, dry_run: bool = False, bwlimit_kbps: int | None = None,
               on_bytes: Callable[[int], None] | None = None, extra: Sequence[str] = (),
               then: str | None = None) -> RsyncSummary:
    """rsync `items` (paths relative to src_root, or with `excludes` exclusion rules for a recursive walk)
    into to.dest, with `extra` options; `then`, on a remote host: a command it runs in to.dest once rsync
    has ended well (rsync.remote_rsync_path). Raises RsyncMissing when the host has no rsync."""
    if to.target is None and not dry_run:
        os.makedirs(to.dest, exist_ok=True)

    def argv(list_file: str) -> list[str]:
        return rsync_argv(rsync, src_root, list_file, to.dest, target=to.target, rsh=to.rsh, checksum=checksum,
                          dry_run=dry_run, bwlimit_kbps=bwlimit_kbps, progress=supports_progress2(rsync),
                          excludes=excludes, extra=extra, then=then)

    return run_rsync(to.host, argv, items, on_bytes)


def rsync_pull(rsync: str, source: RsyncTarget, items: Sequence[str], local_root: str, *,
               excludes: bool = False, on_bytes: Callable[[int], None] | None = None) -> RsyncSummary:
    """The other way round: rsync `items` (or, with `excludes`, everything but the rules' matches) from
    the directory source.dest on the host into local_root here. Raises RsyncMissing when the host has no
    rsync. Files land as rsync always lands them: a temporary `.NAME.XXXXXX`, then a rename. `on_bytes(done)`:
    the bytes received so far (rsync_push's)."""
    os.makedirs(local_root, exist_ok=True)
    progress = on_bytes is not None and supports_progress2(rsync)

    def argv(list_file: str) -> list[str]:
        if source.target is None:
            return rsync_argv(rsync, source.dest, list_file, local_root, excludes=excludes, progress=progress)
        return rsync_argv(rsync, source.dest, list_file, local_root, target=source.target, rsh=source.rsh,
                          excludes=excludes, pull=True, progress=progress)

    return run_rsync(source.host, argv, items, on_bytes)


class Uploader:
    """Uploads over one file session of a transport, each atomic, with a byte callback and an optional
    bandwidth limit (the SFTP route)."""

    def __init__(self, transport: Transport, on_bytes: Callable[[int], None] | None = None,
                 bwlimit_kbps: int | None = None):
        self.transport = transport
        self.on_bytes = on_bytes or (lambda n: None)
        self.bwlimit = bwlimit_kbps * 1024 if bwlimit_kbps else None
        self.files: FileSession | None = None
        self._start = time.monotonic()
        self._sent = 0

    def __enter__(self):
        self.files = self.transport.files()
        return self

    def __exit__(self, *exc):
        self.files.close()

    @property
    def sent(self) -> int:
        """Bytes uploaded so far."""
        return self._sent

    def _count(self, n: int) -> None:
        self._sent += n
        self.on_bytes(n)
        if self.bwlimit:
            ahead = self._sent / self.bwlimit - (time.monotonic() - self._start)
            if ahead > 0:
                time.sleep(ahead)

    def put(self, local: str, remote: str, mode: int) -> None:
        """Copy `local` to `remote` (its parent exists) via a temporary name and a rename."""
        self.files.put(local, remote, mode, on_bytes=self._count)

    def resume(self, local: str, remote: str) -> int:
        """Continue the unfinished copy `remote` of `local` from its size (FileSession.resume: not atomic; the
        caller renames it into place once verified); returns the offset it continued from."""
        return self.files.resume(local, remote, on_bytes=self._count)

    def symlink(self, target: str, remote: str) -> None:
        self.files.symlink(target, remote)

    def chmod(self, remote: str, mode: int) -> None:
        self.files.chmod(remote, mode)
