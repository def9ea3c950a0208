"""Quoting: how values reach a POSIX shell on a host (pure functions).

    quote_path("~/a b")           # "$HOME"/'a b': a leading ~ stays the host's home directory
    shell_command(argv, cwd)      # the shell text that runs an argv (every word quoted) or a script of ours in cwd
    short(command)                # a command as one line of at most 120 characters, for messages

Values that come from users — host names, paths, env values — only ever reach a shell through `shlex.quote`
or `quote_path`; a command is either an argv list or a shell script of our own making.
"""
from __future__ import annotations

import shlex
from typing import Sequence


def quote_path(path: str) -> str:
    """Quote a path for a POSIX shell, keeping `~` / `~/...` as the (remote) home directory."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def shell_command(command: str | Sequence[str], cwd: str | None = None) -> str:
    """The POSIX shell text that runs `command` in `cwd` (its environment comes on stdin: hosts/remote.py)."""
    body = command if isinstance(command, str) else shlex.join(command)
    lines = []
    if cwd:
        lines.append(f"cd {quote_path(cwd)} || exit 125")
    lines.append(body)
    return "\n".join(lines)


def short(command: str | Sequence[str]) -> str:
    """A command as one line of at most 120 characters, for messages."""
    text = command if isinstance(command, str) else shlex.join(command)
    return text if len(text) <= 120 else text[:117] + "..."
