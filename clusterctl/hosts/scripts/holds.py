"""Who holds a model store's directories on this host, for modelstore.py (inlined into it by scripts.program):

  - a push in progress holds its own partial directory by a lock: flock on a lock file beside it, taken by
    the push's `hold` helper, which lives exactly as long as the push's SSH connection (the watchdog ends it
    with the connection, so a push killed even by SIGKILL leaves its directory free to be resumed);
  - a running process holds an entry when its command line names the entry's path: a `clusterctl serve` rank
    (its spec lists every rank's model directory), a fine-tuning run given `--model` there, anyone's
    `mlx_lm.server --model` there. One portable ps finds them (`ps -ww -A -o pid= -o ppid= -o args=`: the
    same options on macOS's BSD ps and Linux's procps; -ww: the whole command line, never cut to a width),
    with the clusterctl run each belongs to (the `clusterctl-run-<id>` token on its command line or on a
    parent's, as observe/procs.py reads it).
Standard library only; fcntl.flock exists on macOS and Linux alike.
"""
import errno
import fcntl
import json
import os
import re
import subprocess

from .contract import RUN_ID, RUN_TOKEN

RUN_OF = re.compile(RUN_TOKEN + "(" + RUN_ID + ")")
PS_ROW = re.compile(r"\s*(\d+)\s+(\d+)(?:\s(.*))?\Z")
NAME_CHAR = "A-Za-z0-9._-"          # what an entry's name is made of: a path naming it ends before any other


def take(path):
    """An open descriptor holding the lock file `path` (created if missing), or None when another process holds
    it. A file unlinked (and perhaps made again) while we waited is not the lock any more: tried again."""
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise OSError("could not lock %s: it keeps being replaced" % path)


def free(path, then=None):
    """When no process holds the lock file `path`: call `then()` (if given) while holding it, remove the lock
    file and say True. False, touching nothing, when a live push holds it."""
    fd = take(path)
    if fd is None:
        return False
    try:
        if then is not None:
            then()
        os.unlink(path)
    finally:
        os.close(fd)
    return True


def processes():
    """{pid: [ppid, command line]} of every process on this host."""
    out = subprocess.run(["ps", "-ww", "-A", "-o", "pid=", "-o", "ppid=", "-o", "args="], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if out.returncode != 0:
        raise OSError("ps exited %d: %s" % (out.returncode, out.stderr.decode("utf-8", "replace").strip()[-200:]))
    rows, last = {}, None
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        m = PS_ROW.match(line)
        if m:
            last = int(m.group(1))
            rows[last] = [int(m.group(2)), m.group(3) or ""]
        elif last is not None:          # a command line with a newline in it, where ps prints it raw (BSD)
            rows[last][1] += "\n" + line
    return rows


def run_of(pid, rows):
    """The clusterctl run `pid` belongs to (its command line's token, or its nearest parent's), or None."""
    seen = set()
    while pid in rows and pid not in seen:
        seen.add(pid)
        m = RUN_OF.search(rows[pid][1])
        if m:
            return m.group(1)
        pid = rows[pid][0]
    return None


def users(paths):
    """[{path, pid, run, command}] for each process whose command line names one of `paths` (as it is, or as
    JSON writes it: a serve rank's spec), this helper and its parents left out."""
    rows = processes()
    mine, pid = set(), os.getpid()
    while pid not in mine:
        mine.add(pid)
        pid = rows.get(pid, [pid])[0]
    found = []
    for path in paths:
        forms = sorted({path, json.dumps(path)[1:-1]}, key=len, reverse=True)
        named = re.compile("(?:%s)(?![%s])" % ("|".join(re.escape(f) for f in forms), NAME_CHAR))
        for pid, (_, args) in sorted(rows.items()):
            if pid not in mine and named.search(args):
                found.append({"path": path, "pid": pid, "run": run_of(pid, rows),
                              "command": " ".join(args.split())[:100]})
    return found
