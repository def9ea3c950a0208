"""The per-rank files and variables of MLX's ring and jaccl backends (clusterctl/launch/mlxenv.py), against
golden files whose expectations were derived by reading mlx 0.32.x's launcher,
mlx/_distributed_utils/launch.py:

- ring (`launch_ring`, lines 312-344 in 0.32.4): per rank, per ip, `connections_per_ip` entries "ip:port",
  the port starting at --starting-port and going up by one after every entry, across ranks; the file is
  `json.dumps(ring_hosts)` when there is more than one rank, else ""; each rank gets MLX_HOSTFILE (a temporary
  file holding that text, `RemoteProcess.make_launch_script`, lines 108-160) and MLX_RANK.
- jaccl (`launch_jaccl`, lines 386-435): MLX_JACCL_COORDINATOR = `hosts[0].ips[0]:starting_port`,
  MLX_IBV_DEVICES = a file holding `json.dumps([h.rdma for h in hosts])`, MLX_RANK; MLX_JACCL_RING=1 for
  `--backend jaccl-ring`; a pair (i, j) with a null device is refused for every i != j (all pairs), or for
  j = i +- 1 only with jaccl-ring.

The last tests hand our rendered hostfile to mlx.launch's own parser and launch functions (only the part
that would start ssh processes is replaced by a recorder) and compare what MLX would give each rank with
what our builders give.
"""
import argparse
import json
import os

import pytest

from clusterctl.inventory import Cluster, Host, load
from clusterctl.inventory_load import load_cluster
from clusterctl.launch import backends
from clusterctl.launch.hostfile import render
from clusterctl.launch.mlxenv import (ibv_devices_json, jaccl_env, jaccl_pairs, rank_ips, ring_env,
                                      ring_hostfile_json)

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
DEVICES_PATH = "/tmp/clusterctl-ibv-devices.json"


def golden(name: str) -> str:
    with open(os.path.join(GOLDEN, name)) as f:
        return f.read()


@pytest.fixture
def ring_cluster():
    return load(os.path.join(GOLDEN, "inventory.yaml"))          # 3 hosts, studio-2 with 2 slots: 4 ranks


@pytest.fixture
def jaccl_cluster():
    return load_cluster(os.path.join(GOLDEN, "inventory-jaccl.yaml"))


def test_ring_hostfile_matches_golden_ports_go_up_per_connection_and_rank(ring_cluster):
    assert ring_hostfile_json(ring_cluster, 32323, 2) + "\n" == golden("mlx_ring_hostfile.json")
    assert json.loads(ring_hostfile_json(ring_cluster, 40000, 1))[3] == ["192.168.10.3:40003"]
    assert ring_env(2, "/tmp/h.json") == {"MLX_RANK": "2", "MLX_HOSTFILE": "/tmp/h.json"}


def test_ring_hostfile_of_one_rank_is_empty_and_a_host_without_address_is_refused(ring_cluster):
    first = ring_cluster.hosts[0]
    assert ring_hostfile_json(Cluster("i.yaml", (first,)), 32323, 1) == ""
    with pytest.raises(ValueError, match="x has no `address`"):
        ring_hostfile_json(Cluster("i.yaml", (first, Host(name="x", rank=1, line=9))), 32323, 1)


def test_ibv_devices_and_jaccl_env_match_golden(jaccl_cluster):
    assert ibv_devices_json(jaccl_cluster) + "\n" == golden("mlx_ibv_devices.jaccl.json")
    expected = json.loads(golden("mlx_env.jaccl.json"))
    assert [jaccl_env(jaccl_cluster, r, expected["port"], expected["devices_path"]) for r in range(3)] == \
        expected["ranks"]
    assert jaccl_env(jaccl_cluster, 1, 32323, DEVICES_PATH, ring=True)["MLX_JACCL_RING"] == "1"


def test_jaccl_pairs_all_pairs_or_ring_neighbours():
    assert jaccl_pairs(3) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    assert jaccl_pairs(4, ring=True) == [(0, 3), (0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (3, 0)]
    assert jaccl_pairs(2, ring=True) == [(0, 1), (1, 0)] and jaccl_pairs(1) == []


def test_jaccl_hostfile_matches_golden(jaccl_cluster):
    assert render(jaccl_cluster, "mlx", rdma=True) == golden("hostfile.jaccl.json")
    assert json.loads(backends.get("jaccl").hostfile(jaccl_cluster))["hosts"] == \
        json.loads(golden("hostfile.jaccl.json"))["hosts"]
    assert rank_ips(jaccl_cluster) == [["192.168.10.1"], ["192.168.10.2"], ["192.168.10.3"]]


# ---- the same, asked of mlx.launch itself ---------------------------------------------------------

def _mlx_launch(monkeypatch, tmp_path, hostfile_text: str, backend: str, **options):
    """What mlx.launch's launch_<backend> would hand each rank: (files, env) of its first RemoteProcess."""
    launch = pytest.importorskip("mlx._distributed_utils.launch")
    common = pytest.importorskip("mlx._distributed_utils.common")
    path = tmp_path / "hosts.json"
    path.write_text(hostfile_text)
    hosts = common.Hostfile.from_file(str(path)).hosts
    recorded = []
    monkeypatch.setattr(launch, "_launch_with_io", lambda cls, arguments, verbose: recorded.extend(arguments))

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise AssertionError(f"mlx.launch refused it: {message}")

    args = argparse.Namespace(backend=backend, env=[], cwd=None, verbose=False, python=None,
                              **{"starting_port": 32323, "connections_per_ip": 1, **options})
    {"ring": launch.launch_ring, "jaccl": launch.launch_jaccl}[backend](Parser(), hosts, args, ["t.py"])
    # each entry: ((rank, ssh host, python, cwd, files, env, command), {})
    return [(a[0][4], a[0][5]) for a in recorded]


def test_mlx_launch_gives_jaccl_ranks_what_our_builders_give(monkeypatch, tmp_path, jaccl_cluster):
    ranks = _mlx_launch(monkeypatch, tmp_path, render(jaccl_cluster, "mlx", rdma=True), "jaccl", starting_port=40000)
    assert len(ranks) == 3
    for rank, (files, env) in enumerate(ranks):
        assert files == {"MLX_IBV_DEVICES": ibv_devices_json(jaccl_cluster)}
        ours = jaccl_env(jaccl_cluster, rank, 40000, DEVICES_PATH)
        assert f"MLX_JACCL_COORDINATOR={ours['MLX_JACCL_COORDINATOR']}" in env


def test_mlx_launch_gives_ring_ranks_what_our_builders_give(monkeypatch, tmp_path, ring_cluster):
    ranks = _mlx_launch(monkeypatch, tmp_path, render(ring_cluster, "mlx"), "ring", connections_per_ip=2)
    assert len(ranks) == 4
    assert all(files == {"MLX_HOSTFILE": ring_hostfile_json(ring_cluster, 32323, 2)} for files, _ in ranks)
