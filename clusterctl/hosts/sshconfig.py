"""Resolve where `ssh NAME` really goes: host name, port, user, keys, known_hosts.

mpirun and mlx.launch call the OpenSSH client, so paramiko must reach the same machine with the same user
and key. The surest way to agree with OpenSSH is to ask it: `ssh -G` prints the configuration it would use
(Host and Match blocks, Include, %-tokens, canonicalisation) without connecting. Where no ssh client is
installed we fall back to paramiko's own ssh_config parser, which covers Host blocks and the common keys.

Precedence, as with OpenSSH's command line: the inventory's explicit user/port/identity_file win over
ssh_config, which wins over OpenSSH's built-in defaults.
"""
from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass, replace

from ..errors import InventoryError
from ..inventory import Cluster, Host

# OpenSSH's default identities, in the order it tries them, used when no IdentityFile is configured.
DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
                      "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss", "~/.ssh/id_dsa")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
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


def parse_ssh_G(text: str) -> dict[str, list[str]]:
    """Parse `ssh -G` output (`key value` per line; keys may repeat) into key -> values, keys lower-cased."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            out.setdefault(key.lower(), []).append(value.strip())
    return out


def login_args(user: str | None, port: int | None, identity_file: str | None) -> list[str]:
    """ssh's -l / -p / -i for what the inventory sets (nothing for what it leaves to ~/.ssh/config)."""
    argv: list[str] = []
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    if identity_file:
        argv += ["-i", identity_file]
    return argv


def ssh_G_argv(alias: str, *, user: str | None, port: int | None, identity_file: str | None,
               config_file: str | None, ssh: str = "ssh") -> list[str]:
    argv = [ssh, "-G"]
    if config_file:
        argv += ["-F", config_file]
    return argv + login_args(user, port, identity_file) + ["--", alias]


def target_from_ssh_G(alias: str, values: dict[str, list[str]], config_file: str | None) -> SSHTarget:
    def first(key: str, default: str | None = None) -> str | None:
        v = values.get(key)
        return v[0] if v else default

    known = []
    for entry in values.get("userknownhostsfile", list(DEFAULT_KNOWN_HOSTS)):
        known.extend(entry.split())
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
    )


def _expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def usable_identity(host: Host) -> str | None:
    """The inventory's identity_file when it exists here; OpenSSH (ssh -G, -i) would drop a missing one."""
    return host.identity_file if host.identity_file and os.path.exists(host.identity_file) else None


def resolve(host: Host, config_file: str | None = None, inventory_path: str | None = None) -> SSHTarget:
    """Where `ssh host.name` goes, with the inventory's explicit settings applied on top.
    A host OpenSSH cannot resolve is an InventoryError at the host's line of `inventory_path`."""
    if host.local:
        return SSHTarget(host.name, "localhost", 0, getpass.getuser(), (), (), "yes")
    alias = host.hostname or host.name
    if config_file is not None and not os.path.isfile(config_file):
        raise InventoryError(config_file, None, "ssh_config file does not exist")
    ssh = shutil.which("ssh")
    identity = usable_identity(host)
    if ssh:
        argv = ssh_G_argv(alias, user=host.user, port=host.port, identity_file=identity,
                          config_file=config_file, ssh=ssh)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=SSH_G_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise InventoryError(inventory_path or config_file or "~/.ssh/config",
                                 host.line if inventory_path else None,
                                 f"`ssh -G {alias}` took over {SSH_G_TIMEOUT_S:g}s (a slow DNS lookup for "
                                 "CanonicalizeHostname or a Match exec in your ssh config?)") from None
        if proc.returncode != 0:
            why = proc.stderr.strip().splitlines()
            raise InventoryError(inventory_path or config_file or "~/.ssh/config",
                                 host.line if inventory_path else None,
                                 f"ssh cannot use host {alias!r}: {why[-1] if why else 'ssh -G failed'}")
        target = target_from_ssh_G(alias, parse_ssh_G(proc.stdout), config_file)
    else:
        target = _resolve_with_paramiko(alias, host, config_file)
    if host.identity_file and host.identity_file not in target.identity_files:
        # ssh -G drops an -i key that does not exist (yet); keep it first so errors can name it.
        target = replace(target, identity_files=(host.identity_file,) + target.identity_files)
    if host.hostname:
        target = replace(target, alias=host.name)
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


def resolve_cluster(cluster: Cluster) -> dict[str, SSHTarget]:
    """Resolve every host (in parallel: each `ssh -G` is a process start), keyed by inventory name."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(cluster.hosts))) as pool:
        targets = list(pool.map(lambda h: resolve(h, cluster.ssh_config, cluster.path), cluster.hosts))
    return {h.name: t for h, t in zip(cluster.hosts, targets)}


def openssh_options(cluster: Cluster, host_key_checking: str | None = None,
                    connect_timeout: float = 10.0) -> list[str]:
    """Options for the OpenSSH client wherever clusterctl runs it, or has mpirun / mlx.launch run it:
    never prompt (BatchMode), never wait forever (ConnectTimeout; docs/ssh.md#batchmode-and-connecttimeout),
    trust-on-first-use or strict host keys (docs/ssh.md#accept-new-host-keys), and the inventory's ssh_config.
    The same list is used on every host, so `ssh_config` must exist at the same path on each one (doctor
    checks that). It carries no per-host user, port or key: for mpirun and mlx.launch those must be in the
    ssh_config file itself (docs/ssh.md#inventory-reaches-openssh-only-through-ssh-config)."""
    policy = host_key_checking or cluster.host_key_checking
    options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(round(connect_timeout)))}",
               "-o", "StrictHostKeyChecking=" + ("yes" if policy == "strict" else "accept-new")]
    if cluster.ssh_config:
        options = ["-F", cluster.ssh_config] + options
    return options


def rsh_agent(cluster: Cluster, host_key_checking: str | None = None, connect_timeout: float = 10.0) -> str:
    """OpenMPI's plm_rsh_agent value: the ssh command line mpirun (and its daemons,
    docs/launchers.md#open-mpi-tree-spawn) use. OpenMPI splits it on white space, so a path with spaces
    cannot be part of it (docs/launchers.md#open-mpi-rsh-agent)."""
    argv = ["ssh"] + openssh_options(cluster, host_key_checking, connect_timeout)
    if any(any(c.isspace() for c in word) for word in argv):
        raise InventoryError(cluster.path, None, f"ssh_config path {cluster.ssh_config!r} contains white space, "
                             "which mpirun cannot pass to ssh; move the file")
    return " ".join(argv)


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
            "identity_file": "" if h.local else (next((p for p in t.identity_files if os.path.isfile(p)), "")),
            "env": h.env_dict,
        })
    return rows
