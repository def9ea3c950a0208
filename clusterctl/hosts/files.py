"""Files on a host, the same way whether the host is this machine or a machine over SFTP:

    with transport.files() as files:
        files.makedirs("~/work/data")
        files.put("shard.bin", "~/work/data/shard.bin", mode=0o644, on_bytes=count)
        for rel, size in files.walk("~/work/runs/abc"): files.get(...)

Every write lands under a temporary name beside its destination and is renamed into place (a POSIX rename
is atomic), so no reader, here or on the host, ever sees a half-written file under its final name; a
failed or interrupted copy removes its temporary file. Paths on a host may start with `~/` (its home).
"""
from __future__ import annotations

import os
import stat
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator

from ..atomic import replacing
from ..errors import ConnectError
from .scripts.contract import TMP

TMP_MARK = TMP                    # temporary names on hosts: NAME.clusterctl-tmp-XXXXXXXX (the helpers' own)
CHUNK = 1 << 20

OnBytes = Callable[[int], None]   # called with the size of every chunk written


def sftp_path(path: str) -> str:
    """SFTP sessions start in the home directory, where `~/x` is `x`."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path


def host_temp_name(path: str) -> str:
    return f"{path}{TMP_MARK}{uuid.uuid4().hex[:8]}"


def _mode_of(local: str, mode: int | None) -> int:
    return mode if mode is not None else os.stat(local).st_mode & 0o7777


class Closeable:
    """close() when a `with` block ends (transports and file sessions)."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FileSession(Closeable):
    """The file operations a transport offers (base of LocalFiles and SFTPFiles)."""

    def put(self, local: str, remote: str, mode: int | None = None, on_bytes: OnBytes | None = None) -> None:
        """Copy `local` to `remote` (its directory exists) atomically; `mode` defaults to the local one."""
        raise NotImplementedError

    def get(self, remote: str, local: str, on_bytes: OnBytes | None = None) -> None:
        """Copy `remote` to `local` on this machine atomically."""
        raise NotImplementedError

    def symlink(self, target: str, remote: str) -> None:
        """Create or replace the symlink `remote` -> `target` atomically."""
        raise NotImplementedError

    def chmod(self, remote: str, mode: int) -> None:
        raise NotImplementedError

    def makedirs(self, remote: str) -> None:
        """`mkdir -p`."""
        raise NotImplementedError

    def walk(self, remote: str) -> Iterator[tuple[str, int]]:
        """(path relative to `remote`, size) of every regular file below `remote`, leaving out names that
        start with "." (files being written, temporary files); nothing when `remote` does not exist."""
        raise NotImplementedError

    def resume(self, local: str, remote: str, on_bytes: OnBytes | None = None) -> int:
        """Continue `remote`, an unfinished copy of `local` (or nothing), with `local`'s bytes from its size on,
        and return that size; one as large as `local` or larger is written again from the start. NOT atomic:
        `remote` is a partial file by design (the model store's), renamed into place by the caller once it
        is verified."""
        raise NotImplementedError

    def rename(self, remote: str, to: str) -> None:
        """Rename `remote` onto `to` (POSIX rename: atomic, replacing `to`)."""
        raise NotImplementedError


def _resume(src_path: str, size: int | None, open_dst: Callable[[str], object], on_bytes: OnBytes | None) -> int:
    """The copy behind resume(): `size` is the partial copy's (None: there is none)."""
    total = os.path.getsize(src_path)
    offset = size if size is not None and size < total else 0
    with open(src_path, "rb") as src, open_dst("r+b" if offset else "wb") as dst:
        src.seek(offset)
        dst.seek(offset)
        _copy(src, dst, on_bytes)
    return offset


def _copy(src, dst, on_bytes: OnBytes | None) -> None:
    while block := src.read(CHUNK):
        dst.write(block)
        if on_bytes:
            on_bytes(len(block))


class LocalFiles(FileSession):
    """This machine's file system (`~` is this user's home)."""

    def put(self, local, remote, mode=None, on_bytes=None):
        dest = os.path.expanduser(remote)
        with replacing(dest, host_temp_name(dest)) as tmp:     # the name host-side cleanups know
            with open(local, "rb") as src, open(tmp, "wb") as dst:
                _copy(src, dst, on_bytes)
                dst.flush()
                os.fsync(dst.fileno())
            os.chmod(tmp, _mode_of(local, mode))

    def get(self, remote, local, on_bytes=None):
        with replacing(local) as tmp:
            with open(os.path.expanduser(remote), "rb") as src, open(tmp, "wb") as dst:
                _copy(src, dst, on_bytes)
            os.chmod(tmp, os.stat(os.path.expanduser(remote)).st_mode & 0o777)     # never a setuid bit

    def symlink(self, target, remote):
        dest = os.path.expanduser(remote)
        with replacing(dest, host_temp_name(dest)) as tmp:
            os.symlink(target, tmp)

    def chmod(self, remote, mode):
        os.chmod(os.path.expanduser(remote), mode)

    def makedirs(self, remote):
        os.makedirs(os.path.expanduser(remote), exist_ok=True)

    def walk(self, remote):
        root = os.path.expanduser(remote)
        for directory, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                full = os.path.join(directory, name)
                if not name.startswith(".") and os.path.isfile(full) and not os.path.islink(full):
                    yield os.path.relpath(full, root), os.path.getsize(full)

    def resume(self, local, remote, on_bytes=None):
        dest = os.path.expanduser(remote)
        size = os.path.getsize(dest) if os.path.isfile(dest) else None
        return _resume(local, size, lambda mode: open(dest, mode), on_bytes)

    def rename(self, remote, to):
        os.replace(os.path.expanduser(remote), os.path.expanduser(to))


