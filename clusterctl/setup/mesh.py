"""`clusterctl setup mesh`: passwordless SSH between every pair of hosts, safely, idempotently, reversibly.

    result = setup_mesh(connector, dry_run=False)     # or undo_mesh(connector)

1. prepare, every host at once (hosts/scripts/mesh.sh): the host's mesh key pair, made there if missing
   (`mesh_identity_file:`, default ~/.ssh/clusterctl_mesh); only its public half comes back;
2. every host's host key is the one this machine's own connection to it verified (known_hosts, or accept-new
   the first time, as every clusterctl connection): no host trusts another on first use;
3. apply, every host at once: every host's public key into its authorized_keys and every host's host key into
   its known_hosts, under the names and ports the launch uses (the inventory name, `hostname:`, `address:`),
   each line marked ` clusterctl-mesh:HOST`; a line already there is left alone, so a second run changes nothing;
4. the inventory's `mesh_identity_file` is set when it names none (the original text is kept for --undo);
5. doctor's mesh check, with the settings the launch uses.
`undo_mesh` removes exactly what setup added, each file restored byte for byte. No password is ever typed or
stored: this machine's login to each host must already work.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

from ..atomic import write_text
from ..errors import ClusterctlError, UsageError
from ..hosts.connector import Connector
from ..hosts.fanout import run_all
from ..hosts import hostscript
from ..hosts.hostscript import HostPath
from ..inventory import Cluster, Host
from ..inventory_edit import write_setting
from . import exit_code, run_script

DEFAULT_KEY = "~/.ssh/clusterctl_mesh"
MARK = "clusterctl-mesh:"
TIMEOUT_S = 60.0


@dataclass
class HostChanges:
    host: str
    changes: list[str] = field(default_factory=list)      # what changed (or would, in a dry run)
    error: str | None = None
    unreachable: bool = False         # the error: this machine could not log in to it


@dataclass
class MeshResult:
    hosts: list[HostChanges]
    inventory_change: str | None = None
    mesh_pairs: int = 0               # doctor's ssh-mesh findings that passed ...
    mesh_failed: list[str] = field(default_factory=list)  # ... and those that did not, as one line each

    @property
    def changed(self) -> int:
        return sum(len(h.changes) for h in self.hosts) + (self.inventory_change is not None)

    @property
    def ok(self) -> bool:
        return not any(h.error for h in self.hosts) and not self.mesh_failed

    @property
    def exit_code(self) -> int:
        return exit_code(self.ok, self.hosts)

    def as_dict(self, dry_run: bool, undo: bool) -> dict:
        return {"ok": self.ok, "changed": self.changed, "dry_run": dry_run, "undo": undo,
                "hosts": [{"host": h.host, "changes": h.changes, "error": h.error} for h in self.hosts],
                "inventory": self.inventory_change, "mesh_pairs_ok": self.mesh_pairs, "mesh_failed": self.mesh_failed}

    def report(self, dry_run: bool, undo: bool) -> tuple[list[str], list[str]]:
        """(lines for stdout, lines for stderr): each change by host, failures, doctor's verdict."""
        out, err = [], []
        for h in self.hosts:
            if h.error:
                err.append(f"{h.host}: failed: {h.error}")
            out += [f"{h.host}: {change}" for change in h.changes]
        if self.inventory_change:
            out.append(self.inventory_change)
        if self.changed == 0 and self.ok:
            out.append("nothing to undo" if undo else "nothing to change")
        if not undo and not dry_run and not any(h.error for h in self.hosts):
            err += [f"mesh: {line}" for line in self.mesh_failed]
            n = len(self.hosts)
            out.append(f"doctor's mesh check: {self.mesh_pairs} of {n * (n - 1)} host pairs log in"
                       + ("" if self.mesh_failed else " (all)"))
        return out, err


def key_path(host: Host) -> str:
    return host.mesh_identity_file or DEFAULT_KEY


def known_hosts_line(host: Host, key_type: str, key_b64: str) -> str:
    """`host`'s key as its peers' known_hosts must hold it: under every name the launch may use for it
    (the inventory name, HostName, the data-plane address), `[name]:port` when the port is not 22."""
    names = list(dict.fromkeys(n for n in (host.name, host.hostname, host.address) if n))
    port = host.port or 22
    patterns = [n if port == 22 else f"[{n}]:{port}" for n in names]
    return f"{','.join(patterns)} {key_type} {key_b64} {MARK}{host.name}"


def authorized_keys_line(host: Host, public_key: str) -> str:
    """`host`'s mesh public key as a line of its peers' authorized_keys, its comment our mark."""
    words = public_key.split()
    if len(words) < 2:
        raise ClusterctlError(f"{host.name}: the public half of its mesh key is not a key: {public_key[:60]!r}")
    return f"{words[0]} {words[1]} {MARK}{host.name}"


def script(mode: str, host: Host, dry_run: bool, auth: str = "", known: str = "") -> str:
    values = {"MODE": mode, "DRY": "yes" if dry_run else "no", "KEY": HostPath(key_path(host)), "NAME": host.name,
              "AUTH": auth, "KNOWN": known}
    return hostscript.shell("mesh.sh", values)


def _run_script(connector: Connector, text_for, hosts) -> dict[str, tuple[list[str], str | None, bool]]:
    """Each host's (output lines, error or None, whether it was unreachable) for the script text_for(host)."""
    return {name: (stdout.splitlines(), error, unreachable)
            for name, (stdout, error, unreachable) in run_script(connector, hosts, text_for, TIMEOUT_S).items()}


