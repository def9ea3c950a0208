"""Which Thunderbolt cables join which Macs, and the data-plane plan for them (pure: tested on canned outputs).

What each Mac reports (setup/network.py gathers it with hosts/scripts/network.sh):
- `system_profiler SPThunderboltDataType -json`: one entry per Thunderbolt bus (one port each on Apple silicon),
  with the bus's `domain_uuid_key`, its port number (`receptacle_1_tag.receptacle_id_key`) and, under `_items`,
  what is plugged in. Another Mac appears there with *its* bus's `domain_uuid_key`; a drive or a dock has none.
  So a cable is two ports, on two Macs, each naming the other's domain (docs/facts/macos.md#thunderbolt-topology).
- `networksetup -listallhardwareports`: the network interface of each port ("Hardware Port: Thunderbolt 2",
  "Device: en3"); `ifconfig -a`: its addresses and bridge0's members; `ibv_devices`: the RDMA devices, rdma_enN
  going with interface enN.

The plan follows MLX's recipe (docs/facts/macos.md#thunderbolt-addresses): the Thunderbolt Bridge out of the way,
every cable its own small subnet (a /30: one address each end), then per backend
- ring: each host's `address` is its end of the cable to the host before it (rank order is inventory order: a
  rank connects to the next rank's address and accepts from the previous one);
- jaccl (every pair cabled): each host's `rdma` names, per rank, the device of the cable to that
  rank; `address` stays an address every host reaches (rank 0's is the coordinator): the one already in the
  inventory, else the one this machine's SSH connection reached the host at.
"""
from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, field

from ..hosts.facts import bridge_members, interfaces
from ..launch import backends



def _first(test) -> str:
    return next(name for name, b in backends.REGISTRY.items() if test(b))


# What the plan can be for, by capability (tests/unit/test_registry_owns_backends.py): a ring over the cables (each
# rank talks to its neighbours) and an RDMA mesh (jaccl: a device to every rank)
RING = _first(lambda b: b.neighbours_only)
MESH = _first(lambda b: b.rdma == "mesh")
BACKENDS = (RING, MESH)
DEFAULT_SUBNET = "10.99.0.0/16"
CABLE_PREFIX = 30                    # a subnet per cable: two usable addresses


@dataclass(frozen=True)
class Port:
    """One Thunderbolt port of a Mac, as system_profiler reports its bus."""
    receptacle: str                  # the port's number ("Thunderbolt 2" in networksetup)
    domain: str                      # this bus's domain UUID
    peer_domain: str | None = None   # the domain of the Mac at the other end of its cable
    peer_model: str | None = None    # that Mac's model as reported ("Mac mini")
    speed: str | None = None         # "80 Gb/s", or "Up to 120 Gb/s" when nothing is plugged in
    other_device: str | None = None  # something else plugged in (a drive, a dock)


