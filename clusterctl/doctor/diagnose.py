"""clusterctl doctor's run: everything that breaks a distributed MLX job, checked in one round trip per host.

    run_doctor(connector, DoctorOptions()) -> Report     # connector: Connector(cluster, connect_timeout=...)

1. Every host at once (fan-out, per-host deadline): connect (the controller -> host SSH check) and run the
   probe (probe.py), which itself checks SSH to every peer (docs/facts/ssh.md#all-to-all-ssh) and TCP to every
   peer's data-plane address.
2. Pure checks over the parsed facts (checks.py).
3. With deep checks on (the default when mpirun exists here) and every host healthy enough: the MPI smoke
   test through mpirun and, when hosts have addresses, the ring smoke test through mlx.launch (smoke.py).
"""
from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import ClusterctlError
from ..hosts.connector import Connector
from ..hosts.facts import choose_libmpi
from ..hosts.fanout import run_all
from ..hosts.probe import HostProbe, parse_probe, probe_script
from ..hosts.transport import read_until
from ..inventory import Cluster, Host
from ..launch import backends, dataplane
from ..launch.plan import plan_from_probes
from . import checks, smoke
from .options import LM_PACKAGE, DoctorOptions, version_here
from .report import CLUSTER, WARN, Finding, Report

PROBE_SLACK_S = 15.0      # beyond the connect timeout: python + mlx import, mpirun --version, df
MESH_PER_PEER_S = 1.0     # and per peer: each host logs in to all the others (hosts/probe.py MESH_AT_ONCE at a time)
PROGRESS_SLACK_S = 5.0    # a probe still reporting logins past its budget: how long after its last line it may go on


def probe_budget(connect_timeout: float, peers: int) -> float:
    """How long one host's probe may run: it grows with the logins it starts (N - 1 of them)."""
    return connect_timeout + PROBE_SLACK_S + MESH_PER_PEER_S * peers


def probe_limits(connect_timeout: float, peers: int) -> tuple[float, float, float]:
    """(budget, progress_s, cap) for read_until. Past its budget a probe goes on while it keeps reporting:
    a login finishes within the connect timeout or fails, so a probe silent for longer than that (and some
    slack) is stuck, while one whose logins are merely slow (16 hosts sharing two cores) is let finish, up
    to every login taking the whole connect timeout. A dead host is named as quickly as before: its own
    probe fails at connecting, and the others' logins to it end within the connect timeout."""
    budget = probe_budget(connect_timeout, peers)
    return budget, connect_timeout + PROGRESS_SLACK_S, budget + peers * connect_timeout


def run_doctor(connector: Connector, options: DoctorOptions = DoctorOptions()) -> Report:
    """Diagnose the connector's cluster, reaching its hosts with the connector's settings."""
    start = time.monotonic()
    phases: dict[str, float] = {}
    cluster = connector.cluster
    probes = _probe_all(connector, phases)

    findings: list[Finding] = []
    for p in probes:
        t = connector.targets[p.host.name]
        findings.append(checks.controller_ssh(p, f"{t.user}@{t.hostname}:{t.port}"))
        findings += checks.probe_time(p)
    findings += checks.ssh_mesh(probes)
    lm_here = version_here(LM_PACKAGE)
    for p in probes:
        findings += checks.host_software(p, cluster.launch.backend) + checks.mlx_lm(p, lm_here)
    findings += checks.parity(probes, lm_here)
    for p in probes:
        findings += checks.libmpi(p, cluster.launch.backend)
    findings += checks.dataplane(probes, cluster)
    for p in probes:
        findings += (checks.disk(p) + checks.workdir_write(p) + checks.clock(p) + checks.macos(p, cluster)
                     + checks.power(p) + checks.jaccl(p, cluster))
    t0 = time.monotonic()
    findings += _deep(connector, probes, findings, options)
    phases["smoke"] = time.monotonic() - t0
    return Report([h.name for h in cluster.hosts], findings, time.monotonic() - start, phases)


