"""File operations on a host, for sync's SFTP fallback and for shard pushes.

Everything that needs to look at many files on a host is done by one short Python program run there
(hosts/scripts/filehelper.py, run with the host's `python`): hashing every file sync would send, listing a tree for `--delete`,
deleting, and checking shards. One SSH round trip each, whatever the number of files. Its request is JSON,
passed as an argument, or uploaded first when it is large.

Files are uploaded over one SFTP session per host to `NAME.clusterctl-tmp-XXXX` beside their final name,
their mode set, then renamed into place (POSIX rename: atomic), so no reader ever sees a half-written
file under its final name. Leftover temporary files of an interrupted upload are removed by the next scan.

`held(...)` runs a helper op that answers once and then holds something on the host (the model store's lock on
a push's own directory) until the block ends, or until this process dies: the host's watchdog ends it with the
connection.
"""
from __future__ import annotations

import json
import os
import queue
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

from ..atomic import scratch_file
from ..errors import CommandFailed, CommandTimeout
from ..hosts import hostscript
from ..hosts.transport import Result, Transport

ARG_LIMIT = 60_000         # larger requests travel as an uploaded file, not an argument
HELPER_TIMEOUT_S = 600.0
HELPERS = {"filehelper.py": "file helper", "modelstore.py": "model store helper"}     # as messages name them

def call(transport: Transport, python: str, op: str, request: dict, timeout: float = HELPER_TIMEOUT_S,
         script: str = "filehelper.py") -> dict:
    """Run the file helper's `op` (or another helper script's: the model store's modelstore.py) on the host and
    return its JSON answer."""
    result = hostscript.run(transport, python, script, op, argument(transport, request), timeout=timeout)
    what = f"{python} (clusterctl {HELPERS.get(script, script)}: {op})"
    if not result.ok:
        raise CommandFailed(transport.host, what, result)
    try:
        return hostscript.answer(result)
    except hostscript.NoAnswer:
        raise CommandFailed(transport.host, f"{what}: no JSON answer", result) from None


def argument(transport: Transport, request: dict) -> str:
    """The request as a helper's argument: its JSON, or @PATH of a file uploaded beside request['root'] when it is
    too large for a command line (the helper removes it once read)."""
    text = json.dumps(request)
    if len(text) <= ARG_LIMIT:
        return text
    fd, local = scratch_file("clusterctl-req-", ".json")     # 0600 from the start
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    try:
        remote = f"{request['root'].rstrip('/')}.clusterctl-req-{uuid.uuid4().hex[:8]}.json"
        transport.put(local, remote, 0o600)
    finally:
        os.unlink(local)
    return "@" + remote


@contextmanager
def held(transport: Transport, python: str, op: str, request: dict, timeout: float = HELPER_TIMEOUT_S,
         script: str = "filehelper.py") -> Iterator[dict]:
    """Start the helper's `op` (one that prints one JSON answer, then holds what it took until it is ended), yield
    its answer, and end it when the block ends."""
    lines: queue.Queue = queue.Queue()
    proc = hostscript.start(transport, python, script, op, json.dumps(request), lines=lines)
    what = f"{python} (clusterctl {HELPERS.get(script, script)}: {op})"
    try:
        deadline, err = time.monotonic() + timeout, []
        while True:
            try:
                is_err, line = lines.get(timeout=0.2)
            except queue.Empty:
                if proc.poll() is not None and not any(t.is_alive() for t in proc.readers) and lines.empty():
                    raise CommandFailed(transport.host, what, Result(proc.poll(), "", "\n".join(err))) from None
                if time.monotonic() > deadline:
                    raise CommandTimeout(transport.host, what, timeout, "", "\n".join(err)) from None
                continue
            if is_err:
                err.append(line)
                continue
            try:
                answer = hostscript.message(line)
            except ValueError:
                raise CommandFailed(transport.host, f"{what}: no JSON answer", Result(1, line, "\n".join(err))) from None
            break
        yield answer
    finally:
        proc.stop()
