"""What `clusterctl doctor` can be asked to do (its defaults are the CLI's)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DoctorOptions:
    connect_timeout: float = 5.0      # diagnosis should not wait long for a host that does not answer
    deep: bool | None = None          # None: on when this machine has mpirun (or mlx.launch for ring)
    host_key_checking: str | None = None
    smoke_timeout: float = 90.0
