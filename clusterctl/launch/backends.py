"""Pure builders for launcher command lines: mpirun and mlx.launch (hostfiles: hostfile.py).

One source of truth for every `--mca`: clusterctl's own settings, with any `--mca KEY VALUE` in the
inventory's mpi.extra_args replacing ours for the same KEY instead of repeating it.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import Mapping, Sequence

from ..inventory import Cluster


def mca_settings(cluster: Cluster, rsh_agent: str, if_include: str | None) -> dict[str, str]:
    mca = {"plm_rsh_agent": rsh_agent, "btl_tcp_links": str(cluster.mpi.btl_tcp_links)}
    include = cluster.mpi.if_include or if_include
    if include:
        # Only the rank-to-rank traffic: mpirun's own control connections (oob) must still reach the
        # machine mpirun runs on, which need not sit on the data-plane subnet.
        mca["btl_tcp_if_include"] = include
    return mca


def _split_user_mca(extra_args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The user's `--mca KEY VALUE` triples, and everything else in extra_args, in order."""
    mca, rest, i = {}, [], 0
    while i < len(extra_args):
        if extra_args[i] in ("--mca", "-mca") and i + 2 < len(extra_args):
            mca[extra_args[i + 1]] = extra_args[i + 2]
            i += 3
        else:
            rest.append(extra_args[i])
            i += 1
    return mca, rest


def mpirun_argv(cluster: Cluster, *, hostfile: str, program: Sequence[str], env: Mapping[str, str],
                rsh_agent: str, if_include: str | None = None, as_root: bool = False,
                mpirun: str = "mpirun") -> list[str]:
    """The full mpirun command: hostfile, one rank per slot, our MCA settings merged with the user's,
    `-x` for every environment variable (straight to python: macOS SIP cannot strip them), then the
    program."""
    ours = mca_settings(cluster, rsh_agent, if_include)
    theirs, rest = _split_user_mca(cluster.mpi.extra_args)
    argv = [mpirun]
    if as_root:
        argv.append("--allow-run-as-root")
    argv += ["--hostfile", hostfile, "-np", str(cluster.world_size)]
    for key, value in {**ours, **theirs}.items():
        argv += ["--mca", key, value]
    for key, value in env.items():
        argv += ["-x", f"{key}={value}"]
    return argv + rest + ["--", *program]


def mlx_launch_argv(cluster: Cluster, *, hostfile: str, backend: str, python: str, program: Sequence[str],
                    env: Mapping[str, str], cwd: str | None = None, launcher: Sequence[str] = ("mlx.launch",)) -> list[str]:
    """mlx.launch's command line. It does not put python in front of the program itself (0.32), hence
    --python; the JSON hostfile carries the hosts and their data-plane addresses."""
    argv = [*launcher, "--hostfile", hostfile, "--backend", backend, "--python", python]
    if backend == "ring" and cluster.launch.connections_per_ip != 1:
        argv += ["--connections-per-ip", str(cluster.launch.connections_per_ip)]
    if cwd:
        argv += ["--cwd", cwd]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    return argv + ["--", *program]


def write_ssh_shim(directory: str, ssh: str, options: Sequence[str]) -> str:
    """Write the shim as `directory/ssh` (executable) and return `directory`, to put first on a PATH."""
    from ..atomic import write_text

    os.makedirs(directory, exist_ok=True)
    write_text(os.path.join(directory, "ssh"), ssh_shim(ssh, options), mode=0o755)
    return directory


def ssh_shim(ssh: str, options: Sequence[str]) -> str:
    """An `ssh` for mlx.launch's PATH: mlx.launch runs plain `ssh HOST`, so the inventory's options
    (ssh_config, BatchMode, ConnectTimeout, host key policy) reach it only through a wrapper."""
    return "#!/bin/sh\nexec " + shlex.join([ssh, *options]) + ' "$@"\n'


def find_mlx_launch() -> list[str] | None:
    beside = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    if os.access(beside, os.X_OK):
        return [beside]
    found = shutil.which("mlx.launch")
    return [found] if found else None
