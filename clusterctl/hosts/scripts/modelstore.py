"""clusterctl's model store helper, run on a host as `python -c <this file> OP REQUEST` (standard library only,
any Python 3 a Mac or Linux box has). REQUEST is JSON, or @PATH of an uploaded JSON file (removed after
reading). It prints one JSON answer. The store (transfer/models.py, docs/models.md#layout-on-a-host):

    STORE/KEY/                 a complete entry: the model's files and ENTRY, written last inside the directory
                               while it was still under .partial/, then the directory renamed here
    STORE/.partial/KEY@SLOT/   a push in progress: the files verified so far (recorded in PUSH with their size
                               and mtime), PARTS/ directories (rsync's --partial-dir; SFTP appends there)
    STORE/.partial/KEY@SLOT.lock  held (flock) by the push writing KEY@SLOT for as long as it runs (holds.py)

KEY is NAME-DIGEST12; SLOT the host's name in the inventory, then HOST~2, HOST~3, ... for pushes of the same
model to the same host at once: every push writes a directory of its own (a push cut off leaves its directory
free, and the next push continues it), hosts whose stores are one directory (a home on NFS, a shared disk)
push side by side, and the first push to finish completes the entry; the others find it complete and drop
their copies. The store removes only what it made: a directory holding ENTRY or PUSH, or one under .partial/.
Ops (request: store, key, name, digest, files {path: [size, sha256]}, want [path], verify, slot):
  hold     choose this push's SLOT (the first no live push holds) and hold its lock; prints {"slot": SLOT},
           then waits for the push's connection to end (request: store, key, slot: the host's name)
  prepare  check a complete entry (size and mtime against what was recorded at verification, re-hashing a file
           that differs, every file with `verify`); if a file is missing or damaged the entry goes back to
           .partial (ENTRY removed first). Then check the partial files, move a damaged one aside as the
           basis a resumed transfer continues, and say which files to send and from which offset
  finish   hash what arrived, delete a file that does not match (and its partial copy), and when every wanted
           file is verified write ENTRY and rename the directory into the store
  list     every entry, complete or not, with its size and the bytes there so far
  remove   delete entries by KEY (ENTRY first, so none is ever seen complete and half deleted); nothing on this
           host when a process uses one (its command line names it) or a push is writing one: those are
           answered as `held` instead (with `dry`: only that answer)
"""
import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

from .contract import PARTS, TMP, StoreState, read_request, reply
from .helperbase import sha
from .holds import free, take, users

ENTRY = ".clusterctl-entry.json"
PUSH = ".clusterctl-push.json"
PARTIAL = ".partial"
RSYNC_TMP = re.compile(r"\.(.+)\.[A-Za-z0-9]{6}\Z")     # rsync's temporary .NAME.XXXXXX
LOCK = ".lock"


def plain(name):
    if not isinstance(name, str) or name in ("", ".", "..") or name.startswith(".") or \
            any(c in name for c in "/\\\x00"):
        raise ValueError("refused: %r is not a plain entry name" % (name,))
    return name


def relative(rel):
    """A model file's path: relative, no '.', '..' or hidden component, no backslash or NUL."""
    parts = rel.split("/") if isinstance(rel, str) else [""]
    if any(p in ("", ".", "..") or p.startswith(".") or "\\" in p or "\x00" in p for p in parts):
        raise ValueError("refused: %r is not a model file path" % (rel,))
    return rel


def read_json(p):
    try:
        with open(p, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(p, obj):
    tmp = "%s%s%d-%s" % (p, TMP, os.getpid(), os.urandom(4).hex())     # pids repeat across hosts sharing a store
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)


def stamp(p):
    """[size, mtime_ns] of a regular file, None for anything else or nothing."""
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns] if stat.S_ISREG(st.st_mode) else None


def check(root, rel, want, record, full):
    """None: absent; True: root/rel is the file (its size and mtime as recorded when it was verified, unless
    `full`, else by its sha256); False: something else is there."""
    p = os.path.join(root, rel)
    now = stamp(p)
    if now is None:
        return None if not os.path.lexists(p) else False
    if now[0] != want[0]:
        return False
    if not full and record == now:
        return True
    return sha(p) == want[1]


def part_of(root, rel):
    """Where the unfinished copy of root/rel waits: rsync's --partial-dir beside it."""
    d, base = os.path.split(os.path.join(root, rel))
    return os.path.join(d, PARTS, base)


def paths(req):
    store = os.path.expanduser(req["store"])
    key = plain(req["key"])
    for rel in list(req["files"]) + list(req.get("want", [])):
        relative(rel)
    slot = req.get("slot")
    return store, os.path.join(store, key), os.path.join(store, PARTIAL, key + ("@" + plain(slot) if slot else ""))


