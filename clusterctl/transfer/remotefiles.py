"""File operations on a host, for sync's SFTP fallback and for shard pushes.

Everything that needs to look at many files on a host is done by one short Python program run there
(HELPER, with the host's `python`): hashing every file sync would send, listing a tree for `--delete`,
deleting, and checking shards. One SSH round trip each, whatever the number of files. Its request is JSON,
passed as an argument, or uploaded first when it is large.

Files are uploaded over one SFTP session per host to `NAME.clusterctl-tmp-XXXX` beside their final name,
their mode set, then renamed into place (POSIX rename: atomic), so no reader ever sees a half-written
file under its final name. Leftover temporary files of an interrupted upload are removed by the next scan.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from typing import Callable

from ..errors import CommandFailed
from ..hosts.transport import LocalTransport, Transport

TMP_MARK = ".clusterctl-tmp-"
ARG_LIMIT = 60_000         # larger requests travel as an uploaded file, not an argument
CHUNK = 1 << 20
HELPER_TIMEOUT_S = 600.0

HELPER = r'''
import hashlib, json, os, re, shutil, stat, sys
op, arg = sys.argv[1], sys.argv[2]
if arg.startswith("@"):
    with open(os.path.expanduser(arg[1:])) as f:
        req = json.load(f)
    os.unlink(os.path.expanduser(arg[1:]))
else:
    req = json.loads(arg)
root = os.path.expanduser(req["root"])
TMP = ".clusterctl-tmp-"
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
def state(p):
    try:
        st = os.lstat(p)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return ["link:" + os.readlink(p), 0o777]
    if not stat.S_ISREG(st.st_mode):
        return ["other", 0]
    return [sha(p) if req.get("hash") else None, stat.S_IMODE(st.st_mode)]
out = {}
if op == "scan":
    if not req.get("dry"):
        os.makedirs(root, exist_ok=True)
        for d in req.get("dirs", []):
            p = os.path.join(root, d)
            if os.path.islink(p) or (os.path.exists(p) and not os.path.isdir(p)):
                os.unlink(p)
            os.makedirs(p, exist_ok=True)
        for d in set([""] + req.get("dirs", [])):
            for n in os.listdir(os.path.join(root, d)):
                if TMP in n:
                    os.unlink(os.path.join(root, d, n))
    out["files"] = {p: state(os.path.join(root, p)) for p in req.get("paths", [])}
    if req.get("list"):
        top, names = set(req.get("prune_top", [])), set(req.get("prune_names", []))
        tree = []
        for dp, dns, fns in os.walk(root):
            rel = os.path.relpath(dp, root)
            rel = "" if rel == "." else rel + "/"
            links = [d for d in dns if os.path.islink(os.path.join(dp, d))]
            dns[:] = [d for d in dns if d not in links and rel + d not in top and d not in names
                      and not os.path.isfile(os.path.join(dp, d, "pyvenv.cfg"))]
            tree += [rel + n for n in fns + links if TMP not in n]
        out["tree"] = sorted(set(tree)) if os.path.isdir(root) else []
elif op == "delete":
    gone = []
    for p in req["paths"]:
        full = os.path.join(root, p)
        if os.path.islink(full) or os.path.isfile(full):
            os.unlink(full)
            gone.append(p)
        d = os.path.dirname(full)
        while d != root and d.startswith(root + os.sep):
            try:
                os.rmdir(d)
            except OSError:
                break
            d = os.path.dirname(d)
    out["deleted"] = gone
elif op == "verify":
    # shards: check staged files against their sha256, rename the good ones into place (manifest last),
    # and remove any other shard file (another world size, another host's rank)
    os.makedirs(root, exist_ok=True)
    stage = os.path.join(root, req["stage"])
    bad, placed = [], []
    for name, want in req["files"]:
        src = os.path.join(stage, name)
        if not os.path.exists(src):
            continue
        if sha(src) != want:
            os.unlink(src)
            bad.append(name)
        else:
            os.replace(src, os.path.join(root, name))
            placed.append(name)
    keep = set(req["keep"])
    stale = [n for n in os.listdir(root) if re.fullmatch(req["stale"], n) and n not in keep]
    for n in stale:
        os.unlink(os.path.join(root, n))
    shutil.rmtree(stage, ignore_errors=True)
    out = {"bad": bad, "placed": placed, "stale": stale,
           "have": {n: (sha(os.path.join(root, n)) if os.path.isfile(os.path.join(root, n)) else None)
                    for n in req.get("check", [])}}
print(json.dumps(out))
'''


def call(transport: Transport, python: str, op: str, request: dict, timeout: float = HELPER_TIMEOUT_S) -> dict:
    """Run HELPER's `op` on the host and return its JSON answer."""
    text = json.dumps(request)
    if len(text) > ARG_LIMIT:
        local = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"clusterctl-req-{uuid.uuid4().hex}.json")
        with open(local, "w") as f:
            f.write(text)
        try:
            remote = f"{request['root'].rstrip('/')}.clusterctl-req-{uuid.uuid4().hex[:8]}.json"
            transport.put(local, remote, 0o600)
        finally:
            os.unlink(local)
        text = "@" + remote
    argv = [python, "-c", HELPER, op, text]
    result = transport.run(argv, timeout)
    if not result.ok:
        raise CommandFailed(transport.host, f"{python} (clusterctl file helper: {op})", result)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise CommandFailed(transport.host, f"{python} (clusterctl file helper: {op}): no JSON answer",
                            result) from None




