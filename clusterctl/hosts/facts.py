"""Facts about hosts, derived from what their probes printed (pure functions, tested on canned outputs):
their IPv4 interfaces and the subnets they share, where libmpi is and what MLX needs to load it, the
ports the ring backend listens on, macOS's Thunderbolt bridge. Both the launch plan and doctor read them.
"""
from __future__ import annotations

import ipaddress
import re

from ..inventory import Host
from .probe import Facts, HostProbe


def libmpi_env(os_name: str, libmpi: str) -> dict[str, str]:
    """What `run` exports so that MLX finds this libmpi (docs/facts/mlx-distributed.md#mlx-mpi-libname), passed with
    mpirun -x, which SIP cannot strip (docs/facts/macos.md#sip-strips-dyld). On a Mac the fallback path: dyld
    searches it only for a library not found where it was linked, where DYLD_LIBRARY_PATH would put, say,
    Homebrew's libssl before a conda python's own (docs/facts/macos.md#dyld-fallback-library-path)."""
    var = "DYLD_FALLBACK_LIBRARY_PATH" if os_name == "Darwin" else "LD_LIBRARY_PATH"
    return {var: libmpi.rsplit("/", 1)[0], "MLX_MPI_LIBNAME": libmpi}


def rsync_label(version_line: str) -> str:
    """The first line of `rsync --version`, shortened: `rsync version 3.2.7` (rsync, 2.6.9 included), or
    `openrsync (protocol 29)` for macOS 15's openrsync, whose first line names no version of its own
    (docs/facts/macos.md#mac-rsync-output)."""
    m = re.match(r"\s*openrsync:\s*protocol version (\d+)", version_line)
    if m:
        return f"openrsync (protocol {m.group(1)})"
    return " ".join(version_line.split()[:3])


def choose_libmpi(f: Facts) -> str | None:
    found = f.all("libmpi")
    return found[0] if found else None


def bridge_members(iface_lines: list[str]) -> list[str]:
    """Interfaces that ifconfig lists as `member:` of bridge0."""
    members, current = [], None
    for line in iface_lines:
        if line and not line[0].isspace():
            current = line.split(":", 1)[0]
        elif current == "bridge0":
            m = re.match(r"\s*member:\s*(\S+)", line)
            if m:
                members.append(m.group(1))
    return members


def interfaces(iface_lines: list[str]) -> list[tuple[str, ipaddress.IPv4Interface]]:
    """(interface name, address/prefix) from `ip -o -4 addr show` or macOS `ifconfig -a` lines."""
    out, current = [], None
    for line in iface_lines:
        m = re.match(r"\d+:\s+(\S+)\s+inet\s+(\d+\.\d+\.\d+\.\d+/\d+)", line)
        if m:
            out.append((m.group(1), ipaddress.IPv4Interface(m.group(2))))
            continue
        if line and not line[0].isspace():
            current = line.split(":", 1)[0]
            continue
        m = re.match(r"\s*inet\s+(\d+\.\d+\.\d+\.\d+)\s+netmask\s+(0x[0-9a-fA-F]+|\d+\.\d+\.\d+\.\d+)", line)
        if m and current:
            mask = m.group(2)
            if mask.startswith("0x"):
                mask = str(ipaddress.IPv4Address(int(mask, 16)))
            out.append((current, ipaddress.IPv4Interface(f"{m.group(1)}/{mask}")))
    return out


def shared_subnet(probes: list[HostProbe]) -> ipaddress.IPv4Network | None:
    """The subnet every host's `address` sits in, by each host's own netmask (not interface names): what
    `run` pins MPI's traffic to (docs/facts/launchers.md#btl-tcp-if-include)."""
    nets = []
    for p in probes:
        if p.facts is None or not p.host.address:
            return None
        addr = ipaddress.IPv4Address(p.host.address)
        ifaces = interfaces(p.facts.all("iface"))
        # the interface that holds the address itself, else one whose subnet contains it (loopback)
        mine = [i.network for _, i in ifaces if i.ip == addr] or \
               [i.network for _, i in ifaces if addr in i.network]
        if not mine:
            return None
        nets.append(mine[0])
    if not nets or any(n != nets[0] for n in nets):
        return None
    return nets[0]


# docs/facts/launchers.md#mlx-launch-ring-ports
RING_STARTING_PORT = 32323   # mlx.launch's --starting-port default


def ring_port(host: Host, connections_per_ip: int = 1) -> int:
    """The first port the ring backend listens on at this host: ports go one per address and connection,
    rank after rank, from the starting port (docs/facts/launchers.md#mlx-launch-ring-ports); one address a host."""
    return RING_STARTING_PORT + host.rank * connections_per_ip


