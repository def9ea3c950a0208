"""The test cluster itself: it must fail loudly rather than hand out a host that is not there
(docs/facts/test-cluster.md#fail-on-sshd-bind-error)."""
import socket

import pytest
from sshcluster import SSHCluster, requires_private_roots

pytestmark = pytest.mark.ssh


def test_fixture_fails_loudly_when_sshd_cannot_bind(tmp_path):
    cluster = SSHCluster(tmp_path, 2)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((cluster.host(2).address, 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        real_start = cluster.start_host

        def start_host(index):
            if index == 2:
                cluster.host(2).port = port      # the port is taken: sshd cannot bind
            real_start(index)

        cluster.start_host = start_host
        with pytest.raises(RuntimeError) as info:
            cluster.start()
    message = str(info.value)
    assert f"sshd for h2 did not come up on {cluster.host(2).address}:{port}" in message
    assert "Address already in use" in message or "Cannot bind" in message
    assert all(h.proc is None for h in cluster.hosts)    # h1 was torn down too


def test_private_roots_hold_different_files_at_the_same_path(make_cluster):
    cluster = make_cluster(2)
    requires_private_roots(cluster, "this is the test of the private roots themselves")
    assert cluster.ssh(1, f"echo one > {cluster.host_root}/f").returncode == 0
    assert cluster.ssh(2, f"echo two > {cluster.host_root}/f").returncode == 0
    assert cluster.ssh(1, f"cat {cluster.host_root}/f").stdout == "one\n"
    assert cluster.ssh(2, f"cat {cluster.host_root}/f").stdout == "two\n"
    assert not (cluster.host_root / "f").exists()          # and neither leaked to this machine
