"""clusterctl's file helper, run on a host as `python -c <this file> OP REQUEST` (standard library only,
any Python 3 a Mac or Linux box has). REQUEST is JSON, or @PATH of an uploaded JSON file (removed after
reading). It prints one JSON answer. Ops:
  scan    create `root` and `dirs` (unless dry), remove leftover temporary files, and report `paths`:
          [sha256 or None, mode] (or ["link:TARGET", 0o777]); with `list`, every file under root, pruning
          `prune_top` (paths) and `prune_names` (names) and virtualenvs
  delete  unlink `paths` under root and the directories that became empty, never one that is the same file
          as a path in `keep` (a case-insensitive filesystem's other spelling); with `dry`, only report
  verify  dataset shards: check staged files against their sha256, rename the good ones into place,
          remove any other shard file matching `stale`, report the sha256 of `check`
"""
import os
import re
import shutil
import stat
import sys

from .contract import LINK, TMP, read_request, reply
from .helperbase import sha





def state(p, hashed):
    try:
        st = os.lstat(p)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return [LINK + os.readlink(p), 0o777]
    if not stat.S_ISREG(st.st_mode):
        return ["other", 0]
    return [sha(p) if hashed else None, stat.S_IMODE(st.st_mode)]


def scan(root, req):
    out = {}
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
    out["files"] = {p: state(os.path.join(root, p), req.get("hash")) for p in req.get("paths", [])}
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
    return out


def inode(p):
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def delete(root, req):
    # On a case-insensitive filesystem (macOS's default APFS) `Model.py` and `model.py` are one file: after
    # `git mv Model.py model.py` the host lists the old spelling as extra, and unlinking it would delete the
    # file we keep. Any name that is the same file (device and inode) as a kept path stays.
    kept = set(filter(None, (inode(os.path.join(root, p)) for p in req.get("keep", []))))
    gone = []
    for p in req["paths"]:
        full = os.path.join(root, p)
        if not (os.path.islink(full) or os.path.isfile(full)) or inode(full) in kept:
            continue
        gone.append(p)
        if req.get("dry"):
            continue
        os.unlink(full)
        d = os.path.dirname(full)
        while d != root and d.startswith(root + os.sep):
            try:
                os.rmdir(d)
            except OSError:
                break
            d = os.path.dirname(d)
    return {"deleted": gone}


def plain(name):
    """A name in `root` itself, nothing that resolves elsewhere ("../x", "a/b", "..", a backslash)."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\x00"):
        raise ValueError("refused: %r is not a plain file name inside the data directory" % (name,))
    return name


def verify(root, req):
    """Shards: check staged files against their sha256, rename the good ones into place (manifest last),
    and remove any other shard file (another world size, another host's rank). Every name must be plain."""
    for name in [req["stage"]] + [n for n, _ in req["files"]] + list(req["keep"]) + list(req.get("check", [])):
        plain(name)
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
    return {"bad": bad, "placed": placed, "stale": stale,
            "have": {n: (sha(os.path.join(root, n)) if os.path.isfile(os.path.join(root, n)) else None)
                     for n in req.get("check", [])}}


def main(op, arg):
    req = read_request(arg)
    root = os.path.expanduser(req["root"])
    reply({"scan": scan, "delete": delete, "verify": verify}[op](root, req))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
