"""The programs clusterctl runs on hosts, kept as real files (so they can be read, linted and run in tests)
and sent as text: `sh -c TEXT` / `python -c TEXT`, so a host needs nothing of clusterctl installed.

    probe.sh        doctor's and the pre-flight's one-round-trip probe (POSIX sh; its values come first)
    python_info.py  python, mlx and mpi4py versions, for the probe
    dataplane.py    the TCP data-plane check (listen on this host's ring port, connect to every peer's)
    filehelper.py   hashing, listing, deleting and verifying files for sync, data push and run
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def script_text(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