def parse_thunderbolt(text: str) -> list[Port]:
    """The ports in `system_profiler SPThunderboltDataType -json` output. ValueError when it is not that."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"system_profiler printed no JSON ({e})") from None
    buses = doc.get("SPThunderboltDataType") if isinstance(doc, dict) else None
    if not isinstance(buses, list):
        raise ValueError("system_profiler's JSON has no SPThunderboltDataType list")
    ports = []
    for bus in buses:
        if not isinstance(bus, dict) or not isinstance(bus.get("domain_uuid_key"), str):
            continue
        tag = next((v for k, v in sorted(bus.items()) if re.fullmatch(r"receptacle_\d+_tag", k) and isinstance(v, dict)
                    and v.get("receptacle_id_key")), None)
        if tag is None:
            continue
        items = [i for i in bus.get("_items") or [] if isinstance(i, dict)]
        macs = [i for i in items if isinstance(i.get("domain_uuid_key"), str)]
        others = [i for i in items if i not in macs]
        ports.append(Port(receptacle=str(tag["receptacle_id_key"]), domain=bus["domain_uuid_key"],
                          peer_domain=macs[0]["domain_uuid_key"] if macs else None,
                          peer_model=(macs[0].get("_name") or macs[0].get("device_name_key")) if macs else None,
                          speed=tag.get("current_speed_key"),
                          other_device=(others[0].get("_name") or others[0].get("device_name_key")) if others else None))
    return sorted(ports, key=lambda p: _natural(p.receptacle))


def parse_hardware_ports(text: str) -> dict[str, str]:
    """`networksetup -listallhardwareports`: {"Thunderbolt 1": "en2", "Ethernet": "en0", ...}."""
    ports, name = {}, None
    for line in text.splitlines():
        if line.startswith("Hardware Port:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Device:") and name is not None:
            ports[name] = line.split(":", 1)[1].strip()
            name = None
    return ports


def _natural(text: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


@dataclass
class MacReport:
    """What one host said about its network (setup/network.py parses network.sh's output into this)."""
    name: str
    ports: list[Port]
    hardware_ports: dict[str, str]
    ifconfig: list[str]                       # `ifconfig -a` lines
    rdma_devices: list[str] = field(default_factory=list)
    rdma_state: str = "unknown"               # `rdma_ctl status`: enabled, disabled, unknown
    ssh_ip: str | None = None                 # the address this machine's connection reached it at
    address: str | None = None                # its `address` in the inventory now
    slots: int = 1

    def iface(self, port: Port) -> str | None:
        return self.hardware_ports.get(f"Thunderbolt {port.receptacle}")

    @property
    def addresses(self) -> list[tuple[str, ipaddress.IPv4Interface]]:
        return interfaces(self.ifconfig)

    @property
    def bridged(self) -> list[str]:
        return bridge_members(self.ifconfig)


@dataclass(frozen=True)
class Cable:
    a: str
    a_iface: str
    b: str
    b_iface: str
    speed: str | None = None

    def end(self, host: str) -> str:
        return self.a_iface if host == self.a else self.b_iface


@dataclass
class Topology:
    hosts: list[str]                                  # inventory order
    cables: list[Cable]
    notes: list[str] = field(default_factory=list)    # ports that join nothing usable, and why

    def between(self, x: str, y: str) -> list[Cable]:
        return [c for c in self.cables if {c.a, c.b} == {x, y}]

    def full_mesh(self) -> bool:
        n = len(self.hosts)
        return n > 1 and all(self.between(self.hosts[i], self.hosts[j]) for i in range(n) for j in range(i + 1, n))

    def ring_in_order(self) -> bool:
        """Whether each host is cabled to the next in inventory order (and the last to the first)."""
        n = len(self.hosts)
        return n > 1 and all(self.between(self.hosts[i], self.hosts[(i + 1) % n]) for i in range(n))

    def some_ring(self) -> list[str] | None:
        """A cycle through every host, starting at the first (None when the cables form none)."""
        n = len(self.hosts)
        if n < 2:
            return None
        if n == 2:
            return list(self.hosts) if self.between(*self.hosts) else None

        def extend(path: list[str]) -> list[str] | None:
            if len(path) == n:
                return path if self.between(path[-1], path[0]) else None
            for h in self.hosts:
                if h not in path and self.between(path[-1], h):
                    found = extend(path + [h])
                    if found:
                        return found
            return None

        return extend([self.hosts[0]])

    def missing(self) -> list[tuple[str, str]]:
        n = len(self.hosts)
        return [(self.hosts[i], self.hosts[j]) for i in range(n) for j in range(i + 1, n)
                if not self.between(self.hosts[i], self.hosts[j])]


def topology(reports: list[MacReport]) -> Topology:
    """The cables between the inventory's Macs: two ports that name each other's domain."""
    owner: dict[str, tuple[MacReport, Port]] = {}
    for r in reports:
        for p in r.ports:
            owner[p.domain] = (r, p)
    cables, notes, seen = [], [], set()
    for r in reports:
        for p in r.ports:
            if p.peer_domain is None:
                if p.other_device:
                    notes.append(f"{r.name}: Thunderbolt {p.receptacle} holds {p.other_device}, not a Mac")
                continue
            if p.peer_domain not in owner:
                notes.append(f"{r.name}: Thunderbolt {p.receptacle} is cabled to a Mac that is not in the inventory"
                             + (f" ({p.peer_model})" if p.peer_model else ""))
                continue
            peer, their = owner[p.peer_domain]
            if peer.name == r.name or frozenset((p.domain, their.domain)) in seen:
                continue
            seen.add(frozenset((p.domain, their.domain)))
            mine, theirs = r.iface(p), peer.iface(their)
            if mine is None or theirs is None:
                who, port = (r, p) if mine is None else (peer, their)
                notes.append(f"{who.name}: networksetup lists no interface for Thunderbolt {port.receptacle} "
                             "(its port is cabled, but no network service uses it)")
                continue
            cables.append(Cable(r.name, mine, peer.name, theirs, p.speed))
    order = {r.name: i for i, r in enumerate(reports)}
    cables = [c if order[c.a] < order[c.b] else Cable(c.b, c.b_iface, c.a, c.a_iface, c.speed) for c in cables]
    cables.sort(key=lambda c: (order[c.a], order[c.b], _natural(c.a_iface)))
    return Topology([r.name for r in reports], cables, notes)


class PlanError(Exception):
    """The cables or the Macs cannot carry the backend asked for: one line, the cause and the fix."""


@dataclass
class Plan:
    backend: str
    why: str                                          # why this backend, for the report
    topology: Topology
    subnets: dict[Cable, tuple[ipaddress.IPv4Interface, ipaddress.IPv4Interface]]   # (a's end, b's end)
    address: dict[str, str]                           # host -> its inventory `address`
    rdma: dict[str, list[str | None]] | None          # host -> its inventory `rdma` list (jaccl)
    commands: dict[str, list[str]]                    # host -> what --apply runs there, in order

    def end(self, cable: Cable, host: str) -> ipaddress.IPv4Interface:
        a, b = self.subnets[cable]
        return a if host == cable.a else b


def gbps(speed: str | None) -> int | None:
    """A link's speed in Gb/s from system_profiler's "80 Gb/s" (None when it says no number)."""
    m = re.search(r"(\d+)\s*Gb/s", speed or "")
    return int(m.group(1)) if m else None


def choose_backend(top: Topology, reports: list[MacReport], asked: str | None) -> tuple[str, str]:
    """(backend, why): the one asked for, else jaccl when every pair of Macs is cabled, every Mac has RDMA on
    and a device for each of its cables, and every cable is a Thunderbolt 5 link (80 Gb/s: macOS lists rdma_enN
    devices for Thunderbolt 4 ports too, docs/facts/macos.md#jaccl); else ring."""
    if asked:
        return asked, "asked for"
    if not top.full_mesh():
        return RING, f"{MESH} needs a cable between every pair of Macs"
    off = [r.name for r in reports if r.rdma_state != "enabled"]
    if off:
        return RING, f"RDMA is not enabled on {', '.join(off)} (rdma_ctl status)"
    lacking = [f"{r.name} rdma_{c.end(r.name)}" for r in reports for c in top.cables
               if r.name in (c.a, c.b) and f"rdma_{c.end(r.name)}" not in r.rdma_devices]
    if lacking:
        return RING, f"ibv_devices lists no {lacking[0]}"
    slow = [c for c in top.cables if (gbps(c.speed) or 0) < 80]
    if slow:
        return RING, f"{slow[0].a}-{slow[0].b} is not a Thunderbolt 5 link ({slow[0].speed or 'speed unknown'})"
    return MESH, "every pair of Macs is cabled over Thunderbolt 5 with RDMA on"


def plan(reports: list[MacReport], backend: str | None = None, base: str = DEFAULT_SUBNET) -> Plan:
    """The data-plane plan for these Macs (inventory order). PlanError when the cables cannot carry it."""
    top = topology(reports)
    names = [r.name for r in reports]
    if len(names) < 2:
        raise PlanError("setup network needs two Macs or more in the inventory")
    if not top.cables:
        raise PlanError("no Thunderbolt cable joins two of the inventory's Macs (system_profiler shows none): "
                        "connect them, then run setup network again"
                        + (f" ({top.notes[0]})" if top.notes else ""))
    chosen, why = choose_backend(top, reports, backend)
    ring = backends.get(chosen).neighbours_only          # else an RDMA mesh (BACKENDS)
    by_name = {r.name: r for r in reports}
    if not ring and not top.full_mesh():
        a, b = top.missing()[0]
        raise PlanError(f"{chosen} needs a cable between every pair of Macs; none joins {a} and {b} "
                        f"({len(top.missing())} pair(s) missing): add it, or use --backend {RING}")
    if ring and not top.ring_in_order():
        found = top.some_ring()
        gap = next((names[i], names[(i + 1) % len(names)]) for i in range(len(names))
                   if not top.between(names[i], names[(i + 1) % len(names)]))
        if found:
            raise PlanError(f"the ranks' ring follows the inventory's host order, and no cable joins {gap[0]} and "
                            f"{gap[1]}; the cables form the ring {' -> '.join(found + found[:1])}: list the hosts "
                            "in that order, then run setup network again")
        raise PlanError(f"the cables form no ring through all {len(names)} Macs (none joins {gap[0]} and {gap[1]}): "
                        "cable each Mac to the next in inventory order and the last to the first (--dot draws them)")
    if not ring:
        many = [r.name for r in reports if r.slots != 1]
        if many:
            raise PlanError(f"{chosen} runs one rank per Mac; {many[0]} has slots: {by_name[many[0]].slots}: "
                            f"set slots: 1, or use --backend {RING}")
    subnets = allocate(top, reports, base)
    address: dict[str, str] = {}
    rdma: dict[str, list[str | None]] | None = None
    if ring:
        for i, name in enumerate(names):
            cable = top.between(names[i - 1], name)[0]
            a, b = subnets[cable]
            address[name] = str((a if cable.a == name else b).ip)
    else:
        cabled = {str(e.ip) for ends in subnets.values() for e in ends}
        for r in reports:
            keep = r.address if r.address and r.address not in cabled and not _on_thunderbolt(r, r.address) else None
            if keep is None and not r.ssh_ip:
                raise PlanError(f"{r.name} needs an `address` every Mac reaches (rank 0's is {chosen}'s coordinator; "
                                "Ethernet or Wi-Fi): add it to the inventory, then run setup network again")
            address[r.name] = keep or r.ssh_ip
        rdma = {}
        for i, r in enumerate(reports):
            row: list[str | None] = []
            for j, other in enumerate(names):
                if i == j:
                    row.append(None)
                    continue
                device = f"rdma_{top.between(r.name, other)[0].end(r.name)}"
                if device not in r.rdma_devices:
                    raise PlanError(f"{r.name} has no RDMA device {device} for its cable to {other} (ibv_devices "
                                    f"lists {', '.join(r.rdma_devices) or 'none'}): enable RDMA there (rdma_ctl "
                                    f"enable in Recovery, macOS 26.2+, Thunderbolt 5), or use --backend {RING}")
                row.append(device)
            rdma[r.name] = row
    commands = {r.name: apply_commands(r, top, subnets) for r in reports}
    return Plan(chosen, why, top, subnets, address, rdma, commands)


def _on_thunderbolt(report: MacReport, address: str) -> bool:
    tb = set(report.hardware_ports[k] for k in report.hardware_ports if k.startswith("Thunderbolt "))
    return any(name in tb and str(i.ip) == address for name, i in report.addresses)


def allocate(top: Topology, reports: list[MacReport], base: str = DEFAULT_SUBNET
             ) -> dict[Cable, tuple[ipaddress.IPv4Interface, ipaddress.IPv4Interface]]:
    """A subnet per cable. A cable whose two ends already sit in one small subnet of their own keeps it (so a
    second run changes nothing); the others get the next free /30 of `base` (one /24 each while `base` has room,
    10.99.K.1 and .2 for cable K), skipping every network any Mac already has on another interface."""
    network = ipaddress.IPv4Network(base, strict=False)
    have = {(r.name, name): i for r in reports for name, i in r.addresses}
    cable_ifaces = {(c.a, c.a_iface) for c in top.cables} | {(c.b, c.b_iface) for c in top.cables}
    taken = [i.network for r in reports for name, i in r.addresses
             if (r.name, name) not in cable_ifaces and not i.ip.is_loopback and not i.ip.is_link_local]
    out = {}
    for c in top.cables:
        a, b = have.get((c.a, c.a_iface)), have.get((c.b, c.b_iface))
        if a and b and a.network == b.network and a.ip != b.ip and a.network.prefixlen >= 24 \
                and not any(a.network.overlaps(t) for t in taken) \
                and not any(a.network.overlaps(x.network) for pair in out.values() for x in pair):
            out[c] = (a, b)
    stride = 256 if network.num_addresses >= 256 * max(1, len(top.cables)) else 4
    slot = 0
    for c in top.cables:
        if c in out:
            continue
        while True:
            start = int(network.network_address) + slot * stride
            slot += 1
            if start + 4 > int(network.broadcast_address) + 1:
                raise PlanError(f"{base} has no free /30 left for {len(top.cables)} cable(s): give --subnet a "
                                "larger range")
            net = ipaddress.IPv4Network((start, CABLE_PREFIX))
            if any(net.overlaps(t) for t in taken) or \
                    any(net.overlaps(x.network) for pair in out.values() for x in pair):
                continue
            break
        hosts = list(net.hosts())
        out[c] = (ipaddress.IPv4Interface((hosts[0], CABLE_PREFIX)), ipaddress.IPv4Interface((hosts[1], CABLE_PREFIX)))
    return {c: out[c] for c in top.cables}


def apply_commands(report: MacReport, top: Topology, subnets) -> list[str]:
    """What --apply runs on one Mac, in order (each under `sudo -n`): its cabled Thunderbolt ports out of bridge0,
    then each port's address (MLX's recipe: docs/facts/macos.md#thunderbolt-addresses). A port that already has
    exactly its address gets nothing."""
    mine = [(c.end(report.name), subnets[c][0] if c.a == report.name else subnets[c][1])
            for c in top.cables if report.name in (c.a, c.b)]
    have: dict[str, list[ipaddress.IPv4Interface]] = {}
    for name, i in report.addresses:
        have.setdefault(name, []).append(i)
    bridged = set(report.bridged)
    out = [shlex.join(["ifconfig", "bridge0", "deletem", iface]) for iface, _ in mine if iface in bridged]
    for iface, want in mine:
        if want not in have.get(iface, []):
            out.append(shlex.join(["ifconfig", iface, "inet", str(want.ip), "netmask", str(want.netmask)]))
    return out


def dot(plan_or_top: Plan | Topology) -> str:
    """The cables as a Graphviz graph (`setup network --dot | dot -Tpng > cables.png`)."""
    top = plan_or_top.topology if isinstance(plan_or_top, Plan) else plan_or_top
    q = json.dumps                                     # a JSON string is a valid DOT string (quotes escaped)
    lines = ["graph thunderbolt {", "  node [shape=box];"]
    lines += [f"  {q(h)};" for h in top.hosts]
    for c in top.cables:
        label = [f"{c.a_iface} - {c.b_iface}"]
        if isinstance(plan_or_top, Plan):
            label.append(str(plan_or_top.subnets[c][0].network))
        if c.speed:
            label.append(c.speed)
        lines.append(f"  {q(c.a)} -- {q(c.b)} [label={q(chr(10).join(label))}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
