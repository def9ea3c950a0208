"""Files that are never seen half-written: write a temporary name in the same directory, then rename."""
from __future__ import annotations

import os
import secrets


def write_text(path: str, text: str, mode: int | None = None) -> None:
    """Replace `path` with `text` atomically; `mode` sets the permissions (default: as open() would)."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
