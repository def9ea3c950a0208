"""The launch backends, one registry entry each: how a job starts on every rank for MLX's `mpi`, `ring`
and `jaccl` backends. Everything that differs between backends is in this package; the rest of clusterctl
asks the registry (`get(name)`, `names()`), never compares backend names.

    backend = get("ring")
    command = backend.command(cluster, plan, program=[...], rank_env={...}, where=LaunchSite.here(connector, launcher, dir))
    command.argv, command.files, command.path_prepend       # what to write where, and what to run

An entry is a Backend (base.py) of one launcher family, one module each: mpi.py (mpirun), mlxlaunch.py
(MLX's mlx.launch) and rankstarter.py (clusterctl's own rank starter, the default for ring and jaccl, with
mlx.launch as its fallback). It says which launcher starts the ranks, where that launcher is on this
machine or on a host, which hostfile it reads and its command line; the MLX backend it starts is its
BackendSpec (base.py), which the starter shares with its mlx.launch fallback: the name, whether `run
--elastic` can shrink its world (rdma), what bench measures and, as small frozen records, what `bench
--tune` varies and how a chosen setting is written to the inventory (Tuning) and doctor's smoke test
(SmokeTest). Adding a backend is adding an entry to REGISTRY (and its tests).
"""
from __future__ import annotations

from ...errors import InventoryError, UsageError
from ...inventory import Cluster
from .base import Backend, BackendSpec, LauncherCommand, SmokeTest, Tuning, write_files
from .mlxlaunch import MLXLaunchBackend, mlx_launch_argv
from .mpi import MPIBackend, mpirun_argv
from .rankstarter import RankStarterBackend

__all__ = ["REGISTRY", "Backend", "BackendSpec", "LauncherCommand", "MLXLaunchBackend", "MPIBackend",
           "RankStarterBackend", "SmokeTest", "Tuning", "for_hostfile", "get", "launchers", "mlx_launch_argv",
           "mpirun_argv", "names", "validated", "write_files"]

# MLX's backends and which of them clusterctl offers: docs/facts/mlx-distributed.md#backends
REGISTRY: dict[str, Backend] = {b.name: b for b in (
    MPIBackend(),
    # ring: TCP between neighbours only (MLX's ring sends to a rank's two neighbours:
    # docs/facts/mlx-distributed.md#ring-sends-to-neighbours-only)
    RankStarterBackend(MLXLaunchBackend("ring", benchmarked=True, neighbours_only=True,
                                        smoke=SmokeTest(("data-plane",)), tuning=Tuning("connections_per_ip", "launch"))),
    # jaccl: RDMA over Thunderbolt 5 between every pair of ranks (docs/facts/macos.md#jaccl); its `jaccl-ring`
    # variant would be RankStarterBackend(MLXLaunchBackend("jaccl-ring", rdma="ring")). No smoke test:
    # doctor checks each Mac's RDMA devices instead (doctor/checks.py's jaccl)
    RankStarterBackend(MLXLaunchBackend("jaccl", rdma="mesh")),
)}


def names(benchmarked: bool = False) -> list[str]:
    return [n for n, b in REGISTRY.items() if b.benchmarked or not benchmarked]


def get(name: str, launcher: str | None = None) -> Backend:
    """The backend `name`, started by its own launcher or, when `launcher` names another one it offers
    (`--launcher mlx.launch` for ring), by that one. UsageError for a name or launcher it does not know."""
    try:
        backend = REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r} (one of {', '.join(REGISTRY)})") from None
    if launcher is None or launcher == backend.launcher_name:
        return backend
    fallbacks = backend.fallbacks
    if launcher not in fallbacks:
        offered = ", ".join([backend.launcher_name, *fallbacks])
        raise UsageError(f"--launcher {launcher}: the {name} backend is started by {offered}")
    return fallbacks[launcher]


def launchers() -> list[str]:
    """Every launcher some backend can be started by (the CLI's --launcher choices)."""
    out = []
    for b in REGISTRY.values():
        for name in (b.launcher_name, *b.fallbacks):
            if name not in out:
                out.append(name)
    return out


def for_hostfile(fmt: str, preferred: str) -> Backend:
    """The backend whose launcher reads a `fmt` hostfile: `preferred` (the inventory's) when it does,
    else the first registered one that does. UsageError for a format no backend launches from."""
    variants = [v for b in REGISTRY.values() for v in (b, *b.fallbacks.values())]
    fits = [b for b in variants if b.hostfile_format == fmt]
    if not fits:
        usable = sorted({b.hostfile_format for b in variants if b.hostfile_format})
        raise UsageError(f"no backend launches from a {fmt} hostfile (MLX's mpi backend needs Open MPI): "
                         f"--print-command works with {' or '.join(usable)}")
    return next((b for b in fits if b.name == preferred), fits[0])


def validated(cluster: Cluster) -> Cluster:
    """The cluster, once its `launch.backend` names a registered backend and the inventory gives what that
    backend needs (InventoryError at the line)."""
    if cluster.launch.backend not in REGISTRY:
        raise InventoryError(cluster.path, cluster.launch.backend_line,
                             f"launch.backend must be one of {', '.join(REGISTRY)}, not '{cluster.launch.backend}'")
    REGISTRY[cluster.launch.backend].check(cluster)
    return cluster
