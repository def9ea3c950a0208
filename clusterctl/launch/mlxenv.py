"""What each rank of MLX's `ring` and `jaccl` backends reads, built the way mlx.launch 0.32 builds it, as pure
functions of the inventory: a rank launcher that starts ranks itself (without mlx.launch) writes these files
and exports these variables, and the ranks cannot tell the difference.

    text = ring_hostfile_json(cluster, starting_port=32323, connections_per_ip=1)   # write it to PATH
    env = ring_env(rank, PATH)                                                       # {MLX_RANK, MLX_HOSTFILE}

    text = ibv_devices_json(cluster)                                                 # write it to PATH
    env = jaccl_env(cluster, rank, port=32323, devices_path=PATH)   # {MLX_RANK, MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR}

Ranks are the hosts in inventory order, each repeated `slots` times (mlx.launch's hostfile has one entry
per rank). Every value is a string, ready for os.environ. Where mlx.launch writes a file it runs
`echo TEXT > FILE`, so its files end in a newline; MLX parses the file either way.

Standard library only (the Cluster type is for annotations): the rank launcher may import this anywhere.
See docs/facts/launchers.md#mlx-launch-rank-environment and docs/facts/macos.md#jaccl.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..inventory import Cluster, Host

LOCAL_IP = "127.0.0.1"     # the one host mlx.launch runs without ssh (docs/facts/launchers.md#mlx-launch-runs-ssh-tt)


def rank_hosts(cluster: Cluster) -> list[Host]:
    """The host of every rank, in rank order: each host `slots` times."""
    return [h for h in cluster.hosts for _ in range(h.slots)]


def rank_ips(cluster: Cluster) -> list[list[str]]:
    """Each rank's data-plane addresses, as mlx.launch's hostfile lists them in `ips`: the host's `address`
    ([] without one); this machine (`local: true`) is 127.0.0.1."""
    return [[LOCAL_IP] if h.local else [h.address] if h.address else [] for h in rank_hosts(cluster)]


# ---- ring ---------------------------------------------------------------------------------------

def ring_hostfile_json(cluster: Cluster, starting_port: int, connections_per_ip: int) -> str:
    """MLX_HOSTFILE's text for the ring backend: a JSON list with, per rank, its "ip:port" strings; ports go
    up by one per connection, address and rank from `starting_port` (mlx.launch's default 32323), each address
    `connections_per_ip` times. "" for a world of one rank, which the ring backend treats as no hostfile.
    ValueError when a rank's host has no address (the ring needs them: docs/facts/mlx-distributed.md#ring-is-ipv4-only)."""
    ips = rank_ips(cluster)
    for host, addresses in zip(rank_hosts(cluster), ips):
        if not addresses:
            raise ValueError(f"{host.name} has no `address`: the ring backend needs every rank's IPv4 address")
    port, ranks = starting_port, []
    for addresses in ips:
        mine = []
        for ip in addresses:
            for _ in range(connections_per_ip):
                mine.append(f"{ip}:{port}")
                port += 1
        ranks.append(mine)
    return json.dumps(ranks) if len(ranks) > 1 else ""


def ring_env(rank: int, hostfile_path: str) -> dict[str, str]:
    """A ring rank's variables: its rank and the path of the file holding ring_hostfile_json's text."""
    return {"MLX_RANK": str(rank), "MLX_HOSTFILE": hostfile_path}


# ---- jaccl --------------------------------------------------------------------------------------

def jaccl_pairs(world_size: int, ring: bool = False) -> list[tuple[int, int]]:
    """The (rank, peer) pairs jaccl needs an RDMA device for, in order: every ordered pair of distinct ranks
    (the mesh, `jaccl`), or each rank's two ring neighbours only (`jaccl-ring`)."""
    n = world_size
    pairs = [(i, j) for i in range(n) for j in (((i - 1) % n, (i + 1) % n) if ring else range(n)) if i != j]
    return list(dict.fromkeys(pairs))       # two ranks in a ring: left and right neighbour are one rank


def ibv_devices_json(cluster: Cluster) -> str:
    """MLX_IBV_DEVICES's text: json.dumps of one list per rank, each the host's inventory `rdma` list (entry j:
    the RDMA device, or list of devices, that rank uses to reach rank j; null for itself). ValueError when a
    host has no `rdma` (backends check this at the inventory's line before anything launches)."""
    rows = []
    for host in rank_hosts(cluster):
        if host.rdma is None:
            raise ValueError(f"{host.name} has no `rdma` list: the jaccl backend needs one on every host")
        rows.append([list(e) if isinstance(e, tuple) else e for e in host.rdma])
    return json.dumps(rows)


def jaccl_coordinator(cluster: Cluster, port: int) -> str:
    """MLX_JACCL_COORDINATOR: rank 0's first address and `port` (mlx.launch passes its --starting-port,
    default 32323). ValueError when rank 0's host has no address."""
    first = rank_ips(cluster)[0]
    if not first:
        raise ValueError(f"{cluster.hosts[0].name} (rank 0) has no `address`: it is the jaccl coordinator")
    return f"{first[0]}:{port}"


def jaccl_env(cluster: Cluster, rank: int, port: int, devices_path: str, *, ring: bool = False) -> dict[str, str]:
    """A jaccl rank's variables: MLX_RANK, MLX_IBV_DEVICES (the path of the file holding ibv_devices_json's
    text), MLX_JACCL_COORDINATOR (jaccl_coordinator), and MLX_JACCL_RING=1 for the jaccl-ring variant."""
    env = {"MLX_RANK": str(rank), "MLX_IBV_DEVICES": devices_path,
           "MLX_JACCL_COORDINATOR": jaccl_coordinator(cluster, port)}
    if ring:
        env["MLX_JACCL_RING"] = "1"
    return env
