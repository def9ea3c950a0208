"""`clusterctl setup network`: which Thunderbolt cables join the Macs, and a data plane on them.

    result = setup_network(connector, backend=None, subnet=DEFAULT_SUBNET, write=False, apply=False)

1. gather, every host at once (hosts/scripts/network.sh): `system_profiler SPThunderboltDataType -json`,
   `networksetup -listallhardwareports`, `ifconfig -a`, `ibv_devices`, `rdma_ctl status`, whether `sudo -n`
   works, and the address this machine's SSH connection reached the host at;
2. plan (setup/topology.py, pure): the cables, a /30 per cable, the backend (jaccl on a Thunderbolt 5 mesh with
   RDMA, else ring), each host's `address` (and `rdma` list for jaccl), the commands for each Mac;
3. `write`: those into the inventory (comments kept; launch.backend too);
4. `apply`: only when every Mac runs `sudo -n` without a password (checked on all of them before any command
   runs on any), each Mac's commands under `sudo -n`, each printed before it runs; then the Macs are read again
   and every cable's two addresses checked.
Nothing here types or stores a password.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..hosts.connector import Connector
from ..hosts.facts import ibv_device_names, macos_version, rdma_state
from ..hosts import hostscript
from ..inventory import Host
from ..launch import backends
from ..inventory_edit import write_host_settings
from . import exit_code, run_script
from .topology import DEFAULT_SUBNET, MacReport, Plan, PlanError, parse_hardware_ports, parse_thunderbolt, plan

TIMEOUT_S = 60.0
IFACE = re.compile(r"[a-z]+[0-9]+")      # an interface name as macOS spells it (en2, bridge0)


@dataclass
class Gathered:
    report: MacReport | None = None
    os: str | None = None
    sudo: bool = False
    macos: str | None = None
    error: str | None = None
    unreachable: bool = False


@dataclass
class NetworkResult:
    gathered: dict[str, Gathered]
    plan: Plan | None = None
    error: str | None = None                                        # why there is no plan, or apply was refused
    inventory: list[str] = field(default_factory=list)              # what --write changed (or would)
    applied: dict[str, list[str]] = field(default_factory=dict)     # host -> commands run
    apply_errors: dict[str, str] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)                  # after --apply: addresses still missing

    @property
    def ok(self) -> bool:
        return (self.error is None and self.plan is not None and not self.apply_errors and not self.unset
                and not any(g.error for g in self.gathered.values()))

    @property
    def exit_code(self) -> int:
        return exit_code(self.ok, list(self.gathered.values()))

    def as_dict(self) -> dict:
        p = self.plan
        return {
            "ok": self.ok, "error": self.error,
            "hosts": {name: {"error": g.error, "os": g.os, "macos": g.macos, "sudo": g.sudo}
                      for name, g in self.gathered.items()},
            "backend": p.backend if p else None, "why": p.why if p else None,
            "cables": [{"a": c.a, "a_iface": c.a_iface, "b": c.b, "b_iface": c.b_iface, "speed": c.speed,
                        "a_address": str(p.subnets[c][0]), "b_address": str(p.subnets[c][1])}
                       for c in p.topology.cables] if p else [],
            "notes": p.topology.notes if p else [],
            "address": p.address if p else {}, "rdma": p.rdma if p else None,
            "commands": {h: [sudo(c) for c in cmds] for h, cmds in p.commands.items()} if p else {},
            "inventory": self.inventory, "applied": self.applied, "apply_errors": self.apply_errors,
            "unset": self.unset,
        }

    def report(self, write: bool, apply: bool) -> tuple[list[str], list[str]]:
        """(stdout lines, stderr lines): the cables, the plan, what was written and run."""
        out, err = [], []
        for name, g in self.gathered.items():
            if g.error:
                err.append(f"{name}: failed: {g.error}")
        if self.plan is None:
            if self.error:
                err.append(f"setup network: {self.error}")
            return out, err
        p = self.plan
        top = p.topology
        shape = "every pair cabled" if top.full_mesh() else "a ring" if top.ring_in_order() else "not a ring"
        out.append(f"Thunderbolt cables between {len(top.hosts)} Macs ({shape}):")
        width = max(len(h) for h in top.hosts)
        for c in top.cables:
            a, b = p.subnets[c]
            out.append(f"  {c.a:>{width}} {c.a_iface:<5} <-> {c.b_iface:>5} {c.b:<{width}}  {c.speed or '?':>9}   "
                       f"{a.ip} <-> {b.ip}  ({a.network})")
        out += [f"  note: {n}" for n in top.notes]
        out.append(f"backend: {p.backend} ({p.why})")
        if backends.get(p.backend).neighbours_only:
            names = top.hosts
            out.append(f"ring: {' -> '.join(names + names[:1])}; each host's address is its end of the cable "
                       "from the host before it")
        out.append("inventory:" if write else "inventory (--write sets):")
        for line in self.inventory:
            out.append(f"  {line}")
        if not self.inventory:
            out.append("  nothing to change")
        commands = {h: cmds for h, cmds in p.commands.items() if cmds}
        if apply:
            for h, cmds in self.applied.items():
                out += [f"  {h}: ran {c}" for c in cmds]
            for h, e in self.apply_errors.items():
                err.append(f"{h}: failed: {e}")
            err += [f"setup network: {line}" for line in self.unset]
            if not commands:
                out.append("the Macs: nothing to change")
        elif commands:
            out.append("on the Macs (--apply runs these; they last until the Mac restarts):")
            for h, cmds in commands.items():
                out += [f"  {h}: {sudo(c)}" for c in cmds]
        else:
            out.append("the Macs: nothing to change")
        if self.error:
            err.append(f"setup network: {self.error}")
        return out, err


def sudo(command: str) -> str:
    return f"sudo -n {command}"


def script(mode: str, commands: list[str] | None = None) -> str:
    return hostscript.shell("network.sh", {"MODE": mode, "CMDS": "\n".join(commands or [])})


def parse_gather(host: Host, text: str) -> Gathered:
    """network.sh's gather output on `host` -> what the plan needs."""
    values: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
        elif " " in line or line in ("os", "ssh_ip", "sudo", "macos", "rdma_ctl"):
            key, _, value = line.partition(" ")
            values[key] = value.strip()
    g = Gathered(os=values.get("os") or None, sudo=values.get("sudo") == "yes", macos=values.get("macos") or None)
    if g.os != "Darwin":
        g.error = (f"runs {g.os or 'an unknown system'}, not macOS: setup network configures Macs' Thunderbolt "
                   "ports (give this host its `address:` by hand)")
        return g
    if "end" not in sections:
        g.error = "its report stopped short (network.sh did not finish)"
        return g
    try:
        ports = parse_thunderbolt("\n".join(sections.get("system_profiler", [])))
    except ValueError as e:
        g.error = f"system_profiler SPThunderboltDataType -json: {e}"
        return g
    hardware = {k: v for k, v in parse_hardware_ports("\n".join(sections.get("networksetup", []))).items()
                if IFACE.fullmatch(v)}
    version = macos_version(g.macos or "")
    g.report = MacReport(name=host.name, ports=ports, hardware_ports=hardware, ifconfig=sections.get("ifconfig", []),
                         rdma_devices=ibv_device_names(sections.get("ibv_devices", [])),
                         rdma_state=rdma_state(values.get("rdma_ctl", "")) if version and version >= (26, 2)
                         else "unknown",
                         ssh_ip=values.get("ssh_ip") or None, address=host.address, slots=host.slots)
    return g


