"""Inventory: a YAML file naming the hosts of a cluster, in rank order, with their settings.

Parsing walks PyYAML's node tree instead of plain `yaml.safe_load` so that every error names the line it
comes from (`inventory.yaml:12: port must be a whole number from 1 to 65535`) and so that duplicate keys,
which safe_load silently collapses, are reported.

Precedence for a host's settings: the host's own keys > `defaults:` > ~/.ssh/config (see sshconfig.py,
applied later, for user/port/identity) > built-in defaults.
"""
from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Iterable

import yaml

from .errors import InventoryError

HOST_KEY_POLICIES = ("accept-new", "strict")   # never "no" (docs/facts/ssh.md#accept-new-host-keys)
DEFAULT_PYTHON = "python3"
DEFAULT_WORKDIR = "~/clusterctl"
DEFAULT_MODEL_STORE = "~/.cache/clusterctl/models"   # transfer/models.py: pushed models, one entry per content
DEFAULT_BTL_TCP_LINKS = 4         # MLX's advice for bandwidth (docs/facts/launchers.md#btl-tcp-links)
DEFAULT_CONNECTIONS_PER_IP = 1    # mlx.launch's own default (docs/facts/launchers.md#mlx-launch-hostfile-format)

# Ansible's spellings, accepted so an existing Ansible inventory's host entries can be pasted in.
ALIASES = {
    "ansible_host": "hostname",
    "ansible_port": "port",
    "ansible_user": "user",
    "ansible_ssh_private_key_file": "identity_file",
    "ansible_python_interpreter": "python",
}
HOST_KEYS = ("name", "hostname", "address", "user", "port", "identity_file", "mesh_identity_file", "python", "workdir",
             "model_store", "mpi_lib_dir", "env", "slots", "local", "rdma")
# Keys that describe one machine only make no sense as defaults for all of them.
DEFAULTS_KEYS = tuple(k for k in HOST_KEYS if k not in ("name", "hostname", "address", "rdma"))
TOP_KEYS = ("defaults", "hosts", "mpi", "launch", "ssh_config", "host_key_checking")
MPI_KEYS = ("btl_tcp_links", "if_include", "extra_args")
LAUNCH_KEYS = ("backend", "connections_per_ip")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# env names whose values records and --json outputs never show (docs/security.md#where-secrets-go)
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|AUTH|COOKIE",
                          re.IGNORECASE)
REDACTED = "<redacted>"
SECRET_TAG = "!secret"


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
_BAD_NAME_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")
# OpenSSH refuses host names holding these (ssh.c valid_hostname); so do we, with the line number.
_SHELL_CHARS = re.compile(r"['`\"$\\;&<>|(){}]")
# ssh_config reads these in a Host line as patterns (or %-tokens in HostName): clusterctl writes one per host.
_PATTERN_CHARS = re.compile(r"[*?!,%\[\]]")
# An RDMA device as `ibv_devices` names it on a Mac (rdma_en2): docs/facts/macos.md#jaccl
_RDMA_DEVICE = re.compile(r"[A-Za-z0-9_.-]+\Z")



@dataclass(frozen=True)
class Host:
    """One machine of the cluster as the inventory declares it (before ~/.ssh/config is applied).

    `user`, `port` and `identity_file` stay None when the inventory does not set them, so that
    ~/.ssh/config can supply them the way OpenSSH would.
    """

    name: str                 # what ssh / mpirun call the host: an ssh alias, host name or IP
    rank: int                 # the first rank this host runs; ranks follow the inventory order
    line: int                 # where the host's entry starts in the inventory file
    hostname: str | None = None       # connect here instead of `name` (ansible_host)
    address: str | None = None        # data-plane IPv4 (Thunderbolt bridge / 10GbE)
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None  # a path on this machine, ~ expanded
    mesh_identity_file: str | None = None   # a path on the hosts: the key a host uses to log in to its peers
    python: str = DEFAULT_PYTHON      # a path or command on the host
    workdir: str = DEFAULT_WORKDIR    # a path on the host; ~ means the host user's home
    model_store: str = DEFAULT_MODEL_STORE   # a path on the host (~ as in workdir): `clusterctl models` entries
    mpi_lib_dir: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    secret_env: tuple[str, ...] = ()  # env names marked `!secret` in the inventory
    slots: int = 1
    local: bool = False               # this machine: run commands directly, no SSH
    # jaccl: per rank of the cluster, the RDMA device(s) this host reaches it through; None for its own rank
    # (MLX's hostfile `rdma` list: docs/facts/macos.md#jaccl)
    rdma: tuple[str | tuple[str, ...] | None, ...] | None = None
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


