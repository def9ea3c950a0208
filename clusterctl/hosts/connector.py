"""Glue between an inventory and transports: open the right transport for each host (local or SSH) and fan
out one command to every host.

A Connector carries the connection settings (host-key policy, connect timeout) so that code reaching hosts
takes one object instead of threading loose settings through every layer:

    connector = Connector(cluster, "strict", connect_timeout=seconds)
    others = connector.narrowed(sub_cluster)          # fewer hosts, the same settings
    connector.ssh_options()                           # what an OpenSSH client started here is given
    connector.run_dir(host, run_id)                   # where the ranks' run directory is on a host
    connector.rank_files_dir(host, run_id)            # where clusterctl's own files of a run are there
    connector.run_shared(host, command, timeout)      # one command over the OpenSSH connection runs share
"""
from __future__ import annotations

import shutil
import threading
from typing import Mapping, Sequence

from ..inventory import Cluster, Host
from ..trainer_contract import RUNS_DIR
from .fanout import GroupResult, run_all
from .openssh import host_config_text, ssh_options
from .sharedssh import SSH_FAILED, master_alive, run_shared
from .ssh import SSHTransport
from .sshconfig import SSHTarget, resolve_cluster
from .local import LocalTransport
from .transport import DEFAULT_CONNECT_TIMEOUT_S, Result, Transport

# Extra time the fan-out deadline allows beyond connect + command timeouts, for the kill grace period.
DEADLINE_SLACK_S = 5.0
# clusterctl's own files of a run on a host, relative to its workdir: the launcher's (a launch from the first
# host) and the ranks' pid and stacks files (hosts/scripts/stackdump.py, which spells it too)
RUN_FILES_DIR = ".clusterctl/runs"


def ranks_run_dir(run_id: str) -> str:
    """The ranks' run directory relative to a host's workdir (the bootstrap works in the workdir): the project's
    runs directory there, as here."""
    return f"{RUNS_DIR}/{run_id}"


class Connector:
    """Opens transports for a cluster's hosts with one host-key policy and connect timeout.

    The hosts are resolved (`ssh -G`) when the Connector is made, so a host ssh cannot use is an error
    there; with `lazy`, only when a transport is first needed (sync uses rsync and may never need one)."""

    def __init__(self, cluster: Cluster, host_key_checking: str | None = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                 targets: Mapping[str, SSHTarget] | None = None, *, lazy: bool = False):
        self.cluster = cluster
        self.host_key_checking = host_key_checking or cluster.host_key_checking
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._targets = dict(targets) if targets is not None else None
        if not lazy:
            self._resolve()

    @property
    def targets(self) -> dict[str, SSHTarget]:
        return self._resolve()

    def _resolve(self) -> dict[str, SSHTarget]:
        with self._lock:
            if self._targets is None:
                self._targets = resolve_cluster(self.cluster)
            return self._targets

    def narrowed(self, cluster: Cluster) -> Connector:
        """The same settings for `cluster`, some of this one's hosts (an elastic restart's, or those a copy
        goes to); hosts already resolved are not resolved again."""
        with self._lock:
            known = self._targets
        return Connector(cluster, self.host_key_checking, self.connect_timeout, known, lazy=True)

    def transport(self, host: Host) -> Transport:
        if host.local:
            return LocalTransport(host.name)
        return SSHTransport(self.targets[host.name], self.host_key_checking, self.connect_timeout)

    def run_shared(self, host: Host, command: str | Sequence[str], timeout: float,
                   env: Mapping[str, str] | None = None, cwd: str | None = None) -> Result:
        """`command` on `host` through OpenSSH over the master connection the run's copies and launcher use
        (hosts/sharedssh.py: no login, no key exchange here) when one is up; through the host's transport
        otherwise, and when ssh itself failed (exit 255), so that the failure is named as ever."""
        ssh = None if host.local else shutil.which("ssh")
        options = self.ssh_options() if ssh is not None else []
        if ssh is not None and master_alive(ssh, options, host.name):
            result = run_shared(ssh, options, host.name, command, timeout, env=env, cwd=cwd)
            if result.exit_code != SSH_FAILED:
                return result
        with self.transport(host) as t:
            return t.run(command, timeout, env=env, cwd=cwd)

    def ssh_options(self) -> list[str]:
        """`-F` and this machine's rendering of the inventory, for ssh, rsync -e and the launchers."""
        return ssh_options(self.cluster, self.host_key_checking, self.connect_timeout)

    def host_config_text(self, host: Host) -> str:
        """The rendering `host`'s own OpenSSH reads when it logs in to its peers."""
        return host_config_text(self.cluster, host, self.host_key_checking, self.connect_timeout)

    def deadline(self, timeout: float, slack: float = DEADLINE_SLACK_S) -> float:
        """A fan-out deadline for commands of `timeout` seconds: connecting, the command, then `slack`."""
        return self.connect_timeout + timeout + slack

    def run_dir(self, host: Host, run_id: str) -> str:
        """The ranks' run directory on `host`: <workdir>/runs/<id> (checkpoints, metrics.jsonl)."""
        return f"{host.workdir.rstrip('/')}/{ranks_run_dir(run_id)}"

    def rank_files_dir(self, host: Host, run_id: str) -> str:
        """clusterctl's files of a run on `host`: <workdir>/.clusterctl/runs/<id> (~ expanded there)."""
        return f"{host.workdir.rstrip('/')}/{RUN_FILES_DIR}/{run_id}"

    def run_everywhere(self, command: str | Sequence[str], timeout: float, *,
                       env: Mapping[str, str] | None = None, cwd: str | None = None,
                       hosts: Sequence[Host] | None = None, deadline: float | None = None) -> GroupResult:
        """Run one command on every host (or `hosts`) at once; one outcome per host, in rank order."""
        def one(host: Host):
            with self.transport(host) as t:
                return t.run(command, timeout, env=env, cwd=cwd)

        return run_all(hosts if hosts is not None else self.cluster.hosts, one,
                       deadline if deadline is not None else self.deadline(timeout))