def _host_keys(connector: Connector, hosts) -> dict[str, tuple[str, str] | None]:
    """Each host's key as this machine's authenticated connection saw it (None for a `local:` host)."""
    def one(host: Host):
        with connector.transport(host) as t:
            return t.host_key()

    group = run_all(hosts, one, connector.deadline(TIMEOUT_S))
    return {name: (o.value if o.error is None else None) for name, o in group.items()}


def _changes(lines: list[str]) -> list[str]:
    return [line.split(" ", 1)[1] if line.startswith("change ") else line
            for line in lines if line.startswith(("change ", "would "))]


def setup_mesh(connector: Connector, dry_run: bool = False, check: bool = True) -> MeshResult:
    """Set up the mesh of connector's cluster (see the module's docstring), then (`check`) run doctor's
    mesh check on the inventory as setup left it."""
    cluster = connector.cluster
    hosts = list(cluster.hosts)
    prepared = _run_script(connector, lambda h: script("prepare", h, dry_run), hosts)
    result = MeshResult([HostChanges(h.name, _changes(prepared[h.name][0]), *prepared[h.name][1:]) for h in hosts])
    if any(h.error for h in result.hosts):
        return result
    pubs = {h.name: next((line[4:] for line in prepared[h.name][0] if line.startswith("pub ")), None) for h in hosts}
    host_keys = _host_keys(connector, hosts)
    auth = "\n".join(authorized_keys_line(h, pubs[h.name]) for h in hosts if pubs[h.name])
    known = "\n".join(known_hosts_line(h, *host_keys[h.name]) for h in hosts if host_keys[h.name])
    applied = _run_script(connector, lambda h: script("apply", h, dry_run, auth, known), hosts)
    for changes in result.hosts:
        lines, error, changes.unreachable = applied[changes.host]
        changes.changes += _changes(lines)
        if dry_run and pubs[changes.host] is None:
            changes.changes.append("would add its new key's line to every host's authorized_keys")
        changes.error = error
    for h in hosts:
        if host_keys[h.name] is None:
            next(c for c in result.hosts if c.host == h.name).changes.append(
                "its host key is not known to this machine's connection (a `local:` host): peers log in to it "
                "with their own host-key policy")
    if any(h.error for h in result.hosts):
        return result
    result.inventory_change = _set_identity(cluster, dry_run)
    if check and not dry_run:
        result.mesh_pairs, result.mesh_failed = mesh_check(connector)
    return result


def mesh_check(connector: Connector) -> tuple[int, list[str]]:
    """Doctor's ssh-mesh check (no deep checks) on the inventory as it is now: (pairs that passed, a line
    for each that did not)."""
    from ..doctor import DoctorOptions, run_doctor
    from ..inventory_load import load_cluster

    cluster = load_cluster(connector.cluster.path) if os.path.isfile(connector.cluster.path) else connector.cluster
    fresh = Connector(cluster, connector.host_key_checking, connector.connect_timeout)
    report = run_doctor(fresh, DoctorOptions(deep=False))
    mesh = [f for f in report.findings if f.check == "ssh-mesh"]
    return (sum(f.status == "pass" for f in mesh),
            [f"{f.host} -> {f.peer}: {f.detail}" for f in mesh if f.status != "pass"])


def _state_path(cluster: Cluster) -> str:
    """Where the inventory's text before setup is kept (this machine, private): for --undo."""
    digest = hashlib.sha256(os.path.realpath(cluster.path).encode()).hexdigest()[:24]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "clusterctl", "setup", f"mesh-{digest}.json")


def _set_identity(cluster: Cluster, dry_run: bool) -> str | None:
    if any(h.mesh_identity_file for h in cluster.hosts) or not os.path.isfile(cluster.path):
        return None
    if dry_run:
        return f"would set defaults.mesh_identity_file: {DEFAULT_KEY} in {cluster.path}"
    real = os.path.realpath(cluster.path)
    with open(real, encoding="utf-8") as f:
        before = f.read()
    if not write_setting(cluster.path, "defaults", "mesh_identity_file", json.dumps(DEFAULT_KEY)):
        return None
    state = _state_path(cluster)
    if not os.path.exists(state):
        os.makedirs(os.path.dirname(state), mode=0o700, exist_ok=True)
        write_text(state, json.dumps({"inventory": real, "text": before}) + "\n", mode=0o600)
    return f"set defaults.mesh_identity_file: {DEFAULT_KEY} in {cluster.path}"


def undo_mesh(connector: Connector, dry_run: bool = False) -> MeshResult:
    """Remove exactly what setup_mesh added, on every host and in the inventory."""
    cluster = connector.cluster
    done = _run_script(connector, lambda h: script("undo", h, dry_run), list(cluster.hosts))
    result = MeshResult([HostChanges(h.name, _changes(done[h.name][0]), *done[h.name][1:]) for h in cluster.hosts])
    state = _state_path(cluster)
    if os.path.isfile(state):
        try:
            with open(state, encoding="utf-8") as f:
                kept = json.load(f)
        except (OSError, ValueError) as e:
            raise UsageError(f"{state}: cannot read what setup changed in the inventory ({e}); remove "
                             "mesh_identity_file from it by hand") from None
        if dry_run:
            result.inventory_change = f"would restore {cluster.path} as it was before setup mesh"
        else:
            real = os.path.realpath(cluster.path)
            write_text(real, kept["text"], mode=os.stat(real).st_mode & 0o777)
            os.remove(state)
            result.inventory_change = f"restored {cluster.path} as it was before setup mesh"
    return result
