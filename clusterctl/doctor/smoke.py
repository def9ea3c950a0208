"""The deep checks: a one-line MLX program launched for real across the cluster by a backend's own
launcher (mpirun for mpi, clusterctl's rank starter for ring: each backend with a smoke test in the
registry), exactly as `run` launches. Each rank inits with strict=True
(docs/facts/mlx-distributed.md#strict-init-raises), all_sums rank+1, and prints one JSON line; the check fails
unless every rank saw the full world size and the right sum — which is exactly what catches MLX quietly
falling back to a world of one when it cannot load libmpi (docs/facts/mlx-distributed.md#world-of-one-fallback)."""
from __future__ import annotations

import json
import tempfile
import time

from ..errors import ClusterctlError, LaunchError
from ..hosts.connector import Connector
from ..hosts.local import LocalTransport
from ..hosts.transport import Result
from ..launch.backends import Backend, write_files
from ..launch.bootstrap import ENV_FILES
from ..launch.plan import LaunchPlan
from ..launch.site import LaunchSite
from .report import CLUSTER, FAIL, PASS, WARN, Finding

SMOKE_PROGRAM = ENV_FILES + r"""
import json, os, socket, sys
backend, expected = sys.argv[1], int(sys.argv[2])
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("MLX_RANK") or "?"
made = env_files()     # clusterctl's rank starter passes MLX_HOSTFILE's text (hosts/scripts/envfiles.py)


def say(answer):
    # one write(2) of the whole line: print() under PYTHONUNBUFFERED writes the text and its newline apart, and
    # mpirun then runs two ranks' answers into one line
    os.write(1, (json.dumps(answer) + "\n").encode())


try:
    import mlx.core as mx
    g = mx.distributed.init(backend=backend, strict=True)
    x = mx.distributed.all_sum(mx.array([float(g.rank() + 1)]), group=g)
    mx.eval(x)
    say({"smoke": 1, "rank": g.rank(), "size": g.size(), "sum": x.item(), "host": socket.gethostname()})
    sys.exit(0 if g.size() == expected else 3)
except Exception as e:
    say({"smoke": 1, "rank": rank, "error": type(e).__name__ + ": " + str(e)})
    sys.exit(3)
finally:
    for path in made:
        os.unlink(path)
"""


def judge(check: str, result: Result | None, error: BaseException | None, world: int, elapsed: float,
          launcher: str, init_fix: str) -> Finding:
    """Turn a smoke run's output into one finding (pure; tested on canned output). `init_fix`: what to do
    when a rank's MLX init failed (the backend's smoke.fix)."""
    if error is not None:
        return Finding(check, CLUSTER, FAIL, f"{launcher} did not finish: {error}",
                       "run `clusterctl doctor` without --deep to see which host is at fault")
    ranks, decoder, start = [], json.JSONDecoder(), result.stdout.find('{"smoke"')
    while start >= 0:            # every rank's answer, wherever a launcher put it (two may share a line)
        try:
            answer, end = decoder.raw_decode(result.stdout, start)
            ranks.append(answer)
        except ValueError:
            end = start + 1
        start = result.stdout.find('{"smoke"', end)
    errors = [r for r in ranks if "error" in r]
    if errors:
        first = errors[0]
        return Finding(check, CLUSTER, FAIL, f"rank {first.get('rank')}: mx.distributed.init failed: "
                       f"{first['error']}", init_fix)
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


def run_smoke(connector: Connector, backend: Backend, plan: LaunchPlan, *, timeout: float,
              libmpi_hint: str | None = None) -> Finding:
    """The smoke program on every rank of the connector's cluster, launched from this machine exactly as `run`
    would launch it (the backend's own command line, hostfile and ssh options), then judged."""
    cluster = connector.cluster
    check = f"{backend.name}-smoke"
    launcher = backend.launcher_here()
    if launcher is None:
        return Finding(check, CLUSTER, WARN, f"not run: {backend.launcher_name} is not installed on this machine",
                       backend.install_hint)
    with tempfile.TemporaryDirectory(prefix="clusterctl-doctor-") as tmp:
        where = LaunchSite.here(connector, launcher, tmp)
        program = [cluster.hosts[0].python, "-c", SMOKE_PROGRAM, backend.name, str(cluster.world_size)]
        try:
            command = backend.command(cluster, plan, program=program, rank_env=plan.env, where=where)
        except LaunchError as e:
            return Finding(check, CLUSTER, WARN, f"not run: {e}", None)
        write_files(command)
        return _run(cluster, check, backend.launcher_label, command.argv, command.env(), timeout,
                    backend.smoke.fix(libmpi_hint))


def _run(cluster, check, launcher, argv, env, timeout, init_fix) -> Finding:
    start = time.monotonic()
    result, error = None, None
    try:
        result = LocalTransport().run(argv, timeout=timeout, env=env)
    except ClusterctlError as e:
        error = e
    return judge(check, result, error, cluster.world_size, time.monotonic() - start, launcher, init_fix)