def gather(connector: Connector) -> dict[str, Gathered]:
    hosts = list(connector.cluster.hosts)
    done = run_script(connector, hosts, lambda h: script("gather"), TIMEOUT_S)
    out = {}
    for h in hosts:
        stdout, error, unreachable = done[h.name]
        out[h.name] = Gathered(error=error, unreachable=unreachable) if error else parse_gather(h, stdout)
    return out


def inventory_changes(connector: Connector, p: Plan) -> list[tuple[str | None, str, str]]:
    """(host or None for launch, key, YAML value) the plan puts in the inventory."""
    changes: list[tuple[str | None, str, str]] = []
    for h in connector.cluster.hosts:
        changes.append((h.name, "address", json.dumps(p.address[h.name])))
        if p.rdma is not None:
            changes.append((h.name, "rdma", rdma_yaml(p.rdma[h.name])))
    changes.append((None, "backend", p.backend))
    return changes


def rdma_yaml(rdma) -> str:
    """An inventory `rdma` list as the flow YAML --write puts on the host's line: [null, rdma_en2, [a, b]]."""
    return "[" + ", ".join("null" if d is None else d if isinstance(d, str) else rdma_yaml(d) for d in rdma) + "]"


def _describe(change: tuple[str | None, str, str], cluster) -> str | None:
    host, key, value = change
    if host is None:
        now = cluster.launch.backend
        return None if now == value else f"launch.backend: {value} (was {now})"
    h = next(x for x in cluster.hosts if x.name == host)
    if key == "address":
        now = h.address
        return None if now == json.loads(value) else f"{host}: address {json.loads(value)}" + \
            (f" (was {now})" if now else "")
    now = rdma_yaml(h.rdma) if h.rdma is not None else None
    return None if now == value else f"{host}: rdma {value}" + (f" (was {now})" if now else "")