def shared_subnets(iface_lines_by_host: list[list[str]]) -> list[str]:
    """Subnets every host has an address in, each host with its own address there, loopback excluded
    (every machine has 127.0.0.1: it joins nothing). Pure, from `ip -o -4 addr` / `ifconfig -a` lines."""
    per_host = []
    for lines in iface_lines_by_host:
        nets = {}
        for _, iface in interfaces(lines):
            if not iface.ip.is_loopback and not iface.ip.is_link_local:
                nets.setdefault(iface.network, iface.ip)
        per_host.append(nets)
    if not per_host:
        return []
    common = set(per_host[0]).intersection(*per_host[1:])
    # the same address on every host (docker0's 172.17.0.1) is a private bridge on each, not a network
    return sorted(str(n) for n in common if len({nets[n] for nets in per_host}) == len(per_host))


# ---- jaccl on a Mac: docs/facts/macos.md#jaccl -----------------------------------------------------------------

JACCL_MIN_MACOS = (26, 2)    # RDMA over Thunderbolt 5 exists from macOS 26.2 (Apple TN3205)


def macos_version(text: str) -> tuple[int, ...] | None:
    """`sw_vers -productVersion` ("26.2", "15.6.1") as numbers; None when it printed no version."""
    m = re.search(r"\b(\d+)(?:\.(\d+))?(?:\.(\d+))?\b", text or "")
    return tuple(int(part) for part in m.groups() if part is not None) if m else None


def rdma_state(text: str) -> str:
    """`rdma_ctl status`: "enabled", "disabled" or "unknown". It prints one word (enabled, as recorded in
    ml-explore/mlx#2944); anything saying disabled or "not enabled" counts as disabled."""
    words = re.findall(r"[a-z]+", (text or "").lower())
    if "disabled" in words or ("not" in words and "enabled" in words):
        return "disabled"
    return "enabled" if "enabled" in words else "unknown"


def ibv_device_names(lines: list[str]) -> list[str]:
    """The devices `ibv_devices` lists, from its lines: a header (`device  node GUID`, then dashes), then one
    `name  guid` row per device. Anything else (No IB devices found, an error) names no device."""
    names = []
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[0] != "device" and not fields[0].startswith("-"):
            names.append(fields[0])
    return names


# ---- sleep settings on a Mac: docs/facts/macos.md#pmset-sleep-settings -------------------------------------------

def pmset_settings(lines: list[str]) -> dict[str, dict[str, str]]:
    """`pmset -g custom`: power source -> setting -> value. pmset(1) prints a heading per power source
    (`Battery Power:`, `AC Power:`, `UPS Power:`), then one indented `name  value` line per setting; a name
    may hold spaces (`Sleep On Power Button 1`), and `pmset -g` may follow a value with why it is overridden
    (`sleep  1 (sleep prevented by caffeinate)`), which is dropped. (`pmset -g` prints one listing, under
    `Currently in use:`.)"""
    out: dict[str, dict[str, str]] = {}
    source = ""
    for line in lines:
        if not line.strip():
            continue
        if not line[0].isspace():
            source = line.strip().rstrip(":") if line.rstrip().endswith(":") else source
            continue
        fields = re.sub(r"\s*\(.*\)\s*$", "", line).split()
        if len(fields) >= 2:
            out.setdefault(source, {})[" ".join(fields[:-1])] = fields[-1]
    return out


def power_source(lines: list[str]) -> tuple[str | None, bool]:
    """`pmset -g batt`: (the source it is drawing from, "AC Power" or "Battery Power"; whether the Mac has an
    internal battery, a `-InternalBattery-0 ...` line: a laptop). A Mac without a battery prints the first
    line only."""
    source = None
    battery = False
    for line in lines:
        m = re.search(r"drawing from '([^']+)'", line)
        if m:
            source = m.group(1)
        battery = battery or "InternalBattery" in line
    return source, battery


def host_memory(f: Facts) -> int | None:
    """The memory a host's processes may use, in bytes, from its probe: the physical memory (Linux
    /proc/meminfo's MemTotal, macOS `sysctl -n hw.memsize`), lowered to a cgroup v2 limit (`memory.max`, "max"
    when there is none); None when the probe could not say."""
    total = f.get("mem_total").strip()
    if not total.isdigit() or int(total) == 0:
        return None
    limit = f.get("mem_limit").strip()
    return min(int(total), int(limit)) if limit.isdigit() else int(total)
