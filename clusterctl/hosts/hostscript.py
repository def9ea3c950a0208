"""How the controller runs a program of hosts/scripts/ on a host: the one way (CONTRIBUTING.md#adding-a-host-script).

    command(python, script, *args)                      # the shell text: PYTHON -c PROGRAM ARG..., every word quoted
    run(transport, python, script, *args, timeout=, env=None) -> Result
    answer(result) -> object                            # its answer: the last line of stdout, one JSON document
    start(transport, python, script, *args, lines=, env=None, stdin=None) -> Process   # a script that keeps running
    message(line) -> object                             # one JSON line of a script that streams them
    shell(script, values, args=None, functions="")      # a shell script of hosts/scripts/ after its quoted values

The script goes as text (scripts.program: its sibling pieces, contract.py among them, inlined), so a host needs
nothing of clusterctl installed; its arguments are words after it, each quoted with shlex (the python with
quote_path, so that `~/venv/bin/python` is the host's home as the inventory documents), so no value, whatever it
holds, is read by the host's shell as anything but one word; a structured request is one JSON word (contract
read_request; a large one is uploaded first, transfer/remotefiles.argument); a secret goes in `env`, which travels
on stdin (hosts/remote.py), never on a command line. The answer is contract.reply's: one JSON document on the
last line of stdout.

The shell scripts run where there may be no python yet (probe.sh finds it, setup's pyenv.sh installs it, mesh.sh
and network.sh need none): shell() gives a script's text for the host's /bin/sh with its values first, one
NAME=VALUE line each, every value quoted (a HostPath keeps a leading ~ as the host's home), so a script reads them
as variables. Two more ways stay apart, each for its reason: watchdog.sh is the shell around every command
(hosts/remote.py: its values as positional parameters of the one `exec /bin/sh -c` line sshd hands the login
shell), and what a launcher starts on every rank (bootstrap.py on mpirun's or mlx.launch's command line, doctor's
smoke program; ranks.py, uploaded with its spec, which holds the ranks' environments, 0600) goes on the launcher's
command line (launch/), not through a transport.
"""
from __future__ import annotations

import json
import queue
import shlex
from typing import Any, Mapping, NamedTuple, Sequence

from .quoting import quote_path
from .scripts import program, script_text
from .stdinfeed import StdinFeed
from .transport import Process, Result, Transport


class HostPath(NamedTuple):
    """A value of shell()'s that is a path on the host: a leading ~ stays its home (quote_path)."""
    path: str


class NoAnswer(ValueError):
    """A script that ended without its JSON answer; the message says how it ended and its last line of stderr."""


def command(python: str, script: str, *args: str) -> str:
    """The shell text that runs `script` (a name in hosts/scripts/) with `args` under the host's `python`."""
    return " ".join([quote_path(python), "-c", shlex.quote(program(script)), *(shlex.quote(str(a)) for a in args)])


def run(transport: Transport, python: str, script: str, *args: str, timeout: float,
        env: Mapping[str, str] | None = None) -> Result:
    """Run `script` on the transport's host to its end (CommandTimeout after `timeout` seconds)."""
    return transport.run(command(python, script, *args), timeout, env=env)


def answer(result: Result) -> Any:
    """The script's answer: its last line of stdout as JSON; NoAnswer (how it ended, its last line of stderr)
    when there is none."""
    try:
        return json.loads((result.stdout.strip().splitlines() or ["?"])[-1])
    except ValueError:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise NoAnswer(f"could not read its answer (status {result.exit_code}): {last}") from None


def start(transport: Transport, python: str, script: str, *args: str, lines: queue.Queue,
          env: Mapping[str, str] | None = None, stdin: StdinFeed | bool | None = None) -> Process:
    """Start `script` on the transport's host; its output lines go to `lines` (Transport.stream)."""
    return transport.stream(command(python, script, *args), lines, env=env, stdin=stdin)


def message(line: str) -> Any:
    """One line of a script that streams JSON documents (contract.reply, one a line): ValueError if it is not one."""
    return json.loads(line)


def shell(script: str, values: Mapping[str, str | HostPath], args: Sequence[str] | None = None,
          functions: str = "") -> str:
    """The text of `script` (a .sh of hosts/scripts/) for a host's /bin/sh: `values` first, one NAME=VALUE line
    each, every value quoted; `args`, when given, its positional parameters (set --, none for []); `functions`, shell
    functions of ours."""
    bad = [name for name in values if not (name.isidentifier() and name.isascii())]
    if bad:
        raise ValueError(f"not a shell variable name: {bad[0]!r}")
    lines = [f"{name}={quote_path(v.path) if isinstance(v, HostPath) else shlex.quote(v)}" for name, v in values.items()]
    if functions:
        lines.append(functions)
    if args is not None:
        lines.append("set --" + "".join(" " + shlex.quote(a) for a in args))
    return "\n".join(lines) + "\n" + script_text(script)