def ours(d):
    """Whether the directory d is one the store made: it holds ENTRY (complete) or PUSH (being completed)."""
    return os.path.isdir(d) and not os.path.islink(d) and any(os.path.lexists(os.path.join(d, n)) for n in (ENTRY, PUSH))


def lock_of(store, key, slot):
    return os.path.join(store, PARTIAL, "%s@%s%s" % (key, slot, LOCK))


def slots_of(store, key, base=None):
    """{slot: its directory} of KEY's partial directories (only those of SLOT `base` and its ~N), lock files too."""
    found = {}
    try:
        names = os.listdir(os.path.join(store, PARTIAL))
    except OSError:
        return found
    for n in names:
        slot = n[len(key) + 1:] if n.startswith(key + "@") else None
        slot = slot[:-len(LOCK)] if slot and slot.endswith(LOCK) else slot
        if slot and (base is None or re.match(re.escape(base) + r"(~\d+)?\Z", slot)):
            found[slot] = os.path.join(store, PARTIAL, "%s@%s" % (key, slot))
    return found


def hold(req):
    """Take this push's own partial directory: KEY@SLOT, else KEY@SLOT~2, ~3, ... (a directory a cut-off push
    left, whose lock no process holds, before a new one), and hold its lock until this process is ended (by the
    push when it is done, or by the watchdog when the push's connection is gone)."""
    store, key, base = os.path.expanduser(req["store"]), plain(req["key"]), plain(req["slot"])
    os.makedirs(os.path.join(store, PARTIAL), exist_ok=True)
    number = {slot: int(slot.rpartition("~")[2]) if "~" in slot else 1 for slot in slots_of(store, key, base)}
    known = sorted(number.values())         # a cut-off push's directory first: this push continues it
    for n in itertools.chain(known, (n for n in itertools.count(1) if n not in number.values())):
        slot = base if n == 1 else "%s~%d" % (base, n)
        if take(lock_of(store, key, slot)) is not None:       # held until this process ends
            break
    reply({"slot": slot})
    while True:
        time.sleep(3600)


def release(store, key, slot, part):
    """At the end of a push (the entry is complete): its own directory goes, then its lock file, and so do the
    directories of cut-off pushes of the same model to this host that no push holds (nothing is left for them
    to continue)."""
    if os.path.lexists(part):
        shutil.rmtree(part)
    if not slot:
        return
    base = slot.split("~", 1)[0]
    for other, d in slots_of(store, key, base).items():
        if other != slot:
            free(lock_of(store, key, other), lambda d=d: shutil.rmtree(d, ignore_errors=True))
    try:
        os.unlink(lock_of(store, key, slot))
    except OSError:
        pass


def records_of(doc, digest):
    return dict(doc.get("stamps", {})) if doc and doc.get("digest") == digest else {}


def prepare(req):
    store, entry, part = paths(req)
    files, want, full = req["files"], req["want"], bool(req.get("verify"))
    os.makedirs(os.path.join(store, PARTIAL), exist_ok=True)
    manifest = read_json(os.path.join(entry, ENTRY))
    bad, hashed = set(), 0
    if manifest is None and os.path.lexists(entry) and not ours(entry):
        raise ValueError("refused: %s is in the way and is not the store's (no %s in it): move it away" % (entry, ENTRY))
    if manifest is not None:
        if manifest.get("digest") != req["digest"]:
            raise ValueError("refused: %s holds another model (digest %s)" % (entry, manifest.get("digest")))
        records, good = records_of(manifest, req["digest"]), {}
        for rel in sorted(set(want) | set(manifest.get("present", []))):
            ok = check(entry, rel, files[rel], records.get(rel), full)
            hashed += ok is not None and (full or records.get(rel) != stamp(os.path.join(entry, rel)))
            if ok:
                good[rel] = stamp(os.path.join(entry, rel))
            elif ok is False:
                bad.add(rel)
        if not bad and set(want) <= set(good):
            release(store, req["key"], req.get("slot"), part)
            return {"state": StoreState.COMPLETE, "path": entry, "hashed": hashed}
        # back to partial: PUSH first (the store's mark), then without ENTRY, so it is never seen complete while
        # it changes
        write_json(os.path.join(entry, PUSH), {"name": req["name"], "digest": req["digest"], "files": files,
                                               "want": want, "stamps": good})
        os.unlink(os.path.join(entry, ENTRY))
        if os.path.lexists(part):
            shutil.rmtree(part)
        os.rename(entry, part)
    os.makedirs(part, exist_ok=True)
    records = records_of(read_json(os.path.join(part, PUSH)), req["digest"])
    send, resume, damaged = [], {}, sorted(bad)
    twin = twin_of(store, req["digest"], entry)
    for rel in want:
        p = os.path.join(part, rel)
        if twin is not None and rel not in bad and not os.path.lexists(p):
            link_from(twin, rel, p)
        ok = False if rel in bad else check(part, rel, files[rel], records.get(rel), full)
        if ok:
            records[rel] = stamp(p)
            continue
        records.pop(rel, None)
        os.makedirs(os.path.dirname(part_of(part, rel)), exist_ok=True)
        if ok is False:
            if rel not in bad:
                damaged.append(rel)
            os.replace(p, part_of(part, rel))     # the basis rsync's delta (or an SFTP append) continues
        send.append(rel)
        partial = stamp(part_of(part, rel))
        resume[rel] = partial[0] if partial else 0
        clear_temporary(os.path.dirname(p), os.path.basename(p))
    write_json(os.path.join(part, PUSH), {"name": req["name"], "digest": req["digest"], "files": files,
                                          "want": want, "stamps": records})
    return {"state": StoreState.PARTIAL, "path": part, "entry": entry, "send": send, "resume": resume,
            "damaged": damaged, "hashed": hashed}


