"""MLX's own launcher, mlx.launch, for the `ring` and `jaccl` backends: its registry entries (the rank
starter's fallback, `--launcher mlx.launch`), its command line and the `ssh` shim it finds our OpenSSH
options through.

    argv = mlx_launch_argv(cluster, hostfile=path, backend="ring", python=python, program=["t.py"], env={})
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import Mapping, Sequence

from ...errors import LaunchError
from ...inventory import Cluster
from .base import Backend, BackendSpec, LauncherCommand

# mlx.launch's own entry point, for a host where only python (with mlx) is known to be installed
# (a private module: docs/facts/launchers.md#mlx-launch-is-a-module)
MLX_LAUNCH_MODULE = "import sys; from mlx._distributed_utils.launch import main; sys.exit(main())"


class MLXLaunchBackend(Backend):
    """MLX's own launcher, mlx.launch, for the `ring` (TCP) and `jaccl` (Thunderbolt RDMA) backends, over
    its JSON hostfile of the hosts' data-plane addresses. It runs plain `ssh HOST`, so it finds our
    OpenSSH options through an `ssh` shim first on its PATH."""

    launcher_name, hostfile_format, hostfile_name = "mlx.launch", "mlx", "hosts.json"
    needs_addresses = True            # its hostfile lists every rank's IP (docs/facts/launchers.md#mlx-launch-hostfile-format)
    install_hint = "pip install mlx here as well"
    env_on_command_line = True        # `--env NAME=VALUE` (its remote ssh command exports them too)

    def __init__(self, name: str, **spec):
        """The MLX backend `name` (BackendSpec's fields as keywords: `rdma="ring"`, `smoke=SmokeTest(...)`)."""
        self.spec = BackendSpec(name, **spec)

    @property
    def peers_variable(self):
        # MLX finds a ring's peers in MLX_HOSTFILE, jaccl's RDMA devices in MLX_IBV_DEVICES (launch/mlxenv.py)
        return "MLX_HOSTFILE" if self.rdma is None else "MLX_IBV_DEVICES"

    def launcher_here(self):
        return find_mlx_launch()

    def launcher_on_host(self, python, mpirun=None):
        return [python, "-c", MLX_LAUNCH_MODULE]

    def command(self, cluster, plan, *, program, rank_env, where, hostfile=None, cwd=None):
        if where.ssh is None:
            raise LaunchError(f"mlx.launch needs an OpenSSH client (ssh) on {where.name}")
        files = []
        if hostfile is None:
            hostfile = os.path.join(where.dir, self.hostfile_name)
            files.append((hostfile, self.hostfile(cluster), None))
        shim_dir = os.path.join(where.dir, "ssh")
        files.append((os.path.join(shim_dir, "ssh"), ssh_shim(where.ssh, where.ssh_options), 0o755))
        python, rest = plan.python(cluster), program[1:]      # one --python for every host, not expanded
        argv = mlx_launch_argv(cluster, hostfile=hostfile, backend=self.name, python=python, program=rest,
                               env=rank_env, cwd=cwd, launcher=where.launcher or ["mlx.launch"])
        return LauncherCommand(argv, files, path_prepend=shim_dir)


def find_mlx_launch() -> list[str] | None:
    beside = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    if os.access(beside, os.X_OK):
        return [beside]
    found = shutil.which("mlx.launch")
    return [found] if found else None


# ---- the pure builders --------------------------------------------------------------------------------

def mlx_launch_argv(cluster: Cluster, *, hostfile: str, backend: str, python: str, program: Sequence[str],
                    env: Mapping[str, str], cwd: str | None = None, launcher: Sequence[str] = ("mlx.launch",)) -> list[str]:
    """mlx.launch's command line. It does not put python in front of the program itself (0.32), hence
    --python (docs/facts/launchers.md#mlx-launch-does-not-prepend-python); the JSON hostfile carries the hosts and
    their data-plane addresses (docs/facts/launchers.md#mlx-launch-hostfile-format)."""
    argv = [*launcher, "--hostfile", hostfile, "--backend", backend, "--python", python]
    if backend == "ring" and cluster.launch.connections_per_ip != 1:
        argv += ["--connections-per-ip", str(cluster.launch.connections_per_ip)]
    if cwd:
        argv += ["--cwd", cwd]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    return argv + ["--", *program]


def ssh_shim(ssh: str, options: Sequence[str]) -> str:
    """An `ssh` for mlx.launch's PATH: mlx.launch runs plain `ssh HOST` (docs/facts/launchers.md#mlx-launch-runs-ssh-tt),
    so the inventory's options (ssh_config, BatchMode, ConnectTimeout, host key policy) reach it only through a
    wrapper (docs/facts/ssh.md#inventory-reaches-openssh-only-through-ssh-config)."""
    return "#!/bin/sh\nexec " + shlex.join([ssh, *options]) + ' "$@"\n'