@dataclass(frozen=True)
class MPISettings:
    btl_tcp_links: int = DEFAULT_BTL_TCP_LINKS
    if_include: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchSettings:
    backend: str = "mpi"              # a name in clusterctl.launch.backends.REGISTRY (checked there, at this line)
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
    def this_machine(cls, workdir: str, slots: int = 1, backend: str = "mpi") -> "Cluster":
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


class _Parser:
    def __init__(self, text: str, path: str, base_dir: str):
        self.text = text
        self.path = path
        self.base_dir = base_dir

    # ---- errors and YAML plumbing -------------------------------------------------------------
    def fail(self, node_or_line: Any, message: str):
        line = node_or_line if isinstance(node_or_line, int) else node_or_line.start_mark.line + 1
        raise InventoryError(self.path, line, message)

    def root(self) -> yaml.Node:
        for number, line in enumerate(self.text.splitlines(), 1):
            if line.lstrip(" ").startswith("\t"):
                self.fail(number, "tab character in indentation; YAML indents with spaces only")
        self.loader = yaml.SafeLoader(self.text)
        try:
            node = self.loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            problem = (e.problem or e.context or "YAML syntax error").replace("\t", "\\t")
            if "\\t" in problem:
                problem += " (a tab character; YAML indents with spaces only)"
            elif "expected <block end>" in problem or "mapping values are not allowed" in problem:
                problem += " (check the indentation of this line)"
            self.fail(mark.line + 1 if mark else 1, f"YAML syntax error: {problem}")
        except yaml.YAMLError as e:
            self.fail(1, f"YAML syntax error: {e}")
        if node is None:
            self.fail(1, "the inventory is empty; it needs a `hosts:` list")
        return node

    def mapping(self, node: yaml.Node, what: str, allowed: tuple[str, ...] | None,
                aliases: dict[str, str] | None = None) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """A mapping's entries as canonical key -> (key node, value node), rejecting duplicate keys and,
        unless `allowed` is None (free-form keys), unknown ones. YAML merges (<<) are expanded first and
        overridden by the mapping's own keys."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping of key: value, not {_kind(node)}")
        seen: dict[str, str] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            canonical = (aliases or {}).get(key, key)
            if canonical in seen:
                first = seen[canonical]
                self.fail(key_node, f"duplicate key '{key}' in {what}" if first == key else
                          f"'{key}' and '{first}' both set {canonical} in {what}")
            seen[canonical] = key
        try:
            self.loader.flatten_mapping(node)   # merged (<<) entries first, so own keys win below
        except yaml.MarkedYAMLError as e:
            self.fail(e.problem_mark.line + 1, f"bad merge (<<) in {what}: {e.problem}")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or not isinstance(self.scalar(key_node), str):
                self.fail(key_node, f"keys in {what} must be plain words, not {_kind(key_node, self.scalar(key_node))}")
            key = key_node.value
            canonical = (aliases or {}).get(key, key)
            if allowed is not None and canonical not in allowed:
                hint = difflib.get_close_matches(key, list(allowed) + list(aliases or {}), n=1)
                suffix = f" (did you mean '{hint[0]}'?)" if hint else f"; allowed: {', '.join(allowed)}"
                self.fail(key_node, f"unknown key '{key}' in {what}{suffix}")
            out[canonical] = (key_node, value_node)
        return out

    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return _NOT_SCALAR
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError:       # a tag safe_load refuses (!!python/...): named, not an internal error
            self.fail(node, f"the YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not allowed in an "
                            f"inventory (plain strings, numbers, lists and mappings only)")

    def string(self, node: yaml.Node, what: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str):
            self.fail(node, f"{what} must be a string, not {_kind(node, value)}")
        if value == "":
            self.fail(node, f"{what} must not be empty")
        if "\x00" in value:
            self.fail(node, f"{what} must not contain a NUL character")
        return value

    def integer(self, node: yaml.Node, what: str, low: int, high: int) -> int:
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(node, f"{what} must be a whole number from {low} to {high}, not {_kind(node, value)}")
        return value

    def boolean(self, node: yaml.Node, what: str) -> bool:
        value = self.scalar(node)
        if not isinstance(value, bool):
            self.fail(node, f"{what} must be true or false, not {_kind(node, value)}")
        return value

    def local_path(self, node: yaml.Node, what: str) -> str:
        value = os.path.expanduser(self.string(node, what))
        return os.path.normpath(os.path.join(self.base_dir, value))

    # ---- the document -------------------------------------------------------------------------
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
            self.fail(node, f"`hosts` must be a list (one `- name: ...` entry per host), not {_kind(node)}")
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
            merged = {**defaults, **settings}
            merged["env"] = tuple({**dict(defaults.get("env", ())), **dict(settings.get("env", ()))}.items())
            merged["secret_env"] = tuple(sorted({*defaults.get("secret_env", ()), *settings.get("secret_env", ())}))
            if merged.get("local") and "python" not in merged:
                merged["python"] = sys.executable   # this machine: the interpreter running clusterctl
            host = Host(rank=rank, line=entry.start_mark.line + 1, **merged)
            hosts.append(host)
            rank += host.slots
        for host, rdma_node in zip(hosts, rdma_nodes):
            if rdma_node is not None:
                self.check_rdma(host, rdma_node, world_size=rank)
        return tuple(hosts)

    def rdma(self, node: yaml.Node) -> tuple[str | tuple[str, ...] | None, ...]:
        """A host's `rdma` list, MLX's layout (docs/facts/macos.md#jaccl): per rank, null or a device name or a
        list of device names. Its length and self entries are checked once every host's rank is known."""
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, "rdma must be a list with one entry per rank of the cluster (the RDMA device this "
                      f"host reaches that rank through, null for its own), not {_kind(node, self.scalar(node))}")
        entries: list[str | tuple[str, ...] | None] = []
        for index, item in enumerate(node.value):
            what = f"rdma entry {index} (rank {index})"
            if isinstance(item, yaml.SequenceNode) and item.value:
                entries.append(tuple(self.rdma_device(sub, what) for sub in item.value))
            elif isinstance(item, yaml.ScalarNode) and self.scalar(item) is None:
                entries.append(None)
            elif isinstance(item, yaml.ScalarNode):
                entries.append(self.rdma_device(item, what))
            else:
                self.fail(item, f"{what} must be a device name such as rdma_en2, a list of them, or null, "
                          f"not {'an empty list' if isinstance(item, yaml.SequenceNode) else _kind(item)}")
        return tuple(entries)

    def rdma_device(self, node: yaml.Node, what: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str) or not _RDMA_DEVICE.match(value):
            shown = _kind(node, value) if not isinstance(value, str) else repr(value)
            self.fail(node, f"{what} must be a device name such as rdma_en2 (letters, digits, _ - .), not {shown}")
        return value

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

    def host_name(self, node: yaml.Node) -> str:
        name = self.string(node, "host name")
        if name.startswith("-"):
            self.fail(node, f"host name '{name}' must not start with '-' (ssh would read it as an option)")
        if _BAD_NAME_CHARS.search(name):
            self.fail(node, f"host name {name!r} must not contain spaces or control characters")
        if _SHELL_CHARS.search(name):
            self.fail(node, f"host name {name!r} holds a character OpenSSH refuses in host names "
                      f"({_SHELL_CHARS.search(name).group()})")
        if _PATTERN_CHARS.search(name):
            self.fail(node, f"host name {name!r} holds a character ssh_config reads as a pattern or token "
                      f"({_PATTERN_CHARS.search(name).group()})")
        if ":" in name:          # rsync reads host::module as its daemon syntax; an IPv6 address goes in address:
            self.fail(node, f"host name {name!r} holds ':': give the host a name and put its address under "
                      f"`address:`")
        if "/" in name or name in (".", ".."):      # a host's name names folders (runs/<id>/host-<name>/)
            self.fail(node, f"host name {name!r} must not contain '/' or be '.' or '..'")
        if any(unicodedata.category(c) in ("Cf", "Zs", "Zl", "Zp", "Co", "Cn") for c in name):
            self.fail(node, f"host name {name!r} holds an invisible or unassigned character "
                      f"(U+{next(ord(c) for c in name if unicodedata.category(c) in ('Cf', 'Zs', 'Zl', 'Zp', 'Co', 'Cn')):04X})")
        return name

    def host_settings(self, node: yaml.Node, what: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        entries = self.mapping(node, what, allowed, ALIASES)
        out: dict[str, Any] = {}
        for key, (key_node, value) in entries.items():
            label = f"defaults.{key_node.value}" if what == "defaults" else key_node.value
            if key == "name":
                out[key] = self.host_name(value)
            elif key == "hostname":
                out[key] = self.host_name(value)
            elif key == "address":
                text = self.string(value, label)
                try:    # docs/facts/mlx-distributed.md#ring-is-ipv4-only
                    ipaddress.IPv4Address(text)
                except ValueError:
                    self.fail(value, f"address must be an IPv4 address such as 192.168.10.1, not '{text}' "
                              "(MLX's ring backend is IPv4 only)")
                out[key] = text
            elif key == "user":
                user = self.string(value, label)
                if _BAD_NAME_CHARS.search(user) or user.startswith("-"):
                    self.fail(value, f"user {user!r} is not a valid user name")
                out[key] = user
            elif key == "port":
                out[key] = self.integer(value, label, 1, 65535)
            elif key == "slots":
                out[key] = self.integer(value, label, 1, 1024)
            elif key == "local":
                out[key] = self.boolean(value, label)
            elif key == "identity_file":
                out[key] = self.local_path(value, label)
            elif key in ("python", "workdir", "model_store", "mpi_lib_dir", "mesh_identity_file"):
                out[key] = self.string(value, label)
            elif key == "env":
                out[key] = self.env(value)
                out["secret_env"] = tuple(k.value for k, v in value.value if v.tag == SECRET_TAG) \
                    if isinstance(value, yaml.MappingNode) else ()
            elif key == "rdma":
                out[key], out["rdma_line"], out["rdma_node"] = self.rdma(value), value.start_mark.line + 1, value
        return out

    def env(self, node: yaml.Node) -> tuple[tuple[str, str], ...]:
        out: dict[str, str] = {}
        for name, (key_node, value_node) in self.mapping(node, "env", None).items():
            if not _ENV_NAME.match(name):
                self.fail(key_node, f"env name {name!r} is not a valid variable name "
                          "(letters, digits and _; not starting with a digit)")
            # `!secret 'value'`: a string like any other, kept out of records (is_secret)
            value = value_node.value if value_node.tag == SECRET_TAG and isinstance(value_node, yaml.ScalarNode) \
                else self.scalar(value_node)
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                self.fail(value_node, f"env value of {name} must be a string (quote it), "
                          f"not {_kind(value_node, value)}")
            out[name] = str(value)
        return tuple(out.items())

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
                self.fail(extra_node, f"mpi.extra_args must be a list of strings, not {_kind(extra_node)}")
            extra = tuple(self.string(item, "each of mpi.extra_args") for item in extra_node.value)
        return MPISettings(links, if_include, extra)

    def launch(self, node: yaml.Node) -> LaunchSettings:
        entries = self.mapping(node, "launch", LAUNCH_KEYS)
        backend, line = "mpi", None
        if "backend" in entries:
            # which names exist is the launch backends' business (clusterctl.launch.backends.validated)
            backend = self.string(entries["backend"][1], "launch.backend")
            line = entries["backend"][1].start_mark.line + 1
        connections = DEFAULT_CONNECTIONS_PER_IP
        if "connections_per_ip" in entries:
            connections = self.integer(entries["connections_per_ip"][1], "launch.connections_per_ip", 1, 64)
        return LaunchSettings(backend, connections, line)


_MERGE = "tag:yaml.org,2002:merge"
_NOT_SCALAR = object()


def _kind(node: yaml.Node, value: Any = _NOT_SCALAR) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if value is _NOT_SCALAR:
        return "a scalar"
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    return f"'{value}'"
