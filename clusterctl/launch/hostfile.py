"""Hostfiles rendered from templates/: Open MPI (`name slots=N`), MPICH (`name:N`) and mlx.launch JSON.

Text templates use one convention: a line starting with `@host ` is repeated for every host, in rank order,
with $name, $slots, $rank, $address, $python and $workdir; every other line is rendered once with
$inventory and $version. The mlx.launch JSON template fills whole JSON values: $backend, $envs, $hosts.
A placeholder without a value is an error, never left in the output.
"""
from __future__ import annotations

import json
import string
from typing import Mapping

from ..errors import TemplateError
from ..inventory import Cluster
from ..resources import template_text
from . import mlxenv

FORMATS = {"openmpi": "hostfile.openmpi.tmpl", "mpich": "hostfile.mpich.tmpl", "mlx": "hostfile.mlx.json.tmpl"}


def render(cluster: Cluster, fmt: str, template: str | None = None, *, backend: str | None = None,
           env: Mapping[str, str] | None = None, template_name: str = "template", rdma: bool = False) -> str:
    """The hostfile's text. For mlx: `backend` names the MLX backend (default the inventory's), and `rdma`
    adds each host's `rdma` list (the jaccl backends: docs/facts/macos.md#jaccl)."""
    text = template if template is not None else template_text(FORMATS[fmt])
    try:
        if fmt == "mlx":
            return _render_mlx(cluster, text, backend or cluster.launch.backend,
                               env if env is not None else cluster.hosts[0].env_dict, rdma)
        return _render_lines(cluster, text)
    except KeyError as e:
        raise TemplateError(f"{template_name}: unknown placeholder ${e.args[0]}") from None
    except ValueError as e:
        raise TemplateError(f"{template_name}: {e}") from None


def _render_lines(cluster: Cluster, text: str) -> str:
    once = {"inventory": cluster.path, "version": _version()}
    out = []
    for line in text.splitlines():
        if line.startswith("@host "):
            body = string.Template(line[len("@host "):])
            for h in cluster.hosts:
                out.append(body.substitute(once, name=h.name, slots=h.slots, rank=h.rank,
                                           address=h.address or "", python=h.python, workdir=h.workdir))
        else:
            out.append(string.Template(line).substitute(once))
    return "\n".join(out) + "\n"


def mlx_hosts(cluster: Cluster, rdma: bool = False) -> list[dict]:
    """mlx.launch's host list, one entry per rank (docs/facts/launchers.md#mlx-launch-hostfile-format). This
    machine is `127.0.0.1`, the only name mlx.launch runs without ssh (docs/facts/launchers.md#mlx-launch-runs-ssh-tt).
    With `rdma`, each entry carries its host's `rdma` list (a list of devices stays a list; null where the
    inventory has none)."""
    hosts = []
    for h, ips in zip(mlxenv.rank_hosts(cluster), mlxenv.rank_ips(cluster)):
        entry: dict = {"ssh": mlxenv.LOCAL_IP if h.local else h.name, "ips": ips}
        if rdma:
            entry["rdma"] = None if h.rdma is None else [list(e) if isinstance(e, tuple) else e for e in h.rdma]
        hosts.append(entry)
    return hosts


def _render_mlx(cluster: Cluster, text: str, backend: str, env: Mapping[str, str], rdma: bool) -> str:
    rendered = string.Template(text).substitute(
        backend=json.dumps(backend), envs=json.dumps([f"{k}={v}" for k, v in env.items()]),
        hosts=json.dumps(mlx_hosts(cluster, rdma)))
    try:
        return json.dumps(json.loads(rendered), indent=2) + "\n"
    except ValueError as e:
        raise ValueError(f"the rendered mlx.launch hostfile is not JSON: {e}") from None


def _version() -> str:
    from .. import __version__
    return __version__
