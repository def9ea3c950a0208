import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from sshcluster import SSHCluster  # noqa: E402


@pytest.fixture
def make_cluster(tmp_path_factory):
    """Start real sshd hosts: `make_cluster(4)` -> a started SSHCluster; all stopped after the test."""
    clusters = []

    def make(size: int, **kwargs) -> SSHCluster:
        root = tmp_path_factory.mktemp(f"cluster{size}-")
        cluster = SSHCluster(root, size, **kwargs).start()
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop_all()
