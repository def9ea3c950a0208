"""Writing inventories: a starter one for `clusterctl init`, and one setting changed in an existing one.

Change one setting of an inventory file and nothing else: comments, order, quoting and blank lines stay.

A YAML round trip through a parser would lose the user's comments and layout, so the edit is made in the
text, at the place PyYAML's composer says the value sits (its start/end marks). A missing key is inserted
as the first entry of its section (with the indentation of the section's entries); a missing section is
appended at the end of the file. The result is parsed again before it is written (atomically), so an edit
can never leave an inventory clusterctl refuses to read.
"""
from __future__ import annotations

import json
import os
import stat

import yaml

from .atomic import write_text
from .errors import InventoryError, UsageError
from .inventory import DEFAULT_MODEL_STORE, DEFAULT_PYTHON, DEFAULT_WORKDIR, parse
from .resources import render, template_text


# The defaults a starter inventory names: (key, the commented example shown when init is not given it, what it is).
# Given, a key is written as a value; left out, the line shows where it goes and ~/.ssh/config (or the built-in
# default) decides.
STARTER_DEFAULTS = (
    ("user", "alice", "SSH user (default: ~/.ssh/config's, else your user name)"),
    ("port", "22", "SSH port (default: ~/.ssh/config's, else 22)"),
    ("identity_file", "~/.ssh/id_ed25519", "key on this machine (default: ~/.ssh/config's, else ssh's own)"),
    ("python", DEFAULT_PYTHON, "the python with mlx on every host: give its full path"),
    ("workdir", DEFAULT_WORKDIR, "where code and shards land on each host"),
    ("model_store", DEFAULT_MODEL_STORE, "where `clusterctl models push` keeps models on each host"),
    ("slots", "1", "ranks per host"),
)


def starter_inventory(names: list[str], *, settings: dict[str, str | int | None], addresses: list[str],
                      backend: str, date: str, path: str = "inventory.yaml", rdma: bool = False) -> str:
    """The text `clusterctl init` writes: templates/inventory.yaml.tmpl with these hosts, validated. `settings`:
    values for STARTER_DEFAULTS' keys (None: left out, shown commented). With `rdma` (a jaccl backend) each host
    gets a commented `rdma:` line of the right shape to fill in: only the hosts know their devices
    (`ibv_devices`), and every command names the host that still lacks one. A value the inventory would refuse
    is a UsageError naming its option (`--port 70000: ...`)."""
    if addresses and len(addresses) != len(names):
        raise UsageError(f"{len(addresses)} --address values for {len(names)} hosts")
    q = json.dumps   # a JSON string is a valid YAML scalar: names and paths stay literal
    defaults, given = [], {}
    for key, example, meaning in STARTER_DEFAULTS:
        value = settings.get(key)
        if value is None:
            defaults.append(f"  # {key}: {example}".ljust(44) + f"# {meaning}")
        else:
            given[len(defaults)] = key
            defaults.append(f"  {key}: {value if isinstance(value, int) else q(value)}")
    host_lines = []
    for i, name in enumerate(names):
        host_lines.append(f"  - name: {q(name)}")
        if addresses:
            host_lines.append(f"    address: {q(addresses[i])}")
        if rdma:
            devices = ", ".join("null" if j == i else f"rdma_enN_to_{j}" for j in range(len(names)))
            host_lines.append(f"    # rdma: [{devices}]   # jaccl: per rank, the device ibv_devices lists here")
    text = render(template_text("inventory.yaml.tmpl"), date=date, defaults="\n".join(defaults),
                  hosts="\n".join(host_lines), backend=backend)
    try:
        parse(text, path)   # never write an inventory we would refuse to read
    except InventoryError as e:
        key = given.get((e.line or 0) - text.splitlines().index(defaults[0]) - 1)   # a line init wrote from an option
        if key is None:
            raise
        raise UsageError(f"--{key.replace('_', '-')} {settings[key]}: {e.message.removeprefix('defaults.')}") from None
    return text


def set_setting(text: str, section: str, key: str, value: str, path: str = "inventory.yaml") -> str:
    """`text` with `section.key` set to `value` (YAML scalar text, e.g. '4' or '"10.0.0.0/24"')."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise InventoryError(path, None, f"cannot edit: not valid YAML ({e})") from None
    if not isinstance(root, yaml.MappingNode):
        raise InventoryError(path, 1, "cannot edit: the inventory is not a mapping")
    section_key, section_node = _entry(root, section)
    if section_node is None:
        return _append_section(text, section, key, value)
    where = section_node.start_mark.line + 1
    if isinstance(section_node, yaml.ScalarNode) and section_node.value in ("", "~", "null"):
        # `mpi:` (or `mpi: ~`) with nothing under it: the entry goes on the next line
        line_end = _line_end(text, section_key.end_mark.index)
        head = (text[:section_node.start_mark.index] + text[section_node.end_mark.index:line_end]).rstrip(" ")
        indent = " " * (section_key.start_mark.column + 2)
        return head + f"\n{indent}{key}: {value}" + text[line_end:]
    if not isinstance(section_node, yaml.MappingNode):
        raise InventoryError(path, where, f"cannot edit: `{section}` is not a mapping")
    return _set_in(text, section_node, section, f"{section}.{key}", key, value, path)


def set_host_setting(text: str, host: str, key: str, value: str, path: str = "inventory.yaml") -> str:
    """`text` with `key` of the host named `host` (its entry under `hosts:`) set to `value` (YAML text: a
    scalar, or a flow list such as '[null, rdma_en2]'). A value already there in flow style is replaced; a
    block list is not (InventoryError: set it by hand)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise InventoryError(path, None, f"cannot edit: not valid YAML ({e})") from None
    _, hosts = _entry(root, "hosts") if isinstance(root, yaml.MappingNode) else (None, None)
    if not isinstance(hosts, yaml.SequenceNode):
        raise InventoryError(path, 1, "cannot edit: the inventory has no `hosts:` list")
    for entry in hosts.value:
        if isinstance(entry, yaml.MappingNode):
            _, name = _entry(entry, "name")
            if isinstance(name, yaml.ScalarNode) and name.value == host:
                return _set_in(text, entry, f"host {host}", f"host {host}'s {key}", key, value, path)
        elif isinstance(entry, yaml.ScalarNode) and entry.value == host:
            raise InventoryError(path, entry.start_mark.line + 1, f"cannot edit: host {host} is a bare name; "
                                 f"write it as `- name: {host}` to give it settings")
    raise InventoryError(path, hosts.start_mark.line + 1, f"cannot edit: no host named {host} under hosts:")


