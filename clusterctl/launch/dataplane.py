"""The data plane between the hosts, asked directly: every host at once listens on its address and ring port and
connects to those of the hosts its ranks must reach (hosts/scripts/dataplane.py), so what is asked is exactly what
the ring's ranks will do. `clusterctl doctor` reports it; a restart after a data-plane fault waits on it.

    peers(cluster)                       # host -> the hosts it must reach
    results = probe(cluster, hosts, run, budget_s)   # host -> its probe's JSON (None: it did not run)
    broken(cluster, results)             # ["h1 -> h2 (10.0.0.2:32324): [Errno 113] No route to host", ...]
    waited = wait_until_up(connector, limit_s, down=..., clock=...)   # seconds until it answered; None: not in time

A restart after an attempt that failed because the link between its hosts dropped (a stall with every rank waiting
in a collective, or ranks that could not connect to each other) waits until every host reaches the others again,
asking every POLL_S seconds up to --data-plane-wait, instead of relaunching into a dead link, where every attempt
would fail at once and use up the restarts the run has.
"""
from __future__ import annotations

import time
from typing import Callable

from ..hosts.connector import Connector
from ..hosts.facts import ring_port
from ..hosts.fanout import run_all
from ..hosts.probe import DataplaneSpec, dataplane_command, parse_probe
from ..inventory import Cluster, Host
from . import backends

POLL_S = 5.0              # between two probes while the link is down
MIN_BUDGET_S = 3.0        # each probe's own time to listen and connect


def peers(cluster: Cluster) -> dict[str, list[str]]:
    """The hosts whose address and ring port each host's data-plane probe connects to: every other host, or, for a
    backend whose ranks only talk to their ring neighbours, the next host in inventory order (a ring rank connects
    to the next rank's address and accepts from the previous one, so a Thunderbolt ring's addresses, each on the
    cable from the host before, are reachable from exactly there: docs/facts/macos.md#thunderbolt-addresses)."""
    names = [h.name for h in cluster.hosts]
    if backends.get(cluster.launch.backend).neighbours_only:
        return {name: [names[(i + 1) % len(names)]] if len(names) > 1 else [] for i, name in enumerate(names)}
    return {name: [n for n in names if n != name] for name in names}


def askable(cluster: Cluster) -> bool:
    """Whether there is a data plane to ask: several hosts, each with its data-plane `address`."""
    return len(cluster.hosts) > 1 and all(h.address for h in cluster.hosts)


def probe(cluster: Cluster, hosts: list[Host], run: Callable[[Host, str, float], object], budget_s: float) -> dict:
    """Every host of `hosts` at once: listen on its ring port, connect to its peers' among `hosts`. host -> the probe's
    JSON (address, port, bind error, connect results), or None where it did not run. `run(host, command, timeout)`
    runs a command there and returns what has .stdout."""
    per_ip = cluster.launch.connections_per_ip
    wanted = peers(cluster)
    present = {h.name for h in hosts}

    def ask(host: Host):
        spec = DataplaneSpec(host.name, host.address, ring_port(host, per_ip), budget_s,
                             tuple((q.name, q.address, ring_port(q, per_ip)) for q in hosts
                                   if q.name in wanted[host.name] and q.name in present))
        return run(host, dataplane_command(host.python, spec), budget_s + 10)

    group = run_all(hosts, ask, deadline=budget_s + 15)
    out: dict[str, dict | None] = {}
    for host in hosts:
        outcome = group[host.name]
        out[host.name] = parse_probe(outcome.value.stdout).dataplane if outcome.error is None else None
    return out


def broken(cluster: Cluster, results: dict) -> list[str]:
    """What did not work, one phrase each (pure): a host whose probe did not run, a port it could not listen on, a
    connection that failed."""
    by_name = {h.name: h for h in cluster.hosts}
    per_ip = cluster.launch.connections_per_ip
    out = []
    for name, result in results.items():
        if result is None:
            out.append(f"{name}: the probe did not run")
            continue
        if result.get("bind"):
            out.append(f"{name} cannot listen on {result.get('address')}:{result.get('port')}: {result['bind']}")
        for peer, got in result.get("connect", {}).items():
            if not got.get("ok"):
                target = by_name.get(peer)
                where = f" ({target.address}:{ring_port(target, per_ip)})" if target is not None else ""
                out.append(f"{name} -> {peer}{where}: {got.get('error')}")
    return out


def wait_until_up(connector: Connector, limit_s: float, down: Callable[[list[str]], None],
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Ask the data plane of the connector's hosts until every host reaches the ones it must, at most `limit_s`
    seconds: the seconds it took (0.0: it answered at once), or None when it still did not. `down(broken)` is told
    once, the first time it does not answer."""
    cluster = connector.cluster
    if not askable(cluster):
        return 0.0
    budget = max(MIN_BUDGET_S, connector.connect_timeout)

    def run(host: Host, command: str, timeout: float):
        with connector.transport(host) as t:
            return t.run(command, timeout=timeout)

    began = clock()
    told = False
    while True:
        failing = broken(cluster, probe(cluster, list(cluster.hosts), run, budget))
        if not failing:
            return clock() - began
        if not told:
            down(failing)
            told = True
        if clock() - began + POLL_S > limit_s:
            return None
        sleep(POLL_S)
