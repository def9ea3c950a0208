"""`clusterctl setup`: what a user would otherwise do by hand on every host before a first job: mesh.py
(passwordless SSH between every pair of hosts), python.py (this machine's Python and MLX on every host)."""
from __future__ import annotations

from ..errors import EXIT_CONNECT, EXIT_FAILED, EXIT_OK


def exit_code(ok: bool, hosts) -> int:
    """A setup's exit status: 0; 3 when a host could not be reached (hosts' `unreachable`); else 1."""
    if ok:
        return EXIT_OK
    return EXIT_CONNECT if any(h.unreachable for h in hosts) else EXIT_FAILED
