"""Files that are never seen half-written: write a temporary name in the same directory, then rename.

`replacing(path)` is the one place this machine does it (text files, copies, downloads, symlinks);
hosts.files does the same on a host over SFTP. `scratch_file(prefix)` makes a private temporary file that names
its process, so one a process left when it was killed (SIGKILL runs no cleanup) is removed by the next.

A rename is atomic against a crash of the process, not against a power loss: the file system may put the new
name on disk before the data. What must survive one is written `durable` (its data, then its directory, flushed
with fsync): a checkpoint (every file, then `checkpoints/latest`) and a prepared dataset (its shards, then
manifest.json). Logs, metrics, summaries and caches are not: after a power loss their last lines may be gone,
never half of one file mixed with another.
"""
from __future__ import annotations

import os
import re
import secrets
import tempfile
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


def replace_dir(staging: str, final: str) -> None:
    """Put the directory `staging` (written whole beside `final`) in `final`'s place: an earlier `final` is
    renamed aside first and removed after, so `final` is always one whole directory or the other."""
    if os.path.isdir(final) and not os.path.islink(final):
        old = f"{os.path.join(os.path.dirname(final), '.' + os.path.basename(final))}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(staging, final)
        import shutil
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)


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


def scratch_file(prefix: str, suffix: str = "") -> tuple[int, str]:
    """(fd, path) of a new private (0600) file in the temporary directory, named PREFIX<pid>-XXXXXXXX, as
    tempfile.mkstemp makes it. First the files of that prefix left by processes of this user that are gone are
    removed: only those, by the pid in their name (a process that is alive, or not ours, keeps its file)."""
    folder = tempfile.gettempdir()
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[A-Za-z0-9_]+" + re.escape(suffix) + r"\Z")
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    for name in names:
        m = pattern.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            if os.lstat(path).st_uid == os.getuid():
                os.unlink(path)
        except OSError:
            pass               # gone already (another process cleaned it), or not ours to remove
    return tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}-", suffix=suffix)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True            # another user's process (or no such pid number): not ours to judge
    return True
