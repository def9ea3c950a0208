"""What the host helpers (filehelper.py, modelstore.py) share, inlined into each by scripts.program: the sha256 of
a file (their request and the names they share with the controller are contract.py's)."""
import hashlib


def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()

