"""The programs clusterctl runs on hosts, kept as real files (so they can be read, linted and run in tests)
and sent as text: `sh -c TEXT` / `python -c TEXT`, so a host needs nothing of clusterctl installed. The controller
runs them through hosts/hostscript.py (CONTRIBUTING.md#adding-a-host-script).

    contract.py     every name, mark and word the controller and the scripts both write (the relay's token
                    variable, the marks of follow.py's lines, a model store's partial directory, ...), how a
                    request is read (read_request) and an answer written (reply): inlined into the scripts
                    that import it, imported by the controller

    watchdog.sh     what every command on a host runs behind: it kills the command's tree when the channel
                    closes (POSIX sh; its values as arguments; sent by hosts/remote.py, less its comments)
    probe.sh        doctor's and the pre-flight's one-round-trip probe (POSIX sh; its values come first)
    python_info.py  python, mlx and mpi4py versions, for the probe
    dataplane.py    the TCP data-plane check (listen on this host's ring port, connect to every peer's)
    filehelper.py   hashing, listing, deleting and verifying files for sync, data push and run
    modelstore.py   the model store on a host: check, stage, verify, complete, list and remove entries
    holds.py        modelstore.py's piece: a push's lock on its own directory; the processes that use an entry (ps)
    relay.py        one hop of a relayed model push: take the bytes from upstream, keep what this host lacks,
                    send on what the next lacks (transfer/relay.py)
    helperbase.py   what those share (a file's sha256), inlined into each by program()
    ranks.py        the rank starter for the ring and jaccl backends (shipped as a file, program("ranks.py"),
                    run by path), with its pieces frames.py (standard input in frames, also hosts/stdinfeed.py's)
                    and writeall.py (every byte of a write to a pipe, signals or not; also tagged.py's and the
                    controller's stdin feed's)
    bootstrap.py    what every rank runs before the user's script, sent as program("bootstrap.py"), from its
                    pieces: tagged.py, lines.py, envfiles.py, worldwatch.py, awake.py, nofile.py, mpiworld.py,
                    stackdump.py, stdinpump.py, writeall.py
    stdinrelay.py   an mpi job's stdin on one host: a FIFO per rank, the same bytes to each (launch/stdinrelay.py)
    stacks.py       asks a run's ranks on one host for their stacks (stackdump.py's files) and reads them
    stopranks.py    asks a run's ranks on one host to stop with their work kept (a signal to each rank's own pid)
    rankpids.py     a run's live ranks on one host from their pid files: a piece of stacks.py and stopranks.py
    detach.py       a detached run's keeper on its supervising host: the supervisor started in a session of its own,
                    its pid and exit code recorded (clusterctl/detach/supervisor.py)
    follow.py       that supervisor's state, its output followed from an offset, SIGTERM to it (detach/follow.py)
    proctime.py     a process's start time (ps -o lstart=): a piece of detach.py and follow.py
    telemetry.py    one sample of a host's memory, pressure, swap, load, GPU, heat, disk and run processes (`top`)
    missing.py      which of the named modules a host's python cannot import (a detached run's supervisor's)
    ports.py        a free loopback port, or whether ADDRESS:PORT can be listened on (serve)
"""
from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

# `from .<sibling> import a, b` on a line of its own: a piece of the same program, inlined by program()
SIBLING_IMPORT = re.compile(r"^from \.(\w+) import \w+(?:, \w+)*$", re.MULTILINE)


@lru_cache(maxsize=None)
def script_text(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def program(name: str) -> str:
    """Script `name` as one self-contained program for `python -c`: each relative import of a sibling script is
    replaced by that script's own text (inlined where first imported, its own sibling imports likewise). The
    pieces stay modules of this package, which ruff lints and tests import or run with `python -m`; a host gets
    one text and needs nothing else."""
    inlined = {name}

    def inline(text: str) -> str:
        def piece(m: re.Match) -> str:
            sibling = m.group(1) + ".py"
            if sibling in inlined:
                return ""
            inlined.add(sibling)
            return inline(script_text(sibling))
        return SIBLING_IMPORT.sub(piece, text)
    return inline(script_text(name))
