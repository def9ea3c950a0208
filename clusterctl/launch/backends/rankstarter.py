"""clusterctl's own rank starter, the default launcher of the `ring` and `jaccl` backends
(docs/facts/launchers.md#our-rank-starter): its registry entries, each holding its mlx.launch entry as the
fallback (`--launcher mlx.launch`) and sharing that entry's BackendSpec, and the free ports a job on this
machine alone listens on.

    backend = RankStarterBackend(MLXLaunchBackend("ring", ...))   # the same MLX backend, started by us
    port = free_port_block(4)                                      # 4 consecutive free ports on 127.0.0.1
"""
from __future__ import annotations

import json
import os
import shlex
import sys

from ...errors import LaunchError
from ...hosts.facts import RING_STARTING_PORT
from ...hosts.scripts import program as script_program
from ...hosts.scripts.contract import ENV_FILES_ENV
from ...hosts.quoting import quote_path, shell_command
from ...hosts.remote import env_input, remote_command
from ...inventory import Cluster
from .. import mlxenv
from ..site import LaunchSite
from .base import Backend, LauncherCommand
from .mlxlaunch import MLXLaunchBackend


# a rank on another host stops this long after the starter's last pulse (hosts/scripts/ranks.py, watchdog.sh ALIVE)
ALIVE_S = 30


class RankStarterBackend(Backend):
    """MLX's `ring` backend started by clusterctl itself (docs/facts/launchers.md#our-rank-starter): every rank
    is started directly, over the one OpenSSH rendering (hosts/openssh.py) or on the launching machine
    without ssh, with exactly the environment MLX's own launcher gives it (MLX_RANK, and MLX_HOSTFILE
    naming a file with every rank's `ip:port` list; see rank_env below). The starter is a standard-library
    program (hosts/scripts/ranks.py) that sleeps in select() between lines; mlx.launch stays available as
    a fallback (`--launcher mlx.launch`)."""

    launcher_name, hostfile_format, hostfile_name = "clusterctl", None, "ranks.json"
    needs_addresses = True
    install_hint = "it is part of clusterctl"

    def __init__(self, fallback: MLXLaunchBackend):
        """The same MLX backend as `fallback` (mlx.launch's entry), its spec shared: its name, what bench
        measures and tunes, doctor's smoke test, its rdma layout; only who starts the ranks differs."""
        self.fallback = fallback
        self.fallbacks = {fallback.launcher_name: fallback}
        self.spec = fallback.spec

    @property
    def peers_variable(self):
        return self.fallback.peers_variable

    def launcher_here(self):
        return [sys.executable]

    def launcher_on_host(self, python, mpirun=None):
        return [python]

    def command(self, cluster, plan, *, program, rank_env, where, hostfile=None, cwd=None):
        local_only = all(_runs_where(h, where) for h in cluster.hosts)
        if where.ssh is None and not local_only:
            raise LaunchError(f"starting ranks on other hosts needs an OpenSSH client (ssh) on {where.name}")
        port = free_port_block(cluster.world_size * cluster.launch.connections_per_ip) if local_only \
            else RING_STARTING_PORT
        files = self.rank_files(cluster, port)
        ranks = []
        for rank, host in enumerate(h for h in cluster.hosts for _ in range(h.slots)):
            mlx = self.rank_env(cluster, rank, port)
            env = {**rank_env, **mlx}
            if files:
                env[ENV_FILES_ENV] = json.dumps(files, separators=(",", ":"))
            # the environment goes on the rank's stdin (the starter writes it first), never its command line
            # the host's own python, a leading ~ its home (quote_path), as the pre-flight found it; MLX_RANK
            # (no secret) also on the command line, where `clusterctl ps` reads a rank's number
            # then the starter's own stdin, the same bytes to every rank (docs/run.md#standard-input)
            # a rank over ssh also stops when the starter's pulses stop (its host vanished with the connection
            # open: a power cut), within ALIVE_S; one beside the starter dies with its pipe
            here = _runs_where(host, where)
            alive = 0 if here else ALIVE_S
            wrapped = remote_command(shell_command(
                f"MLX_RANK={rank} {quote_path(host.python)} {shlex.join(program[1:])}"), env=True, stdin=True,
                alive=alive)
            argv = ["/bin/sh", "-c", wrapped] if here else [where.ssh, *where.ssh_options, "--", host.name, wrapped]
            # "mlx": for the record (and the reader of ranks.json): what MLX reads, the files by their text
            ranks.append({"rank": rank, "host": host.name, "mlx": {**mlx, **files}, "argv": argv,
                          "stdin": env_input(env).decode(), "alive": alive})
        spec = os.path.join(where.dir, self.hostfile_name)
        starter = os.path.join(where.dir, "ranks.py")
        files = [(spec, json.dumps({"ranks": ranks}, indent=1) + "\n", 0o600), (starter, script_program("ranks.py"), None)]
        return LauncherCommand([*(where.launcher or [sys.executable]), starter, spec], files)

    def hostfile(self, cluster: Cluster) -> str:
        """The ranks need none; this is the hostfile mlx.launch would read for them (`clusterctl hostfile`)."""
        return self.fallback.hostfile(cluster)

    def rank_files(self, cluster: Cluster, port: int) -> dict[str, str]:
        """The files MLX reads by path, by the variable that names them, with their text, as mlx.launch 0.32
        writes them (launch/mlxenv.py): ring, MLX_HOSTFILE (every rank's `ip:port` list, ports counted up
        from `port`; none for a ring of one); jaccl, MLX_IBV_DEVICES (every rank's RDMA devices). The same
        for every rank: the bootstrap writes them on the rank's host from CLUSTERCTL_ENV_FILES and points
        each variable at its file."""
        try:
            if self.rdma is None:
                text = mlxenv.ring_hostfile_json(cluster, port, cluster.launch.connections_per_ip)
                return {self.peers_variable: text} if text else {}
            return {self.peers_variable: mlxenv.ibv_devices_json(cluster)}
        except ValueError as e:
            raise LaunchError(f"{e} (run clusterctl doctor)") from None

    def rank_env(self, cluster: Cluster, rank: int, port: int) -> dict[str, str]:
        """The variables rank `rank` gets besides the files: MLX_RANK; for jaccl also MLX_JACCL_COORDINATOR
        (rank 0's address and `port`) and, for its ring variant, MLX_JACCL_RING."""
        if self.rdma is None:
            return {"MLX_RANK": str(rank)}
        try:
            env = mlxenv.jaccl_env(cluster, rank, port, "", ring=self.rdma == "ring")
        except ValueError as e:
            raise LaunchError(f"{e} (run clusterctl doctor)") from None
        return {k: v for k, v in env.items() if k != "MLX_IBV_DEVICES"}



def _runs_where(host, where: LaunchSite) -> bool:
    """The rank's host is the machine the starter runs on: started without ssh."""
    return host.local if where.host is None else host.name == where.host


def free_port_block(count: int, low: int = RING_STARTING_PORT, high: int = 60000) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1, searched from a random point between `low`
    and `high` (then from `low`): two jobs started on one machine at the same moment, each checking before its
    ranks bind, do not both land on the first free block."""
    import random
    import socket

    start = random.randrange(low, max(low + 1, high - count))
    for port in (*range(start, high - count), *range(low, start)):
        held = []
        try:
            for p in range(port, port + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise LaunchError(f"no {count} consecutive free ports on 127.0.0.1 above {low}")