def sftp_path(path: str) -> str:
    """SFTP sessions start in the home directory, where `~/x` is `x`."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path


class Uploader:
    """Atomic uploads over one SFTP session (or plain copies for a local host), with a byte callback and an
    optional bandwidth limit."""

    def __init__(self, transport: Transport, on_bytes: Callable[[int], None] | None = None,
                 bwlimit_kbps: int | None = None):
        self.transport = transport
        self.on_bytes = on_bytes or (lambda n: None)
        self.bwlimit = bwlimit_kbps * 1024 if bwlimit_kbps else None
        self._sftp = None
        self._start = time.monotonic()
        self._sent = 0

    def __enter__(self):
        if not isinstance(self.transport, LocalTransport):
            self._sftp = self.transport.connect().open_sftp()
        return self

    def __exit__(self, *exc):
        if self._sftp is not None:
            self._sftp.close()

    def _count(self, n: int) -> None:
        self._sent += n
        self.on_bytes(n)
        if self.bwlimit:
            ahead = self._sent / self.bwlimit - (time.monotonic() - self._start)
            if ahead > 0:
                time.sleep(ahead)

    def put(self, local: str, remote: str, mode: int) -> None:
        """Copy `local` to `remote` (its parent exists) via a temporary name and a rename."""
        tmp = f"{remote}{TMP_MARK}{uuid.uuid4().hex[:8]}"
        if self._sftp is None:
            dest, tmp = os.path.expanduser(remote), os.path.expanduser(tmp)
            try:
                with open(local, "rb") as src, open(tmp, "wb") as dst:
                    while block := src.read(CHUNK):
                        dst.write(block)
                        self._count(len(block))
                os.chmod(tmp, mode)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return
        sftp, tmp, dest = self._sftp, sftp_path(tmp), sftp_path(remote)
        try:
            with open(local, "rb") as src, sftp.open(tmp, "wb") as dst:
                dst.set_pipelined(True)
                while block := src.read(CHUNK):
                    dst.write(block)
                    self._count(len(block))
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, dest)
        except BaseException:
            try:
                sftp.remove(tmp)
            except (OSError, EOFError):
                pass
            raise

    def symlink(self, target: str, remote: str) -> None:
        """Create (or replace) a symlink atomically: made under a temporary name, then renamed."""
        tmp = f"{remote}{TMP_MARK}{uuid.uuid4().hex[:8]}"
        if self._sftp is None:
            os.symlink(target, os.path.expanduser(tmp))
            os.replace(os.path.expanduser(tmp), os.path.expanduser(remote))
            return
        self._sftp.symlink(target, sftp_path(tmp))
        self._sftp.posix_rename(sftp_path(tmp), sftp_path(remote))


    def chmod(self, remote: str, mode: int) -> None:
        if self._sftp is None:
            os.chmod(os.path.expanduser(remote), mode)
        else:
            self._sftp.chmod(sftp_path(remote), mode)