class SFTPFiles(FileSession):
    """A host's file system over one SFTP session (paramiko's SFTPClient). The SSH layer's own exception
    types (`dropped`: a channel that died mid-transfer) become a ConnectError naming the host."""

    def __init__(self, sftp, host: str, dropped: tuple[type[BaseException], ...] = ()):
        self.sftp, self.host, self.dropped = sftp, host, dropped

    @contextmanager
    def _guard(self):
        try:
            yield
        except self.dropped as e:
            raise ConnectError(self.host, f"the SFTP session broke off: {e}", "dropped") from None

    def _replace(self, remote: str, write: Callable[[str], None]) -> None:
        """write(tmp) under a temporary name, then rename it onto `remote`; remove it on any failure."""
        tmp = sftp_path(host_temp_name(remote))
        try:
            with self._guard():
                write(tmp)
                self.sftp.posix_rename(tmp, sftp_path(remote))
        except BaseException:
            try:
                self.sftp.remove(tmp)
            except (OSError, EOFError):
                pass
            raise

    def put(self, local, remote, mode=None, on_bytes=None):
        def write(tmp: str) -> None:
            with open(local, "rb") as src, self.sftp.open(tmp, "wb") as dst:
                dst.set_pipelined(True)
                _copy(src, dst, on_bytes)
            self.sftp.chmod(tmp, _mode_of(local, mode))
        self._replace(remote, write)

    def get(self, remote, local, on_bytes=None):
        got = 0

        def count(done: int, _total: int) -> None:      # paramiko tells the bytes so far; on_bytes takes each chunk's
            nonlocal got
            on_bytes(done - got)
            got = done

        with replacing(local) as tmp, self._guard():
            self.sftp.get(sftp_path(remote), tmp, callback=count if on_bytes else None)

    def symlink(self, target, remote):
        self._replace(remote, lambda tmp: self.sftp.symlink(target, tmp))

    def chmod(self, remote, mode):
        with self._guard():
            self.sftp.chmod(sftp_path(remote), mode)

    def makedirs(self, remote):
        with self._guard():
            self._makedirs(remote)

    def _makedirs(self, remote):
        path = sftp_path(remote).rstrip("/") or "/"
        try:
            if stat.S_ISDIR(self.sftp.stat(path).st_mode or 0):
                return
        except FileNotFoundError:
            pass
        parent = os.path.dirname(path)
        if parent and parent != path:
            self._makedirs(parent)
        try:
            self.sftp.mkdir(path)
        except OSError:
            if not stat.S_ISDIR(self.sftp.stat(path).st_mode or 0):   # made meanwhile by someone else: fine
                raise

    def walk(self, remote):
        stack = [(sftp_path(remote).rstrip("/"), "")]
        while stack:
            directory, rel = stack.pop()
            try:
                with self._guard():
                    entries = self.sftp.listdir_attr(directory)
            except FileNotFoundError:
                continue
            for entry in sorted(entries, key=lambda e: e.filename):
                if entry.filename.startswith("."):
                    continue
                mode = entry.st_mode or 0
                if stat.S_ISDIR(mode):
                    stack.append((f"{directory}/{entry.filename}", f"{rel}{entry.filename}/"))
                elif stat.S_ISREG(mode):
                    yield f"{rel}{entry.filename}", entry.st_size or 0

    def resume(self, local, remote, on_bytes=None):
        dest = sftp_path(remote)

        def open_dst(mode: str):
            f = self.sftp.open(dest, mode)
            f.set_pipelined(True)
            return f
        with self._guard():
            try:
                size = self.sftp.stat(dest).st_size
            except FileNotFoundError:
                size = None
            return _resume(local, size, open_dst, on_bytes)

    def rename(self, remote, to):
        with self._guard():
            self.sftp.posix_rename(sftp_path(remote), sftp_path(to))

    def close(self):
        self.sftp.close()
