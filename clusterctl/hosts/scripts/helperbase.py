"""What the host helpers (filehelper.py, modelstore.py) share, inlined into each by scripts.program: the sha256 of
a file, the request (JSON given as the argument, or @PATH of an uploaded JSON file, removed once read), and the
mark of the temporary names an atomic upload uses (TMP: hosts/files.py imports it from here, one spelling for
both sides)."""
import hashlib
import json
import os

TMP = ".clusterctl-tmp-"          # temporary names on hosts: NAME.clusterctl-tmp-XXXXXXXX (hosts/files.py TMP_MARK)


def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def read_request(arg):
    if not arg.startswith("@"):
        return json.loads(arg)
    with open(os.path.expanduser(arg[1:])) as f:
        req = json.load(f)
    os.unlink(os.path.expanduser(arg[1:]))
    return req