def setup_network(connector: Connector, backend: str | None = None, subnet: str = DEFAULT_SUBNET,
                  write: bool = False, apply: bool = False, progress=None) -> NetworkResult:
    cluster = connector.cluster
    gathered = gather(connector)
    result = NetworkResult(gathered)
    if any(g.error for g in gathered.values()):
        return result
    try:
        result.plan = plan([gathered[h.name].report for h in cluster.hosts], backend, subnet)
    except PlanError as e:
        result.error = str(e)
        return result
    described = [(c, _describe(c, cluster)) for c in inventory_changes(connector, result.plan)]
    changes = [c for c, line in described if line]          # a value already so keeps its spelling
    result.inventory = [line for _, line in described if line]
    if write and result.inventory:
        write_host_settings(cluster.path, changes)
    if apply:
        _apply(connector, result, progress)
    return result


def _apply(connector: Connector, result: NetworkResult, progress) -> None:
    p = result.plan
    todo = {h: cmds for h, cmds in p.commands.items() if cmds}
    if not todo:
        return
    no_sudo = [h for h in todo if not result.gathered[h].sudo]
    if no_sudo:
        result.error = (f"--apply needs passwordless sudo and `sudo -n true` asks for a password on "
                        f"{', '.join(no_sudo)}: nothing was changed on any Mac; run the commands above there by "
                        "hand, or allow them without a password (sudoers), then run setup network --apply again")
        return
    for h, cmds in todo.items():
        for c in cmds:
            if progress:
                progress(f"{h}: {sudo(c)}")
    hosts = [h for h in connector.cluster.hosts if h.name in todo]
    done = run_script(connector, hosts, lambda h: script("apply", [sudo(c) for c in todo[h.name]]), TIMEOUT_S)
    for h in hosts:
        stdout, error, _ = done[h.name]
        result.applied[h.name] = [line[4:] for line in stdout.splitlines() if line.startswith("run ")]
        if error:
            result.apply_errors[h.name] = error
    if result.apply_errors:
        return
    # read the Macs again: every cable's two ends must now hold their addresses
    again = gather(connector)
    for c, (a, b) in p.subnets.items():
        for host, iface, want in ((c.a, c.a_iface, a), (c.b, c.b_iface, b)):
            g = again[host]
            have = [i for name, i in (g.report.addresses if g.report else []) if name == iface]
            if want not in have:
                result.unset.append(f"{host} {iface} does not show {want} after --apply (ifconfig -a)")
