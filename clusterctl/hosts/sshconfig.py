"""Resolve where `ssh NAME` really goes: host name, port, user, keys, known_hosts.

mpirun and mlx.launch call the OpenSSH client, so paramiko must reach the same machine with the same user
and key. The surest way to agree with OpenSSH is to ask it: `ssh -G` prints the configuration it would use
(Host and Match blocks, Include, %-tokens, canonicalisation) without connecting, and it is asked with the
same rendering of the inventory every OpenSSH client clusterctl starts reads (openssh.py). Where no ssh
client is installed we fall back to paramiko's own ssh_config parser, which covers Host blocks and the
common keys.

Precedence: the inventory's user / port / identity_file / hostname win over the user's ssh_config, which
wins over OpenSSH's built-in defaults (the rendering puts the inventory's values first).
"""
from __future__ import annotations

import getpass
import ipaddress
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, replace

from ..errors import InventoryError
from ..inventory import Cluster, Host

# OpenSSH's default identities, in the order it tries them, used when no IdentityFile is configured.
DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
                      "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss", "~/.ssh/id_dsa")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
SSH_G_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SSHTarget:
    """Everything needed to open the same SSH connection OpenSSH would open for one inventory host."""

    alias: str                          # the inventory name (what `ssh` is given)
    hostname: str                       # where the TCP connection goes
    port: int
    user: str
    identity_files: tuple[str, ...]     # absolute paths, in the order OpenSSH tries them
    known_hosts_files: tuple[str, ...]  # absolute; new keys are recorded in the first
    strict_host_key_checking: str       # OpenSSH's setting: yes | accept-new | ask | no
    proxy_command: str | None = None
    proxy_jump: str | None = None
    config_file: str | None = None      # the ssh_config used, None for the user's default
    global_known_hosts_files: tuple[str, ...] = ()   # read, never written (GlobalKnownHostsFile)


def parse_ssh_G(text: str) -> dict[str, list[str]]:
    """Parse `ssh -G` output (`key value` per line; keys may repeat) into key -> values, keys lower-cased."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            out.setdefault(key.lower(), []).append(value.strip())
    return out


def ssh_G_argv(alias: str, config_file: str, ssh: str = "ssh") -> list[str]:
    """`ssh -G` with clusterctl's rendering of the inventory (openssh.py): the inventory's settings are in
    it, so nothing else goes on the command line; `--` ends the options before a hostile name."""
    return [ssh, "-G", "-F", config_file, "--", alias]


def target_from_ssh_G(alias: str, values: dict[str, list[str]], config_file: str | None) -> SSHTarget:
    def first(key: str, default: str | None = None) -> str | None:
        v = values.get(key)
        return v[0] if v else default

    known, system = [], []
    for entry in values.get("userknownhostsfile", list(DEFAULT_KNOWN_HOSTS)):
        known.extend(entry.split())
    for entry in values.get("globalknownhostsfile", list(DEFAULT_GLOBAL_KNOWN_HOSTS)):
        system.extend(entry.split())
    proxy = first("proxycommand")
    jump = first("proxyjump")
    return SSHTarget(
        alias=alias,
        hostname=first("hostname", alias),
        port=int(first("port", "22")),
        user=first("user") or getpass.getuser(),
        identity_files=tuple(_expand(p) for p in values.get("identityfile", [])),
        known_hosts_files=tuple(_expand(p) for p in known),
        strict_host_key_checking=(first("stricthostkeychecking", "ask") or "ask").lower(),
        proxy_command=None if proxy in (None, "none") else proxy,
        proxy_jump=None if jump in (None, "none") else jump,
        config_file=config_file,
        global_known_hosts_files=tuple(_expand(p) for p in system),
    )


def _expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def usable_identity(host: Host) -> str | None:
    """The inventory's identity_file when it exists here; OpenSSH (ssh -G, -i) would drop a missing one."""
    return host.identity_file if host.identity_file and os.path.exists(host.identity_file) else None


