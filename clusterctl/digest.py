"""sha256 of a file, read in blocks: the one content hash clusterctl compares (sync's SFTP fallback, shard
manifests, tokenizer files). Hosts compute the same with the standard library (hosts/scripts/filehelper.py)."""
from __future__ import annotations

import hashlib

BLOCK = 4 << 20


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()
