"""Glue between an inventory and transports: open the right transport for each host (local or SSH) and fan
out one command to every host."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..inventory import Cluster, Host
from .fanout import GroupResult, run_all
from .ssh import SSHTransport
from .sshconfig import SSHTarget, resolve_cluster
from .transport import DEFAULT_CONNECT_TIMEOUT_S, LocalTransport, Transport

# Extra time the fan-out deadline allows beyond connect + command timeouts, for the kill grace period.
DEADLINE_SLACK_S = 5.0


class Connector:
    """Opens transports for a cluster's hosts with one host-key policy and connect timeout."""

    def __init__(self, cluster: Cluster, host_key_checking: str | None = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                 targets: Mapping[str, SSHTarget] | None = None):
        self.cluster = cluster
        self.host_key_checking = host_key_checking or cluster.host_key_checking
        self.connect_timeout = connect_timeout
        self.targets = dict(targets) if targets is not None else resolve_cluster(cluster)

    def transport(self, host: Host) -> Transport:
        return for_host(host, self.targets[host.name], self.host_key_checking, self.connect_timeout)

    def run_everywhere(self, command: str | Sequence[str], timeout: float, *,
                       env: Mapping[str, str] | None = None, cwd: str | None = None,
                       hosts: Sequence[Host] | None = None, deadline: float | None = None) -> GroupResult:
        """Run one command on every host (or `hosts`) at once; one outcome per host, in rank order."""
        def one(host: Host):
            with self.transport(host) as t:
                return t.run(command, timeout, env=env, cwd=cwd)

        if deadline is None:
            deadline = self.connect_timeout + timeout + DEADLINE_SLACK_S
        return run_all(hosts if hosts is not None else self.cluster.hosts, one, deadline)


def for_host(host: Host, target: SSHTarget | None = None, host_key_checking: str = "accept-new",
             connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> Transport:
    """The transport for an inventory host: local for `local: true`, SSH otherwise."""
    if host.local:
        return LocalTransport(host.name)
    if target is None:
        raise ValueError(f"{host.name}: an SSH host needs its resolved SSHTarget")
    return SSHTransport(target, host_key_checking, connect_timeout)
