"""File operations on a host, for sync's SFTP fallback and for shard pushes.

Everything that needs to look at many files on a host is done by one short Python program run there
(hosts/scripts/filehelper.py, run with the host's `python`): hashing every file sync would send, listing a tree for `--delete`,
deleting, and checking shards. One SSH round trip each, whatever the number of files. Its request is JSON,
passed as an argument, or uploaded first when it is large.

Files are uploaded over one SFTP session per host to `NAME.clusterctl-tmp-XXXX` beside their final name,
their mode set, then renamed into place (POSIX rename: atomic), so no reader ever sees a half-written
file under its final name. Leftover temporary files of an interrupted upload are removed by the next scan.
"""
from __future__ import annotations

import json
import os
import uuid

from ..atomic import scratch_file
from ..errors import CommandFailed
from ..hosts.scripts import program
from ..hosts.transport import Transport

ARG_LIMIT = 60_000         # larger requests travel as an uploaded file, not an argument
HELPER_TIMEOUT_S = 600.0
HELPERS = {"filehelper.py": "file helper", "modelstore.py": "model store helper"}     # as messages name them

def call(transport: Transport, python: str, op: str, request: dict, timeout: float = HELPER_TIMEOUT_S,
         script: str = "filehelper.py") -> dict:
    """Run the file helper's `op` (or another helper script's: the model store's modelstore.py) on the host and
    return its JSON answer."""
    text = json.dumps(request)
    if len(text) > ARG_LIMIT:
        fd, local = scratch_file("clusterctl-req-", ".json")     # 0600 from the start
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            remote = f"{request['root'].rstrip('/')}.clusterctl-req-{uuid.uuid4().hex[:8]}.json"
            transport.put(local, remote, 0o600)
        finally:
            os.unlink(local)
        text = "@" + remote
    argv = [python, "-c", program(script), op, text]
    result = transport.run(argv, timeout)
    what = f"{python} (clusterctl {HELPERS.get(script, script)}: {op})"
    if not result.ok:
        raise CommandFailed(transport.host, what, result)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise CommandFailed(transport.host, f"{what}: no JSON answer", result) from None