def resolve(host: Host, config_file: str | None = None, inventory_path: str | None = None,
            rendered: str | None = None) -> SSHTarget:
    """Where `ssh host.name` goes: what OpenSSH makes of clusterctl's rendering of the inventory (`rendered`,
    by default one made for this host with `config_file` or the user's own configs included). A host
    OpenSSH cannot resolve is an InventoryError at the host's line of `inventory_path`."""
    if host.local:
        return SSHTarget(host.name, "localhost", 0, getpass.getuser(), (), (), "yes")
    if config_file is not None and not os.path.isfile(config_file):
        raise InventoryError(config_file, None, "ssh_config file does not exist")
    ssh = shutil.which("ssh")
    if ssh:
        if rendered is None:
            from .openssh import USER_CONFIGS, render, write_config
            from .transport import DEFAULT_CONNECT_TIMEOUT_S

            includes = [config_file] if config_file else \
                [p for p in (os.path.expanduser(u) for u in USER_CONFIGS) if os.path.isfile(p)]
            rendered = write_config(render([host], identity=usable_identity, includes=includes,
                                           host_key_checking="accept-new", connect_timeout=DEFAULT_CONNECT_TIMEOUT_S,
                                           origin=inventory_path or host.name))
        argv = ssh_G_argv(host.name, rendered, ssh)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=SSH_G_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise InventoryError(inventory_path or config_file or "~/.ssh/config",
                                 host.line if inventory_path else None,
                                 f"`ssh -G {host.name}` took over {SSH_G_TIMEOUT_S:g}s (a slow DNS lookup for "
                                 "CanonicalizeHostname or a Match exec in your ssh config?)") from None
        if proc.returncode != 0:
            why = proc.stderr.strip().splitlines()
            raise InventoryError(inventory_path or config_file or "~/.ssh/config",
                                 host.line if inventory_path else None,
                                 f"ssh cannot use host {host.name!r}: {why[-1] if why else 'ssh -G failed'}")
        target = target_from_ssh_G(host.name, parse_ssh_G(proc.stdout), rendered)
    else:
        target = replace(_resolve_with_paramiko(host.hostname or host.name, host, config_file), alias=host.name)
    if host.identity_file and host.identity_file not in target.identity_files:
        # a key that does not exist (yet) is not rendered; keep it first so errors can name it
        target = replace(target, identity_files=(host.identity_file,) + target.identity_files)
    return target


def _resolve_with_paramiko(alias: str, host: Host, config_file: str | None) -> SSHTarget:
    import paramiko

    path = config_file or os.path.expanduser("~/.ssh/config")
    config = paramiko.SSHConfig.from_path(path) if os.path.isfile(path) else paramiko.SSHConfig()
    found = config.lookup(alias)
    values: dict[str, list[str]] = {k: [str(v)] for k, v in found.items() if not isinstance(v, list)}
    values["identityfile"] = list(found.get("identityfile", [])) or list(DEFAULT_IDENTITIES)
    if host.identity_file:
        values["identityfile"].insert(0, host.identity_file)
    if host.user:
        values["user"] = [host.user]
    if host.port:
        values["port"] = [str(host.port)]
    return target_from_ssh_G(alias, values, config_file)


def address_of(target: SSHTarget) -> str | None:
    """The IPv4 address ssh connects to for `target`: its HostName as ssh -G gives it, resolved here when it is a
    name; None when it has no IPv4 address."""
    try:
        return str(ipaddress.IPv4Address(target.hostname))
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(target.hostname, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return found[0][4][0] if found else None


def resolve_cluster(cluster: Cluster) -> dict[str, SSHTarget]:
    """Resolve every host against the cluster's rendering (in parallel: each `ssh -G` is a process start),
    keyed by inventory name."""
    from concurrent.futures import ThreadPoolExecutor

    from .openssh import controller_config

    rendered = controller_config(cluster) if shutil.which("ssh") else None
    with ThreadPoolExecutor(max_workers=min(16, len(cluster.hosts))) as pool:
        targets = list(pool.map(lambda h: resolve(h, cluster.ssh_config, cluster.path, rendered), cluster.hosts))
    return {h.name: t for h, t in zip(cluster.hosts, targets)}


def host_rows(cluster: Cluster) -> list[dict]:
    """Every host as `clusterctl hosts` shows it: the inventory after defaults, with where `ssh NAME`
    really goes (ssh_config applied)."""

    targets = resolve_cluster(cluster)
    rows = []
    for h in cluster.hosts:
        t = targets[h.name]
        rows.append({
            "ranks": str(h.rank) if h.slots == 1 else f"{h.ranks.start}-{h.ranks.stop - 1}", "name": h.name,
            "connect": "(local)" if h.local else f"{t.hostname}:{t.port}",
            "user": t.user, "address": h.address or "", "python": h.python, "workdir": h.workdir,
            "model_store": h.model_store,
            "identity_file": "" if h.local else (next((p for p in t.identity_files if os.path.isfile(p)), "")),
            "env": h.env_dict,
        })
    return rows
