"""Files that are never seen half-written: write a temporary name in the same directory, then rename.

`replacing(path)` is the one place this machine does it (text files, copies, downloads, symlinks);
hosts.files does the same on a host over SFTP.

A rename is atomic against a crash of the process, not against a power loss: the file system may put the new
name on disk before the data. What must survive one is written `durable` (its data, then its directory, flushed
with fsync): a checkpoint (every file, then `checkpoints/latest`) and a prepared dataset (its shards, then
manifest.json). Logs, metrics, summaries and caches are not: after a power loss their last lines may be gone,
never half of one file mixed with another.
"""
from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from typing import Iterator


def temp_name(path: str) -> str:
    """A hidden, unique name beside `path`: same directory, hence same file system, so a rename is atomic."""
    return os.path.join(os.path.dirname(os.path.abspath(path)),
                        f".{os.path.basename(path)}.tmp-{os.getpid()}-{secrets.token_hex(3)}")


@contextmanager
def replacing(path: str, tmp: str | None = None) -> Iterator[str]:
    """Yield a temporary path to write (`tmp`, by default temp_name(path)); when the block succeeds it is
    renamed onto `path`, when it fails (or is interrupted) it is removed, so `path` holds either the old
    content or the whole new one."""
    tmp = tmp or temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_text(path: str, text: str, mode: int | None = None, durable: bool = False) -> None:
    """Replace `path` with `text` atomically; `mode`: the permissions it is created with (no moment with wider
    ones; default: as open() would); `durable`: flushed to disk, and its directory after the rename."""
    with replacing(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)      # exactly `mode`, whatever the umask took away
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def fsync_dir(path: str) -> None:
    """Flush a directory's entries (a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """Flush every regular file under `path`, then each directory, to disk (files other processes wrote too)."""
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                fd = os.open(full, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(root)
