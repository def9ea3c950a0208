"""What is sent to a host's shell around a command: the watchdog, and the environment on stdin.

    remote_command(script, grace, env=True, stdin=False)   # the text for sshd (or a local /bin/sh -c)
    env_input(env)                                         # what that command must find first on its stdin
    reading_env(script)                                    # a /bin/sh script without the watchdog, env from stdin
    export_text(env)                                       # env as shell text that exports it, every value quoted

Remote commands run under /bin/sh whatever the user's login shell is (zsh on macOS), behind the watchdog
(hosts/scripts/watchdog.sh, sent as text in the one `exec /bin/sh -c` line sshd hands the login shell, with
its values as positional parameters): when the SSH channel closes — our timeout, Ctrl-C, a dropped
connection — it sees its stdin end and kills the command's whole process tree, so nothing is left running
on the host (docs/inventory.md#remote-commands).

The `env` of a command never appears on a command line (any local user sees a process's argv in `ps`, and
inventories hold tokens): it is written to the command's stdin before anything else, and the shell that
starts the command reads it from there (docs/security.md#where-secrets-go). A command started with `stdin`
reads the data that follows, in frames the watchdog decodes (hosts/scripts/frames.py,
docs/run.md#standard-input).
"""
from __future__ import annotations

import shlex
from typing import Mapping

from .scripts import script_text
from .scripts.frames import PULSE  # noqa: F401 (remote_command's pulse: what its senders write)

KILL_GRACE_S = 2.0      # the watchdog's wait between its TERM and KILL rounds (and a local process group's)


def _without_comments(text: str) -> str:
    """A shell script less its comment lines: what every command would otherwise carry on its command line."""
    return "".join(line for line in text.splitlines(keepends=True) if line.strip() and not line.lstrip().startswith("#"))


WATCHDOG = _without_comments(script_text("watchdog.sh"))

# The environment on stdin: a line with a count of lines, then that many lines of `NAME='value'; export
# NAME` text (a quoted value may span lines). The outermost shell reads exactly those lines (`read` takes
# one byte at a time from a pipe, so the watchdog's stdin is left as it was) and keeps the text in one
# variable; the innermost shell, the one that starts the program, evals it: exported by that shell itself,
# DYLD_* reach the program even though macOS SIP strips them from a /bin/sh's own environment
# (docs/facts/macos.md#sip-strips-dyld). A stdin that ends early stops the command (exit 125) before it runs.
ENV_TEXT = "CLUSTERCTL_ENV_TEXT"
_READ_ENV = f"""IFS= read -r n || exit 125
case $n in ''|*[!0-9]*) exit 125;; esac
e=
while [ "$n" -gt 0 ]; do IFS= read -r l || exit 125; e="$e$l
"; n=$((n - 1)); done
{ENV_TEXT}=$e; export {ENV_TEXT}; unset e l n
"""
_EVAL_ENV = f'eval "${ENV_TEXT}"; unset {ENV_TEXT}\n'


def export_text(env: Mapping[str, str] | None) -> str:
    """`env` as POSIX shell text that exports it, every value quoted."""
    lines = []
    for name, value in (env or {}).items():
        if not name.isidentifier() or not name.isascii():
            raise ValueError(f"not a valid environment variable name: {name!r}")
        lines.append(f"{name}={shlex.quote(value)}; export {name}")
    return "".join(line + "\n" for line in lines)


def env_input(env: Mapping[str, str] | None) -> bytes:
    """What a command started with `env` (remote_command, reading_env) must find first on its stdin."""
    lines = export_text(env).split("\n")[:-1]
    return f"{len(lines)}\n".encode() + "".join(line + "\n" for line in lines).encode()


def reading_env(script: str) -> str:
    """`script` for a /bin/sh run without the watchdog, with its environment read from stdin first."""
    return _READ_ENV + _EVAL_ENV + script


def remote_command(script: str, grace: float = KILL_GRACE_S, env: bool = False, stdin: bool = False,
                   alive: int = 0) -> str:
    """What is sent to sshd: our script under /bin/sh behind the watchdog, whatever the login shell; with
    `env`, the script's environment is read from stdin first (send env_input() before anything else); with
    `stdin`, the script reads the data that follows, sent as stdin_frames() and ended by STDIN_END (without
    it, /dev/null). With `alive` (seconds), once a PULSE came (after STDIN_END, or on a channel without stdin),
    `alive` seconds without one is taken as the channel closed: the sender vanished without closing it."""
    text = _EVAL_ENV + script if env else script
    shell = _READ_ENV + WATCHDOG if env else WATCHDOG
    args = [f"{grace:g}", "frames" if stdin else "null", text, *([str(int(alive))] if alive else [])]
    return f"exec /bin/sh -c {shlex.quote(shell)} sh " + shlex.join(args)
