"""What a detached run's supervisor is given, as one JSON file (0600: it holds the inventory's env values) in
its run directory on the supervising host (pure but for reading and writing that file):

    handoff = Handoff(run_id, supervisor="h1", cluster=as_seen_from(cluster, "h1"), argv=[...], extra_env={...},
                      host_env={...}, command="run")          # or command="serve", stored={host: path}
    write(path, handoff); read(path)

The cluster travels whole (every Host field), as this machine resolved it (--env applied, data-plane addresses
found), so the supervisor needs no inventory file and no ssh_config of this machine. Seen from a host, every host
is reached the way the hosts reach each other (setup mesh): with the key `mesh_identity_file` names on the hosts
(docs/setup.md), through the inventory's `ssh_config` only when that file is on the host too (the supervisor
drops it otherwise: hosts.openssh renders the rest).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..atomic import write_text
from ..errors import UsageError
from ..inventory import Cluster, Host, LaunchSettings, MPISettings

VERSION = 1


@dataclass(frozen=True)
class Handoff:
    run_id: str
    supervisor: str                      # the host it runs on
    cluster: Cluster                     # as seen from that host
    argv: tuple[str, ...]                # the command's own arguments, this run's (no --detach, no --hosts)
    extra_env: dict[str, str] = field(default_factory=dict)              # what staging gave every rank
    host_env: dict[str, dict[str, str]] = field(default_factory=dict)    # ... and each host's ranks
    command: str = "run"                 # the clusterctl command the supervisor is: run, or serve
    stored: dict[str, str] = field(default_factory=dict)   # serve: where each host's rank reads the model


def as_seen_from(cluster: Cluster, host: str) -> Cluster:
    """The cluster as `host` reaches it: every host with its mesh key as identity (this machine's identity_file
    is a path here), where the inventory names one; `host` itself too, reached over SSH like the others (its ranks
    are a job's ranks like any other's: the same watchdog, the same sweep)."""
    cluster.host(host)          # KeyError for a name that is not a host
    hosts = tuple(dataclasses.replace(h, identity_file=h.mesh_identity_file) for h in cluster.hosts)
    return dataclasses.replace(cluster, hosts=hosts)


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    return {"path": cluster.path, "ssh_config": cluster.ssh_config, "host_key_checking": cluster.host_key_checking,
            "mpi_settings": dataclasses.asdict(cluster.mpi), "launch": dataclasses.asdict(cluster.launch),
            "hosts": [{f.name: getattr(h, f.name) for f in dataclasses.fields(Host)} for h in cluster.hosts]}


def _tuples(value: Any) -> Any:
    """JSON's lists back as the tuples the inventory's frozen dataclasses hold."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def cluster_from_dict(data: dict[str, Any]) -> Cluster:
    names = {f.name for f in dataclasses.fields(Host)}
    hosts = tuple(Host(**{k: _tuples(v) for k, v in h.items() if k in names}) for h in data["hosts"])
    ssh_config = data.get("ssh_config")
    return Cluster(path=data["path"], hosts=hosts, mpi=MPISettings(**_tuple_fields(data["mpi_settings"])),
                   launch=LaunchSettings(**data["launch"]),
                   ssh_config=ssh_config if ssh_config and os.path.isfile(os.path.expanduser(ssh_config)) else None,
                   host_key_checking=data["host_key_checking"])


def _tuple_fields(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _tuples(v) for k, v in d.items()}


def to_json(handoff: Handoff) -> str:
    return json.dumps({"version": VERSION, "run_id": handoff.run_id, "supervisor": handoff.supervisor,
                       "cluster": cluster_to_dict(handoff.cluster), "argv": list(handoff.argv),
                       "extra_env": handoff.extra_env, "host_env": handoff.host_env, "command": handoff.command,
                       "stored": handoff.stored}, indent=1)


def from_json(text: str, where: str = "handoff") -> Handoff:
    try:
        data = json.loads(text)
        if data.get("version") != VERSION:
            raise UsageError(f"{where}: written by another version of clusterctl (handoff version "
                             f"{data.get('version')}, this one reads {VERSION})")
        return Handoff(data["run_id"], data["supervisor"], cluster_from_dict(data["cluster"]), tuple(data["argv"]),
                       dict(data.get("extra_env") or {}), {k: dict(v) for k, v in (data.get("host_env") or {}).items()},
                       str(data.get("command") or "run"), dict(data.get("stored") or {}))
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{where}: not a detached run's handoff ({type(e).__name__}: {e})") from None


def write(path: str, handoff: Handoff) -> None:
    write_text(path, to_json(handoff), mode=0o600)


def read(path: str) -> Handoff:
    try:
        with open(path, encoding="utf-8") as f:
            return from_json(f.read(), path)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
