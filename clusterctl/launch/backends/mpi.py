"""MLX's `mpi` backend, started by Open MPI's mpirun: its registry entry and mpirun's command line.

    argv = mpirun_argv(cluster, hostfile=path, program=[python, "t.py"], env=rank_env, rsh_agent=agent)

One source of truth for every `--mca`: clusterctl's own settings, with any `--mca KEY VALUE` in the
inventory's mpi.extra_args replacing ours for the same KEY instead of repeating it.
"""
from __future__ import annotations

import os
import shutil
from typing import Mapping, Sequence

from ...hosts.openssh import rsh_agent
from ...inventory import Cluster
from .base import Backend, BackendSpec, LauncherCommand, SmokeTest, Tuning

# docs/facts/mlx-distributed.md#mlx-mpi-libname, docs/facts/mlx-distributed.md#mpi-backend-needs-open-mpi
INIT_FIX = "MLX could not load libmpi: set `mpi_lib_dir:` (or MLX_MPI_LIBNAME in env) to the Open MPI libmpi{libmpi}; " \
           "MLX needs Open MPI"


class MPIBackend(Backend):
    """MLX's `mpi` backend, started by Open MPI's mpirun over an Open MPI hostfile. mpirun's daemons ssh
    to the hosts with our OpenSSH options (plm_rsh_agent); every variable reaches python through `-x`."""

    # no peers variable: mpirun tells the ranks their peers. bench --tune tries btl_tcp_links and the subnets
    spec = BackendSpec("mpi", benchmarked=True, smoke=SmokeTest(("mpirun",), INIT_FIX),
                       tuning=Tuning("btl_tcp_links", "mpi", subnets=True))
    launcher_name, hostfile_format, hostfile_name = "mpirun", "openmpi", "hostfile"
    mpi4py_reference, needs_mpi = True, True
    stdin_to_rank0_only = True        # docs/facts/launchers.md#mpirun-stdin-all
    exit_is_every_ranks = True        # docs/facts/launchers.md#mpirun-exit-status
    install_hint = ("install Open MPI here too (macOS: brew install open-mpi; Debian: apt install openmpi-bin), or "
                    "run clusterctl from one of the hosts")

    def launcher_here(self):
        # by its absolute path: Open MPI then starts its daemons on the other hosts from the same prefix, so
        # they need not be on sshd's PATH there (docs/facts/launchers.md#mpirun-absolute-path)
        found = shutil.which("mpirun")
        return [os.path.abspath(found)] if found else None

    def launcher_on_host(self, python, mpirun=None):
        return [mpirun or "mpirun"]

    def lost_peers(self):
        return ("MLX could not join the ranks: under mpirun it could not load libmpi (MLX_MPI_LIBNAME, "
                "LD_LIBRARY_PATH / DYLD_FALLBACK_LIBRARY_PATH; see clusterctl doctor)")

    def command(self, cluster, plan, *, program, rank_env, where, hostfile=None, cwd=None):
        files = []
        if hostfile is None:
            hostfile = os.path.join(where.dir, self.hostfile_name)
            files.append((hostfile, self.hostfile(cluster), None))
        program = [plan.python(cluster), *program[1:]]      # mpirun execs it without a shell
        argv = mpirun_argv(cluster, hostfile=hostfile, program=program, env=rank_env,
                           rsh_agent=rsh_agent(list(where.ssh_options)),
                           if_include=plan.if_include, as_root=where.as_root,
                           mpirun=(where.launcher or ["mpirun"])[0], wdir=cwd)
        return LauncherCommand(argv, files, env_values=dict(rank_env))


# ---- the pure builder ---------------------------------------------------------------------------------

def mca_settings(cluster: Cluster, rsh_agent: str, if_include: str | None) -> dict[str, str]:
    # docs/facts/launchers.md#open-mpi-rsh-agent, docs/facts/launchers.md#btl-tcp-links
    mca = {"plm_rsh_agent": rsh_agent, "btl_tcp_links": str(cluster.mpi.btl_tcp_links)}
    include = cluster.mpi.if_include or if_include
    if include:
        # Only the rank-to-rank traffic: mpirun's own control connections (oob) must still reach the
        # machine mpirun runs on, which need not sit on the data-plane subnet (docs/facts/launchers.md#btl-tcp-if-include).
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
                mpirun: str = "mpirun", wdir: str | None = None) -> list[str]:
    """The full mpirun command (ours, not `mlx.launch --backend mpi`'s: docs/facts/launchers.md#mlx-launch-mpi-backend):
    hostfile, one rank per slot, our MCA settings merged with the user's, `-x NAME` for every environment
    variable (its value taken from mpirun's own environment, where LauncherCommand.env_values puts it: never
    on a command line; mpirun passes it to the ranks straight, so macOS SIP cannot strip DYLD_* on the way,
    docs/facts/macos.md#sip-strips-dyld), then the program."""
    ours = mca_settings(cluster, rsh_agent, if_include)
    theirs, rest = _split_user_mca(cluster.mpi.extra_args)
    argv = [mpirun]
    if as_root:     # docs/facts/launchers.md#allow-run-as-root
        argv.append("--allow-run-as-root")
    argv += ["--hostfile", hostfile, "-np", str(cluster.world_size)]
    if wdir:
        argv += ["-wdir", wdir]
    for key, value in {**ours, **theirs}.items():
        argv += ["--mca", key, value]
    for key in env:
        argv += ["-x", key]
    return argv + rest + ["--", *program]
