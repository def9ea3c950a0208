"""Inventory: a YAML file naming the hosts of a cluster, in rank order, with their settings.

Every error names the file and line it comes from (`inventory.yaml:12: port must be a whole number from 1 to
65535`): the YAML is read node by node (inventory_yaml.py).

A host key is declared once, as its Host field: `key(default, read=..., help=..., in_defaults=...)` says how
its value is read and checked, its built-in default, whether `defaults:` may set it, and what it means;
HOST_KEYS, DEFAULTS_KEYS and the parser's dispatch are derived from those fields. Adding a key is its
declaration plus its use.

Precedence for a host's settings: the host's own keys > `defaults:` > ~/.ssh/config (see sshconfig.py,
applied later, for user/port/identity) > built-in defaults.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import yaml

from .errors import InventoryError
from .inventory_yaml import NodeReader, kind, secret_names, whole

HOST_KEY_POLICIES = ("accept-new", "strict")   # never "no" (docs/facts/ssh.md#accept-new-host-keys)
DEFAULT_PYTHON = "python3"
DEFAULT_WORKDIR = "~/clusterctl"
DEFAULT_MODEL_STORE = "~/.cache/clusterctl/models"   # transfer/models.py: pushed models, one entry per content
DEFAULT_BTL_TCP_LINKS = 4         # MLX's advice for bandwidth (docs/facts/launchers.md#btl-tcp-links)
DEFAULT_CONNECTIONS_PER_IP = 1    # mlx.launch's own default (docs/facts/launchers.md#mlx-launch-hostfile-format)
DEFAULT_BACKEND = "mpi"           # an inventory's launch.backend when it names none (and `init --backend`'s)

# Ansible's spellings, accepted so an existing Ansible inventory's host entries can be pasted in.
ALIASES = {
    "ansible_host": "hostname",
    "ansible_port": "port",
    "ansible_user": "user",
    "ansible_ssh_private_key_file": "identity_file",
    "ansible_python_interpreter": "python",
}
TOP_KEYS = ("defaults", "hosts", "mpi", "launch", "ssh_config", "host_key_checking")
MPI_KEYS = ("btl_tcp_links", "if_include", "extra_args")
LAUNCH_KEYS = ("backend", "connections_per_ip")

# env names whose values records and --json outputs never show (docs/security.md#where-secrets-go)
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|AUTH|COOKIE",
                          re.IGNORECASE)
REDACTED = "<redacted>"


def is_secret(name: str, marked: Iterable[str] = ()) -> bool:
    """An env variable whose value is kept out of records: its name looks like a secret's (HF_TOKEN,
    WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, ...) or the inventory marks it `!secret`."""
    return name in marked or bool(_SECRET_NAME.search(name))


def scrub(obj: Any, secrets: Iterable[str]) -> Any:
    """`obj` (JSON-like) with every occurrence of a secret value in its strings replaced by REDACTED."""
    secrets = [s for s in secrets if s]
    if not secrets:
        return obj
    if isinstance(obj, str):
        for secret in secrets:
            obj = obj.replace(secret, REDACTED)
        return obj
    if isinstance(obj, dict):
        return {k: scrub(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, secrets) for v in obj]
    return obj


# ---- host keys: each declared once, as a field of Host ----------------------------------------------------

@dataclass(frozen=True)
class HostKey:
    """How one host key is read: `read(reader, value node, the key as messages name it)` returns the value
    (or fails with file:line; inventory_yaml.NodeReader's readers); `in_defaults`: `defaults:` may set it for
    every host (not a key that describes one machine only); `also`: other Host fields its node sets;
    `merge`: (defaults' settings, the host's) -> the fields to set, where the host's value must not simply
    replace the defaults' one; `help`: what it means."""

    read: Callable[[Any, yaml.Node, str], Any]
    help: str
    in_defaults: bool = True
    also: Callable[[yaml.Node], dict[str, Any]] | None = None
    merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None


def key(default: Any = dataclasses.MISSING, *, read: Callable[[Any, yaml.Node, str], Any], help: str,
        in_defaults: bool = True, also: Callable[[yaml.Node], dict[str, Any]] | None = None,
        merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None) -> Any:
    """A Host field that is an inventory key: its default is the built-in one (none: the key is required)."""
    return field(default=default, metadata={"key": HostKey(read, help, in_defaults, also, merge)})


def _merged_env(defaults: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """`env` merged name by name with `defaults.env` (the host's value wins); `!secret` marks from both."""
    return {"env": tuple({**dict(defaults.get("env", ())), **dict(own.get("env", ()))}.items()),
            "secret_env": tuple(sorted({*defaults.get("secret_env", ()), *own.get("secret_env", ())}))}


@dataclass(frozen=True)
class Host:
    """One machine of the cluster as the inventory declares it (before ~/.ssh/config is applied).

    `user`, `port` and `identity_file` stay None when the inventory does not set them, so that
    ~/.ssh/config can supply them the way OpenSSH would.
    """

    name: str = key(read=NodeReader.host_name, in_defaults=False,
                    help="what ssh / mpirun call the host: an ssh alias, host name or IP")
    rank: int                 # the first rank this host runs; ranks follow the inventory order
    line: int                 # where the host's entry starts in the inventory file
    hostname: str | None = key(None, read=NodeReader.host_name, in_defaults=False,
                               help="connect here instead of `name` (ansible_host)")
    address: str | None = key(None, read=NodeReader.address, in_defaults=False,
                              help="data-plane IPv4 (Thunderbolt bridge / 10GbE)")
    user: str | None = key(None, read=NodeReader.user, help="the SSH user")
    port: int | None = key(None, read=whole(1, 65535), help="the SSH port")
    identity_file: str | None = key(None, read=NodeReader.local_path, help="a path on this machine, ~ expanded")
    mesh_identity_file: str | None = key(None, read=NodeReader.string,
                                         help="a path on the hosts: the key a host uses to log in to its peers")
    python: str = key(DEFAULT_PYTHON, read=NodeReader.string, help="a path or command on the host")
    workdir: str = key(DEFAULT_WORKDIR, read=NodeReader.string, help="a path on the host; ~ means the host user's home")
    model_store: str = key(DEFAULT_MODEL_STORE, read=NodeReader.string,
                           help="a path on the host (~ as in workdir): `clusterctl models` entries")
    mpi_lib_dir: str | None = key(None, read=NodeReader.string, help="the directory holding libmpi on the host")
    env: tuple[tuple[str, str], ...] = key((), read=NodeReader.env, merge=_merged_env,
                                           also=lambda node: {"secret_env": secret_names(node)},
                                           help="more environment for the ranks, merged name by name with defaults'")
    secret_env: tuple[str, ...] = ()  # env names marked `!secret` in the inventory
    slots: int = key(1, read=whole(1, 1024), help="ranks on this host")
    local: bool = key(False, read=NodeReader.boolean, help="this machine: run commands directly, no SSH")
    # jaccl: per rank of the cluster, the RDMA device(s) this host reaches it through; None for its own rank
    # (MLX's hostfile `rdma` list: docs/facts/macos.md#jaccl)
    rdma: tuple[str | tuple[str, ...] | None, ...] | None = key(
        None, read=NodeReader.rdma, in_defaults=False,
        also=lambda node: {"rdma_line": node.start_mark.line + 1, "rdma_node": node},
        help="jaccl: per rank of the cluster, the RDMA device(s) this host reaches it through")
    rdma_line: int | None = field(default=None, compare=False)   # where `rdma:` is, for messages

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def secrets(self) -> list[str]:
        """The values of this host's env that are secret (is_secret)."""
        return [value for name, value in self.env if is_secret(name, self.secret_env)]

    @property
    def ranks(self) -> range:
        return range(self.rank, self.rank + self.slots)


KEYS: dict[str, HostKey] = {f.name: f.metadata["key"] for f in dataclasses.fields(Host) if "key" in f.metadata}
HOST_KEYS = tuple(KEYS)
# Keys that describe one machine only make no sense as defaults for all of them.
DEFAULTS_KEYS = tuple(name for name, k in KEYS.items() if k.in_defaults)


@dataclass(frozen=True)
class MPISettings:
    btl_tcp_links: int = DEFAULT_BTL_TCP_LINKS
    if_include: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchSettings:
    backend: str = DEFAULT_BACKEND    # a name in clusterctl.launch.backends.REGISTRY (checked there, at this line)
    connections_per_ip: int = DEFAULT_CONNECTIONS_PER_IP   # ring: TCP connections per address and neighbour
    backend_line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Cluster:
    path: str
    hosts: tuple[Host, ...]
    mpi: MPISettings = field(default_factory=MPISettings)
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    # the only way per-host settings reach mpirun's and mlx.launch's ssh:
    # docs/facts/ssh.md#inventory-reaches-openssh-only-through-ssh-config
    ssh_config: str | None = None     # an ssh_config file used for every ssh (paramiko, mpirun, mlx.launch)
    host_key_checking: str = "accept-new"

    @property
    def world_size(self) -> int:
        return sum(h.slots for h in self.hosts)

    @property
    def names(self) -> list[str]:
        """The hosts' names, in rank order."""
        return [h.name for h in self.hosts]

    @classmethod
    def this_machine(cls, workdir: str, slots: int = 1, backend: str = DEFAULT_BACKEND) -> "Cluster":
        """A cluster of this machine alone (no SSH), working in `workdir`, with the interpreter running
        clusterctl as its python: what `clusterctl run` uses without an inventory."""
        host = Host(name="localhost", rank=0, line=1, python=sys.executable, workdir=workdir, slots=slots, local=True)
        return cls("(this machine)", (host,), launch=LaunchSettings(backend=backend))

    def subset(self, names: Iterable[str]) -> "Cluster":
        """The cluster of these hosts alone, in inventory order, ranks renumbered from 0 (what an elastic
        restart runs on when some hosts do not answer). jaccl's per-rank RDMA lists name every rank of the
        whole cluster, so they cannot shrink: such a cluster is refused by the caller."""
        keep, rank, hosts = set(names), 0, []
        for h in self.hosts:
            if h.name in keep:
                hosts.append(dataclasses.replace(h, rank=rank))
                rank += h.slots
        return dataclasses.replace(self, hosts=tuple(hosts))

    def with_addresses(self, addresses: Mapping[str, str]) -> "Cluster":
        """The hosts named in `addresses` with that data-plane `address` (run's, for hosts the inventory gives none
        under a backend that needs every rank's: the address ssh reaches each at)."""
        if not addresses:
            return self
        return dataclasses.replace(self, hosts=tuple(dataclasses.replace(h, address=addresses.get(h.name, h.address))
                                                     for h in self.hosts))

    def with_env(self, values: Mapping[str, str]) -> "Cluster":
        """Every host's env with `values` set over its own (run --env: as if the inventory's `defaults: env:` had
        them, winning over a host's own value), so they reach the ranks, and stay out of command lines and
        records, exactly as the inventory's do."""
        if not values:
            return self
        hosts = tuple(dataclasses.replace(h, env=tuple({**h.env_dict, **values}.items())) for h in self.hosts)
        return dataclasses.replace(self, hosts=hosts)

    @property
    def secrets(self) -> list[str]:
        """Every secret env value of the inventory, longest first (scrub replaces them in that order)."""
        return sorted({v for h in self.hosts for v in h.secrets if v}, key=lambda v: (-len(v), v))

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)


def load(path: str | os.PathLike) -> Cluster:
    """Read and validate an inventory file. Raises InventoryError (exit 2) with file:line."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise InventoryError(path, None, "no such inventory file") from None
    except IsADirectoryError:
        raise InventoryError(path, None, "is a directory, not an inventory file") from None
    except UnicodeDecodeError as e:
        raise InventoryError(path, None, f"not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise InventoryError(path, None, e.strerror or str(e)) from None
    return parse(text, path)


def parse(text: str, path: str = "inventory.yaml", base_dir: str | None = None) -> Cluster:
    """Validate inventory text. Relative local paths (identity_file, ssh_config) are taken relative to
    `base_dir`, by default the directory of `path`, so an inventory and its keys can move together."""
    if base_dir is None:
        base_dir = os.path.dirname(os.path.abspath(path))
    return _Parser(text, path, base_dir).cluster()


class _Parser(NodeReader):
    """The document: its top-level keys, the hosts (each key as Host declares it), mpi and launch."""

    def cluster(self) -> Cluster:
        root = self.root()
        top = self.mapping(root, "the inventory", TOP_KEYS)
        if "hosts" not in top:
            self.fail(root, "the inventory has no `hosts:` list")
        defaults = self.host_settings(top["defaults"][1], "defaults", DEFAULTS_KEYS) \
            if "defaults" in top else {}
        hosts = self.hosts(top["hosts"][1], defaults)
        mpi = self.mpi(top["mpi"][1]) if "mpi" in top else MPISettings()
        launch = self.launch(top["launch"][1]) if "launch" in top else LaunchSettings()
        ssh_config = self.local_path(top["ssh_config"][1], "ssh_config") if "ssh_config" in top else None
        if ssh_config is not None and not os.path.isfile(ssh_config):
            self.fail(top["ssh_config"][1], f"ssh_config file {ssh_config} does not exist")
        policy = "accept-new"
        if "host_key_checking" in top:
            node = top["host_key_checking"][1]
            policy = self.string(node, "host_key_checking")
            if policy not in HOST_KEY_POLICIES:
                self.fail(node, f"host_key_checking must be one of {', '.join(HOST_KEY_POLICIES)}, "
                          f"not '{policy}' (clusterctl never turns host key checking off)")
        return Cluster(self.path, hosts, mpi, launch, ssh_config, policy)

    def hosts(self, node: yaml.Node, defaults: dict[str, Any]) -> tuple[Host, ...]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, f"`hosts` must be a list (one `- name: ...` entry per host), not {kind(node)}")
        if not node.value:
            self.fail(node, "`hosts` is empty; list at least one host")
        hosts: list[Host] = []
        rdma_nodes: list[yaml.Node | None] = []
        first_line: dict[str, int] = {}
        rank = 0
        for entry in node.value:
            if isinstance(entry, yaml.ScalarNode) and isinstance(self.scalar(entry), str):
                settings = {"name": self.host_name(entry)}   # `- studio-1` is short for `- name: studio-1`
            else:
                settings = self.host_settings(entry, "a host entry", HOST_KEYS)
                if "name" not in settings:
                    self.fail(entry, "a host entry has no `name`")
            name = settings["name"]
            if name in first_line:
                self.fail(entry, f"duplicate host name '{name}' (first at line {first_line[name]}); "
                          "use `slots:` to run several ranks on one host")
            first_line[name] = entry.start_mark.line + 1
            rdma_nodes.append(settings.pop("rdma_node", None))
            merged = {**defaults, **settings}     # precedence: the host's own keys > defaults > built-in
            for declared in KEYS.values():
                if declared.merge:
                    merged.update(declared.merge(defaults, settings))
            if merged.get("local") and "python" not in merged:
                merged["python"] = sys.executable   # this machine: the interpreter running clusterctl
            host = Host(rank=rank, line=entry.start_mark.line + 1, **merged)
            hosts.append(host)
            rank += host.slots
        for host, rdma_node in zip(hosts, rdma_nodes):
            if rdma_node is not None:
                self.check_rdma(host, rdma_node, world_size=rank)
        return tuple(hosts)

    def check_rdma(self, host: Host, node: yaml.SequenceNode, world_size: int) -> None:
        """What an `rdma` list must satisfy whatever the backend: one entry per rank, null for the host's own
        ranks, and the host's `address` (jaccl's ranks meet at rank 0's address before RDMA takes over, and
        doctor checks TCP between every host's address)."""
        if len(host.rdma) != world_size:
            self.fail(node, f"rdma of {host.name} has {len(host.rdma)} entries; expected {world_size}, one per rank "
                      f"of the cluster (the world size) in inventory order, null for {host.name}'s own")
        for rank in host.ranks:
            if host.rdma[rank] is not None:
                self.fail(node.value[rank], f"rdma entry {rank} is {host.name}'s own rank: it must be null, "
                          f"not {host.rdma[rank]!r}")
        if not host.address:
            self.fail(node, f"rdma needs {host.name}'s data-plane `address` too (rank 0's is the jaccl "
                      "coordinator): add `address: <its IPv4>` to this host")

    def host_settings(self, node: yaml.Node, what: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        """A host entry's (or `defaults:`') keys, each read as its declaration says (HostKey)."""
        entries = self.mapping(node, what, allowed, ALIASES)
        out: dict[str, Any] = {}
        for name, (key_node, value) in entries.items():
            label = f"defaults.{key_node.value}" if what == "defaults" else key_node.value
            declared = KEYS[name]
            out[name] = declared.read(self, value, label)
            if declared.also:
                out.update(declared.also(value))
        return out

    def mpi(self, node: yaml.Node) -> MPISettings:
        entries = self.mapping(node, "mpi", MPI_KEYS)
        links, if_include, extra = DEFAULT_BTL_TCP_LINKS, None, ()
        if "btl_tcp_links" in entries:
            links = self.integer(entries["btl_tcp_links"][1], "mpi.btl_tcp_links", 1, 64)
        if "if_include" in entries:
            if_include = self.string(entries["if_include"][1], "mpi.if_include")
            for part in if_include.split(","):
                if "/" in part:
                    try:
                        ipaddress.IPv4Network(part.strip(), strict=False)
                    except ValueError:
                        self.fail(entries["if_include"][1], f"mpi.if_include: '{part}' is not a subnet "
                                  "such as 192.168.10.0/24")
        if "extra_args" in entries:
            extra_node = entries["extra_args"][1]
            if not isinstance(extra_node, yaml.SequenceNode):
                self.fail(extra_node, f"mpi.extra_args must be a list of strings, not {kind(extra_node)}")
            extra = tuple(self.string(item, "each of mpi.extra_args") for item in extra_node.value)
        return MPISettings(links, if_include, extra)

    def launch(self, node: yaml.Node) -> LaunchSettings:
        entries = self.mapping(node, "launch", LAUNCH_KEYS)
        backend, line = DEFAULT_BACKEND, None
        if "backend" in entries:
            # which names exist is the launch backends' business (clusterctl.launch.backends.validated)
            backend = self.string(entries["backend"][1], "launch.backend")
            line = entries["backend"][1].start_mark.line + 1
        connections = DEFAULT_CONNECTIONS_PER_IP
        if "connections_per_ip" in entries:
            connections = self.integer(entries["connections_per_ip"][1], "launch.connections_per_ip", 1, 64)
        return LaunchSettings(backend, connections, line)