def twin_of(store, digest, own):
    """(directory, manifest) of another complete entry of the same content (the same model pushed from a
    directory of another name), or None."""
    try:
        names = sorted(os.listdir(store))
    except OSError:
        return None
    for name in names:
        d = os.path.join(store, name)
        if name.startswith(".") or d == own or os.path.islink(d) or not os.path.isdir(d):
            continue
        doc = read_json(os.path.join(d, ENTRY))
        if doc is not None and doc.get("digest") == digest:
            return d, doc
    return None


def link_from(twin, rel, p):
    """Hard-link the twin entry's copy of rel to p when it is as the twin verified it; it is hashed again here
    (no record yet) before it counts, so nothing unverified enters the entry. Anything else: sent as usual."""
    d, doc = twin
    source = os.path.join(d, rel)
    if rel not in doc.get("present", []) or stamp(source) != doc.get("stamps", {}).get(rel):
        return
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.link(source, p)
    except OSError:
        pass                   # another file system, or no hard links there: the file is sent


def clear_temporary(directory, base):
    """Remove the temporary files an interrupted upload of `base` left in `directory`."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for n in names:
        m = RSYNC_TMP.match(n)
        if n.startswith(base + TMP) or (m and m.group(1) == base):
            os.unlink(os.path.join(directory, n))


def finish(req):
    store, entry, part = paths(req)
    files, want = req["files"], req["want"]
    doc = read_json(os.path.join(part, PUSH))
    records = records_of(doc, req["digest"])
    bad, missing = [], []
    for rel in sorted(set(want) | set(records)):
        ok = check(part, rel, files[rel], records.get(rel), False)
        if ok:
            records[rel] = stamp(os.path.join(part, rel))
            continue
        records.pop(rel, None)
        if rel not in want:
            continue
        if ok is None:
            missing.append(rel)
            continue
        bad.append(rel)
        for p in (os.path.join(part, rel), part_of(part, rel)):
            if os.path.lexists(p):
                os.unlink(p)
    if bad or missing:
        write_json(os.path.join(part, PUSH), dict(doc or {}, name=req["name"], digest=req["digest"], files=files,
                                                  want=want, stamps=records))
        return {"bad": bad, "missing": missing, "path": part}
    for d, dirs, names in os.walk(part, topdown=True):     # a complete entry holds verified files only
        for n in [n for n in dirs if n == PARTS]:
            shutil.rmtree(os.path.join(d, n))
            dirs.remove(n)
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), part).replace(os.sep, "/")
            if rel not in records and rel != PUSH:
                os.unlink(os.path.join(d, n))
    write_json(os.path.join(part, ENTRY), {"format": 1, "name": req["name"], "digest": req["digest"],
                                           "files": files, "present": sorted(records), "stamps": records,
                                           "verified_at": time.time()})
    os.unlink(os.path.join(part, PUSH))
    for _ in range(3):
        done = read_json(os.path.join(entry, ENTRY))
        if done is not None and done.get("digest") == req["digest"]:
            # another push (another host sharing this store, or this host's) completed the entry meanwhile: ours
            # adds what it lacks (a pipeline stage's files), each file by one rename of a verified file
            answer = join(entry, part, done, records)
            release(store, req["key"], req.get("slot"), part)
            return answer
        if os.path.lexists(entry):
            clear_leftover(entry)
            continue
        try:
            os.rename(part, entry)
        except OSError:            # another push's rename came first: look again
            continue
        release(store, req["key"], req.get("slot"), part)
        return {"bad": [], "missing": [], "path": entry, "present": sorted(records)}
    raise OSError("could not complete %s: another push to the same store keeps replacing it" % entry)


def clear_leftover(entry):
    """Remove what stands where the entry goes without being complete: the store's own leftover of a repair cut
    off (it holds PUSH). Anything else there is refused, never deleted. Moved aside first, so that an entry
    another push completed that moment is put back, not lost."""
    if not ours(entry):
        raise ValueError("refused: %s is in the way and is not the store's (no %s in it): move it away" % (entry, ENTRY))
    aside = "%s%s%d-%s" % (entry, TMP, os.getpid(), os.urandom(4).hex())
    try:
        os.rename(entry, aside)
    except OSError:
        return                     # gone meanwhile
    if read_json(os.path.join(aside, ENTRY)) is not None:
        try:
            os.rename(aside, entry)
            return
        except OSError:
            pass                   # a complete copy took its place meanwhile: this one is not needed
    shutil.rmtree(aside)


def join(entry, part, done, records):
    """Add the verified files of `part` that the complete `entry` lacks to it, then drop `part`. Two hosts doing
    this at once may each rewrite ENTRY without the other's files: the next prepare re-hashes those, no more."""
    present = set(done.get("present", []))
    stamps = dict(done.get("stamps", {}))
    added = sorted(set(records) - present)
    for rel in added:
        os.makedirs(os.path.dirname(os.path.join(entry, rel)), exist_ok=True)
        os.replace(os.path.join(part, rel), os.path.join(entry, rel))
        stamps[rel] = stamp(os.path.join(entry, rel))
    if added:
        write_json(os.path.join(entry, ENTRY), dict(done, present=sorted(present | set(added)), stamps=stamps))
    return {"bad": [], "missing": [], "path": entry, "present": sorted(present | set(added))}


