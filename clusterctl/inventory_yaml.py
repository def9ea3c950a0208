"""An inventory's YAML read node by node (inventory.py's parser is built on it): every value checked as it is
read, every refusal one InventoryError naming the file and line (`inventory.yaml:12: port must be a whole
number from 1 to 65535`).

PyYAML's node tree is walked instead of plain `yaml.safe_load` so that every error names the line it comes
from, and so that duplicate keys, which safe_load silently collapses, are reported.

    reader = NodeReader(text, path, base_dir)
    entries = reader.mapping(reader.root(), "the inventory", allowed)   # key -> (key node, value node)
    reader.string(node, "python"), reader.integer(node, "port", 1, 65535), reader.local_path(node, ...)
    reader.host_name(node), reader.address(node, ...), reader.env(node), reader.rdma(node)   # a host's values
    whole(1, 1024)          # a reader of whole numbers in a range, for a key's declaration (inventory.key)

A value reader takes (node, what: the key as the message names it) and returns the value.
"""
from __future__ import annotations

import difflib
import ipaddress
import os
import re
import unicodedata
from typing import Any, Callable

import yaml

from .errors import InventoryError

SECRET_TAG = "!secret"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BAD_NAME_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")
# OpenSSH refuses host names holding these (ssh.c valid_hostname); so do we, with the line number.
_SHELL_CHARS = re.compile(r"['`\"$\\;&<>|(){}]")
# ssh_config reads these in a Host line as patterns (or %-tokens in HostName): clusterctl writes one per host.
_PATTERN_CHARS = re.compile(r"[*?!,%\[\]]")
# An RDMA device as `ibv_devices` names it on a Mac (rdma_en2): docs/facts/macos.md#jaccl
_RDMA_DEVICE = re.compile(r"[A-Za-z0-9_.-]+\Z")
_MERGE = "tag:yaml.org,2002:merge"
_NOT_SCALAR = object()


class NodeReader:
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
            self.fail(node, f"{what} must be a mapping of key: value, not {kind(node)}")
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
                self.fail(key_node, f"keys in {what} must be plain words, not {kind(key_node, self.scalar(key_node))}")
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

    # ---- plain values -------------------------------------------------------------------------
    def string(self, node: yaml.Node, what: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str):
            self.fail(node, f"{what} must be a string, not {kind(node, value)}")
        if value == "":
            self.fail(node, f"{what} must not be empty")
        if "\x00" in value:
            self.fail(node, f"{what} must not contain a NUL character")
        return value

    def integer(self, node: yaml.Node, what: str, low: int, high: int) -> int:
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(node, f"{what} must be a whole number from {low} to {high}, not {kind(node, value)}")
        return value

    def boolean(self, node: yaml.Node, what: str) -> bool:
        value = self.scalar(node)
        if not isinstance(value, bool):
            self.fail(node, f"{what} must be true or false, not {kind(node, value)}")
        return value

    def local_path(self, node: yaml.Node, what: str) -> str:
        value = os.path.expanduser(self.string(node, what))
        return os.path.normpath(os.path.join(self.base_dir, value))

    # ---- a host's values ----------------------------------------------------------------------
    def host_name(self, node: yaml.Node, what: str = "host name") -> str:
        """A host's name (or hostname): every message says "host name", whichever key holds it."""
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

    def address(self, node: yaml.Node, what: str) -> str:
        text = self.string(node, what)
        try:    # docs/facts/mlx-distributed.md#ring-is-ipv4-only
            ipaddress.IPv4Address(text)
        except ValueError:
            self.fail(node, f"address must be an IPv4 address such as 192.168.10.1, not '{text}' "
                      "(MLX's ring backend is IPv4 only)")
        return text

    def user(self, node: yaml.Node, what: str) -> str:
        user = self.string(node, what)
        if _BAD_NAME_CHARS.search(user) or user.startswith("-"):
            self.fail(node, f"user {user!r} is not a valid user name")
        return user

    def env(self, node: yaml.Node, what: str = "env") -> tuple[tuple[str, str], ...]:
        out: dict[str, str] = {}
        for name, (key_node, value_node) in self.mapping(node, "env", None).items():
            if not _ENV_NAME.match(name):
                self.fail(key_node, f"env name {name!r} is not a valid variable name "
                          "(letters, digits and _; not starting with a digit)")
            # `!secret 'value'`: a string like any other, kept out of records (inventory.is_secret)
            value = value_node.value if value_node.tag == SECRET_TAG and isinstance(value_node, yaml.ScalarNode) \
                else self.scalar(value_node)
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                self.fail(value_node, f"env value of {name} must be a string (quote it), "
                          f"not {kind(value_node, value)}")
            out[name] = str(value)
        return tuple(out.items())

    def rdma(self, node: yaml.Node, what: str = "rdma") -> tuple[str | tuple[str, ...] | None, ...]:
        """A host's `rdma` list, MLX's layout (docs/facts/macos.md#jaccl): per rank, null or a device name or a
        list of device names. Its length and self entries are checked once every host's rank is known."""
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, "rdma must be a list with one entry per rank of the cluster (the RDMA device this "
                      f"host reaches that rank through, null for its own), not {kind(node, self.scalar(node))}")
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
                          f"not {'an empty list' if isinstance(item, yaml.SequenceNode) else kind(item)}")
        return tuple(entries)

    def rdma_device(self, node: yaml.Node, what: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str) or not _RDMA_DEVICE.match(value):
            shown = kind(node, value) if not isinstance(value, str) else repr(value)
            self.fail(node, f"{what} must be a device name such as rdma_en2 (letters, digits, _ - .), not {shown}")
        return value


def whole(low: int, high: int) -> Callable[[NodeReader, yaml.Node, str], int]:
    """A value reader of whole numbers from `low` to `high`."""
    return lambda reader, node, what: reader.integer(node, what, low, high)


def secret_names(node: yaml.MappingNode) -> tuple[str, ...]:
    """The names an `env` mapping (already read) marks `!secret`."""
    return tuple(k.value for k, v in node.value if v.tag == SECRET_TAG)


def kind(node: yaml.Node, value: Any = _NOT_SCALAR) -> str:
    """What a node is, as a message says it: a mapping, a list, the number 5, 'text'."""
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
