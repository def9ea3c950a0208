"""The deep checks: a one-line MLX program launched for real across the cluster, through mpirun (mpi
backend) and through mlx.launch (ring backend). Each rank inits with strict=True, all_sums rank+1, and
prints one JSON line; the check fails unless every rank saw the full world size and the right sum — which
is exactly what catches MLX quietly falling back to a world of one when it cannot load libmpi."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Mapping

from ..errors import ClusterctlError
from ..inventory import Cluster
from ..launch.hostfile import render as render_hostfile
from ..launch.backends import find_mlx_launch, mlx_launch_argv, mpirun_argv, write_ssh_shim
from ..hosts.transport import LocalTransport, Result
from .report import CLUSTER, FAIL, PASS, WARN, Finding

SMOKE_PROGRAM = r"""
import json, os, socket, sys
backend, expected = sys.argv[1], int(sys.argv[2])
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("MLX_RANK") or "?"
try:
    import mlx.core as mx
    g = mx.distributed.init(backend=backend, strict=True)
    x = mx.distributed.all_sum(mx.array([float(g.rank() + 1)]), group=g)
    mx.eval(x)
    print(json.dumps({"smoke": 1, "rank": g.rank(), "size": g.size(), "sum": x.item(),
                      "host": socket.gethostname()}), flush=True)
    sys.exit(0 if g.size() == expected else 3)
except Exception as e:
    print(json.dumps({"smoke": 1, "rank": rank, "error": type(e).__name__ + ": " + str(e)}), flush=True)
    sys.exit(3)
"""


def judge(check: str, result: Result | None, error: BaseException | None, world: int, elapsed: float,
          launcher: str, libmpi_hint: str | None) -> Finding:
    """Turn a smoke run's output into one finding (pure; tested on canned output)."""
    if error is not None:
        return Finding(check, CLUSTER, FAIL, f"{launcher} did not finish: {error}",
                       "run `clusterctl doctor` without --deep to see which host is at fault")
    ranks = []
    for line in result.stdout.splitlines():
        start = line.find('{"smoke"')
        if start >= 0:
            try:
                ranks.append(json.loads(line[start:]))
            except ValueError:
                pass
    errors = [r for r in ranks if "error" in r]
    if errors:
        first = errors[0]
        fix = ("MLX could not load libmpi: set `mpi_lib_dir:` (or MLX_MPI_LIBNAME in env) to the Open MPI "
               "libmpi" + (f" (doctor found {libmpi_hint})" if libmpi_hint else "") + "; MLX needs Open MPI"
               if check == "mpi-smoke" else "check the data-plane addresses and that the ring ports are free")
        return Finding(check, CLUSTER, FAIL, f"rank {first.get('rank')}: mx.distributed.init failed: "
                       f"{first['error']}", fix)
    sizes = sorted({r.get("size") for r in ranks})
    expected_sum = world * (world + 1) / 2
    if len(ranks) == world and sizes == [world] and all(r.get("sum") == expected_sum for r in ranks):
        hosts = sorted({r.get("host", "?") for r in ranks})
        return Finding(check, CLUSTER, PASS, f"{launcher} ran {world} ranks; every rank saw world size {world} "
                       f"and all_sum {expected_sum:g} ({elapsed:.1f}s, on {', '.join(hosts)})")
    if sizes == [1] and world > 1:
        return Finding(check, CLUSTER, FAIL, f"every rank saw a world of size 1 instead of {world}: MLX fell back "
                       "to running each rank alone", "MLX did not load libmpi / reach its peers: see the libmpi check")
    tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-3:]
    return Finding(check, CLUSTER, FAIL,
                   f"{launcher} exited {result.exit_code} with {len(ranks)}/{world} ranks reporting "
                   f"(sizes {sizes}): {' | '.join(tail)[:400]}",
                   "run `clusterctl doctor` again; if it persists, launch by hand with --verbose")


def mpi_smoke(cluster: Cluster, *, python: str, env: Mapping[str, str], rsh_agent: str,
              if_include: str | None, timeout: float, libmpi_hint: str | None) -> Finding:
    """mpirun on this machine over the real hostfile."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return Finding("mpi-smoke", CLUSTER, WARN, "not run: no mpirun on this machine",
                       "install Open MPI here too, or run clusterctl doctor from one of the hosts")
    with tempfile.TemporaryDirectory(prefix="clusterctl-doctor-") as tmp:
        hostfile = os.path.join(tmp, "hostfile")
        with open(hostfile, "w") as f:
            f.write(render_hostfile(cluster, "openmpi"))
        argv = mpirun_argv(cluster, hostfile=hostfile, program=[python, "-c", SMOKE_PROGRAM, "mpi",
                                                                 str(cluster.world_size)],
                           env=env, rsh_agent=rsh_agent, if_include=if_include, as_root=os.geteuid() == 0,
                           mpirun=mpirun)
        return _run(cluster, "mpi-smoke", "mpirun", argv, {}, timeout, libmpi_hint)


def ring_smoke(cluster: Cluster, *, python: str, env: Mapping[str, str], ssh_options: list[str],
               timeout: float) -> Finding:
    """mlx.launch on this machine with a JSON hostfile of the hosts' addresses; ssh through a shim that
    adds the inventory's OpenSSH options (mlx.launch runs plain `ssh` from PATH)."""
    launcher = find_mlx_launch()
    if launcher is None:
        return Finding("ring-smoke", CLUSTER, WARN, "not run: mlx.launch is not installed on this machine",
                       "pip install mlx here as well")
    ssh = shutil.which("ssh")
    if ssh is None:
        return Finding("ring-smoke", CLUSTER, WARN, "not run: no OpenSSH client on this machine", None)
    with tempfile.TemporaryDirectory(prefix="clusterctl-doctor-") as tmp:
        shim_dir = write_ssh_shim(os.path.join(tmp, "ssh"), ssh, ssh_options)
        hostfile = os.path.join(tmp, "hosts.json")
        with open(hostfile, "w") as f:
            f.write(render_hostfile(cluster, "mlx", backend="ring", env=env))
        argv = mlx_launch_argv(cluster, hostfile=hostfile, backend="ring", python=python, env={},
                               program=["-c", SMOKE_PROGRAM, "ring", str(cluster.world_size)], launcher=launcher)
        path = shim_dir + os.pathsep + os.environ.get("PATH", "")
        return _run(cluster, "ring-smoke", "mlx.launch", argv, {"PATH": path}, timeout, None)


def ring_ready(cluster: Cluster) -> bool:
    """Whether mlx.launch can run the ring backend here: every host has a data-plane address, or the
    cluster is this machine alone (ranks on 127.0.0.1)."""
    if len(cluster.hosts) == 1 and cluster.hosts[0].local:
        return cluster.world_size > 1
    return len(cluster.hosts) > 1 and all(h.address for h in cluster.hosts)


def _run(cluster, check, launcher, argv, env, timeout, libmpi_hint) -> Finding:
    start = time.monotonic()
    result, error = None, None
    try:
        result = LocalTransport().run(argv, timeout=timeout, env=env)
    except ClusterctlError as e:
        error = e
    return judge(check, result, error, cluster.world_size, time.monotonic() - start, launcher, libmpi_hint)