def used(d):
    """Bytes of model data under d, unfinished copies included (not our own JSON files)."""
    total = 0
    for root, _, names in os.walk(d):
        for n in names:
            st = stamp(os.path.join(root, n)) if n not in (ENTRY, PUSH) else None
            total += st[0] if st else 0
    return total


def listing(req):
    store = os.path.expanduser(req["store"])
    out = []
    for where, state in ((store, StoreState.COMPLETE), (os.path.join(store, PARTIAL), StoreState.PARTIAL)):
        try:
            names = sorted(os.listdir(where))
        except OSError:
            continue
        for name in names:
            d = os.path.join(where, name)
            if name.startswith(".") or os.path.islink(d) or not os.path.isdir(d):
                continue
            if state == StoreState.COMPLETE and not ours(d):
                continue                         # not the store's: the user's own, in the folder it uses
            key = name.split("@", 1)[0]          # a partial entry's directory is KEY@SLOT
            doc = read_json(os.path.join(d, ENTRY if state == StoreState.COMPLETE else PUSH)) or {}
            files = doc.get("files", {})
            wanted = doc.get("present" if state == StoreState.COMPLETE else "want", [])
            out.append({"key": key, "name": doc.get("name"), "digest": doc.get("digest"),
                        "state": state if doc else StoreState.INCOMPLETE, "path": d,
                        "size": sum(files[r][0] for r in wanted if r in files), "bytes": used(d),
                        "files": len(wanted), "model_files": len(files)})
    return {"entries": out}


def remove(req):
    """Delete the entries of KEYS the store made, each complete one and every push's directory of it: on this
    host all of them, or (a process uses one, a push writes one) none, saying which are held and by whom."""
    store = os.path.expanduser(req["store"])
    entries, slots = [], []
    for key in req["keys"]:
        d = os.path.join(store, plain(key))
        if ours(d):
            entries.append(d)
        slots += [(lock_of(store, key, slot), d) for slot, d in sorted(slots_of(store, key).items())]
    taken, held = {}, []
    try:
        for lock, d in slots:
            fd = take(lock) if os.path.lexists(lock) else -1      # no lock file: no push holds it
            if fd is None:
                held.append({"path": d, "push": True})
            elif fd >= 0:
                taken[lock] = fd
        try:
            held += users(entries) if entries else []
        except (OSError, subprocess.SubprocessError) as e:
            raise ValueError("refused: could not list this host's processes to check that none uses the model "
                             "(%s): install ps (procps)" % e) from None
        if held or req.get("dry"):
            return {"removed": [], "held": held}
        gone = []
        for d in entries + [d for _, d in slots]:
            if os.path.isdir(d) and not os.path.islink(d):
                if os.path.lexists(os.path.join(d, ENTRY)):
                    os.unlink(os.path.join(d, ENTRY))
                shutil.rmtree(d)
                gone.append(d)
        for lock in taken:
            os.unlink(lock)
        return {"removed": gone, "held": []}
    finally:
        for fd in taken.values():
            os.close(fd)


def main(op, arg):
    ops = {"prepare": prepare, "finish": finish, "list": listing, "remove": remove, "hold": hold}
    reply(ops[op](read_request(arg)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
