"""Pure builders for launcher command lines: the OpenMPI hostfile and the mpirun argv.

One source of truth for every `--mca`: clusterctl's own settings, with any `--mca KEY VALUE` in the
inventory's mpi.extra_args replacing ours for the same KEY instead of repeating it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from .inventory import Cluster


def render_openmpi_hostfile(cluster: Cluster) -> str:
    """`name slots=N`, one line per host, in rank order (OpenMPI fills each host's slots in turn)."""
    return "".join(f"{h.name} slots={h.slots}\n" for h in cluster.hosts)


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
