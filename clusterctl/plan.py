"""What a launch needs to know about the hosts, found the way doctor finds it: the environment every rank
gets (libmpi location for MLX, then the inventory's env, which wins) and the subnet to pin MPI to."""
from __future__ import annotations

from dataclasses import dataclass, field

from .doctor import checks
from .doctor.checks import HostProbe
from .doctor.probe import parse_probe, probe_script
from .errors import ConnectError
from .fanout import run_all
from .inventory import Cluster
from .remote import Connector


@dataclass(frozen=True)
class LaunchPlan:
    env: dict[str, str] = field(default_factory=dict)
    if_include: str | None = None


def plan_from_probes(cluster: Cluster, probes: list[HostProbe]) -> LaunchPlan:
    first = probes[0]
    env = dict(cluster.hosts[0].env_dict)
    libmpi = checks.choose_libmpi(first.facts) if first.facts is not None else None
    if libmpi:
        env = {**checks.libmpi_env(first.facts.get("os"), libmpi), **env}   # the inventory's env wins
    subnet = checks.shared_subnet(probes)
    return LaunchPlan(env, cluster.mpi.if_include or (str(subnet) if subnet else None))


def discover(connector: Connector, timeout: float = 30.0) -> LaunchPlan:
    """Probe every host at once (no peer checks) and plan from what they report."""
    cluster = connector.cluster

    def probe(host):
        script = probe_script(python=host.python, workdir=host.workdir, mpi_lib_dir=host.mpi_lib_dir, peers=[],
                              ssh_options=[], ssh_config=None, mpi_libname=host.env_dict.get("MLX_MPI_LIBNAME"))
        with connector.transport(host) as t:
            return HostProbe(host, parse_probe(t.run(script, timeout=timeout).stdout))

    group = run_all(cluster.hosts, probe, deadline=connector.connect_timeout + timeout + 5)
    if group.failed:
        name, outcome = next(iter(group.failed.items()))
        raise ConnectError(name, str(outcome.error).removeprefix(f"{name}: ") +
                           " (run `clusterctl doctor` for the whole picture)")
    return plan_from_probes(cluster, [o.value for o in group.values()])