def _set_in(text: str, mapping: yaml.MappingNode, label: str, what: str, key: str, value: str, path: str) -> str:
    """`text` with `key` of the mapping node `mapping` set to `value` (`label`: the mapping, `what`: the setting,
    in messages)."""
    where = mapping.start_mark.line + 1
    key_node, value_node = _entry(mapping, key)
    if value_node is not None:
        if isinstance(value_node, yaml.SequenceNode) and value_node.flow_style:
            return text[:value_node.start_mark.index] + value + text[value_node.end_mark.index:]
        if not isinstance(value_node, yaml.ScalarNode):
            raise InventoryError(path, key_node.start_mark.line + 1,
                                 f"cannot edit: {what} is not written on one line; set it by hand to {value}")
        between = text[key_node.end_mark.index:value_node.start_mark.index]
        if between.strip() != ":" or value_node.start_mark.index < key_node.end_mark.index:
            # an alias (*name) or a tag: the value's text lives elsewhere, or is not a plain scalar
            raise InventoryError(path, key_node.start_mark.line + 1,
                                 f"cannot edit {what}: its value is not written right after the key; "
                                 f"set it by hand to {value}")
        return text[:value_node.start_mark.index] + value + text[value_node.end_mark.index:]
    if mapping.flow_style:
        # {a: 1} -> {key: value, a: 1}; {} -> {key: value}
        opening = mapping.start_mark.index + 1
        rest = text[opening:]
        if mapping.value:
            return text[:opening] + f"{key}: {value}, " + rest.lstrip(" ")
        return text[:opening] + f"{key}: {value}" + rest
    first_key = mapping.value[0][0]
    line_start = text.rfind("\n", 0, first_key.start_mark.index) + 1
    if text[line_start:first_key.start_mark.index].strip():
        if text[line_start:first_key.start_mark.index].strip() == "-":
            # a host entry `- name: a`: the new key goes after the entry's last line, at its keys' column
            end = _line_end(text, _content_end(mapping.value[-1][1]))
            indent = " " * first_key.start_mark.column
            return text[:end] + f"\n{indent}{key}: {value}" + text[end:]
        raise InventoryError(path, where, f"cannot edit: `{label}` does not start on a line of its own")
    indent = " " * first_key.start_mark.column
    return text[:line_start] + f"{indent}{key}: {value}\n" + text[line_start:]


def _content_end(node: yaml.Node) -> int:
    """Where the last character of `node`'s own text is (a block collection's end mark lies past it)."""
    while isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        node = last[1] if isinstance(last, tuple) else last
    return node.end_mark.index


def _entry(mapping: yaml.MappingNode, name: str) -> tuple[yaml.Node | None, yaml.Node | None]:
    for key_node, value_node in mapping.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == name:
            return key_node, value_node
    return None, None


def _line_end(text: str, index: int) -> int:
    end = text.find("\n", index)
    return len(text) if end < 0 else end


def _append_section(text: str, section: str, key: str, value: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + f"{section}:\n  {key}: {value}\n"


def write_setting(path: str, section: str, key: str, value: str) -> bool:
    """Set `section.key` in the inventory at `path` (a symlink's target is edited; the mode is kept).
    Returns False when the file already says exactly that."""
    return _write_edited(path, lambda text: set_setting(text, section, key, value, path))


def write_host_settings(path: str, changes: list[tuple[str | None, str, str]]) -> list[tuple[str | None, str, str]]:
    """Apply (host, key, YAML value) settings to the inventory at `path` in one atomic write (a host of None: the
    `launch` section's key). Returns those that changed the file; a value already written so is left alone."""
    done = []

    def edit(text: str) -> str:
        for host, key, value in changes:
            new = set_setting(text, "launch", key, value, path) if host is None else \
                set_host_setting(text, host, key, value, path)
            if new != text:
                done.append((host, key, value))
                text = new
        return text

    _write_edited(path, edit)
    return done


def _write_edited(path: str, edit) -> bool:
    """The inventory at `path` (a symlink's target; its mode kept) rewritten atomically as edit(its text), when
    that differs and parses (never an inventory we would refuse to read). Whether it was written."""
    real = os.path.realpath(path)
    with open(real, encoding="utf-8") as f:
        text = f.read()
    new = edit(text)
    if new == text:
        return False
    parse(new, path)
    write_text(real, new, mode=stat.S_IMODE(os.stat(real).st_mode))
    return True