def _probe_all(connector: Connector, phases: dict[str, float]) -> list[HostProbe]:
    """Phase 1, every host at once: connect, run the probe. Phase 2, on the hosts that answered, at once:
    the TCP data-plane probe over the same connections."""
    cluster = connector.cluster
    names = [h.name for h in cluster.hosts]
    budget, progress_s, cap = probe_limits(connector.connect_timeout, len(names) - 1)
    transports = {}

    def probe(host: Host) -> HostProbe:
        script = probe_script(python=host.python, workdir=host.workdir, mpi_lib_dir=host.mpi_lib_dir,
                              peers=[n for n in names if n != host.name],
                              mesh_config=connector.host_config_text(host),
                              ssh_config=cluster.ssh_config, mpi_libname=host.env_dict.get("MLX_MPI_LIBNAME"),
                              rdma=backends.get(cluster.launch.backend).rdma is not None)
        sent = time.time()
        transport = transports[host.name] = connector.transport(host)
        t0 = time.monotonic()
        transport.open()
        connect_ms = None if transport.is_local else (time.monotonic() - t0) * 1000
        lines: queue.Queue = queue.Queue()
        out, _, finished = read_until(transport.stream(script, lines), lines, budget, progress_s, cap)
        # a probe that ran past its budget hands back what it had finished: slow, not unreachable
        return HostProbe(host, parse_probe("\n".join(out)), connect_ms=connect_ms, sent_at=sent,
                         received_at=time.time(), overran_s=None if finished else budget)

    try:
        t0 = time.monotonic()
        group = run_all(cluster.hosts, probe, deadline=connector.deadline(cap))
        phases["probe"] = time.monotonic() - t0
        probes = []
        for name, outcome in group.items():
            if outcome.error is not None:
                message = str(outcome.error)
                if isinstance(outcome.error, ClusterctlError) and message.startswith(f"{name}: "):
                    message = message[len(name) + 2:]
                probes.append(HostProbe(outcome.host, error=message, error_reason=getattr(outcome.error, "reason", None)))
            else:
                probes.append(outcome.value)
        t0 = time.monotonic()
        _dataplane_phase(connector, probes, transports)
        phases["data-plane"] = time.monotonic() - t0
        return probes
    finally:
        for transport in transports.values():
            transport.close()


def _dataplane_phase(connector: Connector, probes: list[HostProbe], transports: dict) -> None:
    """The data-plane probe (launch/dataplane.py) on the hosts whose python answered, over their open connections."""
    cluster = connector.cluster
    if not dataplane.askable(cluster):
        return
    live = {p.host.name: p for p in probes if p.facts is not None and p.facts.get("python_path")}
    results = dataplane.probe(cluster, [p.host for p in live.values()],
                              lambda host, command, timeout: transports[host.name].run(command, timeout=timeout),
                              max(dataplane.MIN_BUDGET_S, connector.connect_timeout))
    for name, result in results.items():
        if result is not None:
            live[name].facts.dataplane = result


def smoke_tests(cluster: Cluster) -> tuple[list[backends.Backend], bool]:
    """The backends whose smoke tests the deep checks run on `cluster`, and whether those checks run by
    default. Each registered backend whose test fits the cluster and whose launcher is installed here (then
    they run by default), and the inventory's own backend's even without its launcher (its finding says so)."""
    fits = [b for b in backends.REGISTRY.values() if b.smoke_ready(cluster)]
    here = [b for b in fits if b.launcher_here() is not None]
    return [b for b in fits if b in here or b.name == cluster.launch.backend], bool(here)


def _deep(connector: Connector, probes: list[HostProbe], findings: list[Finding], options: DoctorOptions) -> list[Finding]:
    cluster = connector.cluster
    tests, by_default = smoke_tests(cluster)
    if not (options.deep if options.deep is not None else by_default):
        return []
    broken = [p.host.name for p in probes if p.facts is None]
    basics = ("ssh", "ssh-mesh", "python", "mlx")
    # libmpi is not a prerequisite: its search is a heuristic, and the smoke test is the real answer
    skipped, chosen = [], []
    for backend in tests:
        prerequisites = basics + backend.smoke.needs
        bad = broken or sorted({f.host for f in findings if f.status == "fail" and f.check in prerequisites})
        if bad:
            skipped.append(Finding(f"{backend.name}-smoke", CLUSTER, WARN, f"not run: {', '.join(bad)} failed the "
                                   "checks above", "fix the failures above, then run doctor again"))
        else:
            chosen.append(backend)
    if not chosen:
        return skipped

    plan = plan_from_probes(cluster, probes)
    libmpi = choose_libmpi(probes[0].facts)
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = [pool.submit(smoke.run_smoke, connector, b, plan, timeout=options.smoke_timeout,
                            libmpi_hint=libmpi if b.needs_mpi else None) for b in chosen]
        return skipped + [j.result() for j in jobs]
