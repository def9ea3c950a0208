"""CLI commands against the real loopback sshd cluster."""
import json

import pytest
from clirun import clusterctl

pytestmark = pytest.mark.ssh


def test_hosts_resolves_through_the_inventorys_ssh_config(make_cluster):
    cluster = make_cluster(3)
    r = clusterctl("hosts", "--json", "--hosts", str(cluster.inventory))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["world_size"] == 3
    for i, row in enumerate(doc["hosts"], 1):
        assert row["name"] == f"h{i}" and row["user"] == "root"
        assert row["connect"] == f"{cluster.host(i).address}:{cluster.host(i).port}"   # HostName + Port from ssh_config
        assert row["identity_file"] == str(cluster.client_key)
        assert row["workdir"] == cluster.workdir
    table = clusterctl("hosts", "--hosts", str(cluster.inventory))
    assert table.stdout.splitlines()[2].split()[:4] == ["1", "h2", f"{cluster.host(2).address}:{cluster.host(2).port}", "root"]


def test_exec_over_ssh_with_one_host_down(make_cluster):
    cluster = make_cluster(3)
    cluster.stop_host(2)
    r = clusterctl("exec", "--hosts", str(cluster.inventory), "--connect-timeout", "3", "--", "echo", "up")
    assert r.returncode == 1
    assert r.stdout == "[0 h1] up\n[2 h3] up\n"
    assert f"[1 h2] error: connection refused at {cluster.host(2).address}" in r.stderr
    assert r.stderr.endswith("2 ok, 1 failed\n")
