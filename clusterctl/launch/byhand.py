"""`clusterctl hostfile`: the hostfile for the inventory and, asked for, the launcher line that runs a
program across the hosts by hand from this machine, as `run` would launch it.

    text, line = hostfile_and_command(connector, "openmpi", output="hosts.txt", program=["train.py"])
"""
from __future__ import annotations

import os

from ..atomic import write_text
from ..errors import UsageError
from ..hosts.connector import Connector
from ..inventory import Cluster
from . import backends
from .hostfile import render as render_hostfile
from .plan import LaunchPlan, discover
from .site import LaunchSite


def hostfile_and_command(connector: Connector, fmt: str, *, output: str | None, template: str | None = None,
                         template_name: str = "template", program: list[str] | None = None) -> tuple[str, str | None]:
    """The hostfile's text (written to `output` when given) and, with `program` (a script and its
    arguments), the launcher line that runs it by hand from this machine with the environment and tuning
    `run` would use (found on the hosts, as `run` finds it), reaching the hosts with the connector's settings."""
    cluster = connector.cluster
    backend, plan = None, None
    if program is not None:
        backend = backends.for_hostfile(fmt, cluster.launch.backend)
        plan = discover(connector)
    mlx_backend = backends.for_hostfile("mlx", cluster.launch.backend)
    text = render_hostfile(cluster, fmt, template, backend=mlx_backend.name, rdma=mlx_backend.rdma is not None,
                           env=(plan or LaunchPlan.from_inventory(cluster)).env, template_name=template_name)
    if output:
        write_text(output, text)
    if backend is None:
        return text, None
    launcher = backend.launcher_here()
    if launcher is None:
        raise UsageError(f"{backend.launcher_name} is not installed on this machine ({backend.install_hint})")
    site = LaunchSite.here(connector, launcher, os.path.abspath(output) + ".ssh")
    # with the hosts' workdir as the ranks' directory, so a relative path in the arguments means what it
    # means under `run` (mpirun -wdir, mlx.launch --cwd)
    command = backend.command(cluster, plan, program=[cluster.hosts[0].python, *program], rank_env=plan.env,
                              where=site, hostfile=os.path.abspath(output), cwd=common_workdir(cluster))
    backends.write_files(command)
    return text, command.by_hand()


def common_workdir(cluster: Cluster) -> str | None:
    """The directory a launch line run by hand should start ranks in: the hosts' workdir when they share
    one, `~/x` written as `x` (a remote rank starts in its home directory; mpirun and mlx.launch would not
    expand `~`); None when the hosts' workdirs differ or are the home directory itself."""
    dirs = {h.workdir for h in cluster.hosts}
    if len(dirs) != 1:
        return None
    workdir = dirs.pop()
    if workdir in ("~", "~/"):
        return None
    return workdir[2:] if workdir.startswith("~/") else workdir
