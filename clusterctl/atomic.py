"""Files that are never seen half-written: write a temporary name in the same directory, then rename.

`replacing(path)` is the one place this machine does it (text files, copies, downloads, symlinks);
hosts.files does the same on a host over SFTP.
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


def write_text(path: str, text: str, mode: int | None = None) -> None:
    """Replace `path` with `text` atomically; `mode` sets the permissions (default: as open() would)."""
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
