"""The routes of a model push from this machine to each host on its own (entries of transfer/routes.py's ROUTES):
rsync over ssh, else SFTP. Each supplies only the per-host sequence's send (storepush.store: hold -> prepare ->
send -> finish); the files go into the host's partial directory, an unfinished one continued where it stopped.

    RSYNC   rsync --partial-dir (an interrupted file continues by rsync's delta), --copy-links (a Hugging Face
            snapshot's links arrive as the files they point to); a host without rsync (RsyncMissing) gets the
            files over SFTP instead, its StoreEntry noting "no rsync on the host: sent over SFTP"
    SFTP    the host's file session (SFTP; plain copies for this machine), appending to each partial copy from
            its size; the only route that takes every host
"""
from __future__ import annotations

import os
import posixpath
from typing import Callable

from ..inventory import Host
from .push import Uploader, rsync_else_sftp, rsync_push, rsync_target, sftp_note
from .storepush import PARTS, Asked, HostPush, Job, OneByOne, Sent


class RsyncRoute(OneByOne):
    """rsync from this machine, when it has one, the method allows it and the host is not this machine."""

    name = "rsync"

    def refusal(self, asked: Asked, host: Host) -> str | None:
        if asked.rsync is None:
            return f"--method {asked.method}" if asked.method == "sftp" else "no rsync on this machine"
        return "the host is this machine: plain copies" if host.local else None

    def send(self, job: Job, hp: HostPush, files: list[str], resume: dict[str, int]) -> Sent:
        total, on_bytes = _counter(job, hp, files, resume)

        def with_rsync() -> int:
            summary = rsync_push(job.asked.rsync, job.model.root, files,
                                 rsync_target(job.connector, hp.host, hp.plan["path"]), on_bytes=on_bytes,
                                 bwlimit_kbps=job.bwlimit_kbps, extra=[f"--partial-dir={PARTS}", "--copy-links"])
            return summary.wire_bytes if summary.wire_bytes is not None else total

        count, method, note = rsync_else_sftp(job.asked.method, job.asked.rsync, with_rsync,
                                              lambda: _sftp(job, hp, files, on_bytes))
        _done(job, hp, total)
        return Sent(count, method, note)


class SftpRoute(OneByOne):
    """The host's file session: every host has one (SFTP; this machine's plain copies)."""

    name = "sftp"

    def refusal(self, asked: Asked, host: Host) -> str | None:
        return None

    def note(self, asked: Asked, host: Host) -> str:
        return sftp_note(asked.method)

    def send(self, job: Job, hp: HostPush, files: list[str], resume: dict[str, int]) -> Sent:
        total, on_bytes = _counter(job, hp, files, resume)
        count = _sftp(job, hp, files, on_bytes)
        _done(job, hp, total)
        return Sent(count, "sftp")


def _counter(job: Job, hp: HostPush, files: list[str], resume: dict[str, int]) -> tuple[int, Callable[[int], None] | None]:
    """The bytes this send is to move, and the progress callback for the bytes moved so far (None without progress)."""
    total = sum(job.model.file(f).size - resume.get(f, 0) for f in files)
    progress = job.progress
    return total, (lambda done: progress(hp.host.name, min(done, total), total)) if progress else None


def _done(job: Job, hp: HostPush, total: int) -> None:
    if job.progress:
        job.progress(hp.host.name, total, total)


def _sftp(job: Job, hp: HostPush, files: list[str], on_bytes: Callable[[int], None] | None) -> int:
    """Each file appended to its partial copy from that copy's size, then renamed into the partial directory."""
    dest = hp.plan["path"]
    up = Uploader(hp.transport, (lambda n: on_bytes(up.sent)) if on_bytes else None, job.bwlimit_kbps)
    with up:
        for rel in files:
            final = posixpath.join(dest, rel)
            part = posixpath.join(posixpath.dirname(final), PARTS, posixpath.basename(final))
            local = os.path.join(job.model.root, rel)
            up.files.makedirs(posixpath.dirname(part))
            up.resume(local, part)
            up.chmod(part, os.stat(local).st_mode & 0o777)
            up.files.rename(part, final)
    return up.sent
