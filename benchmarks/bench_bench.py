"""`clusterctl bench`: MLX all_sum bus bandwidth against raw mpi4py Allreduce at 64 MiB, 2 and 4 hosts.

    .venv/bin/python benchmarks/bench_bench.py [--hosts 2,4] [--size 64M] [--repeat 3]

On loopback clusters (tests/sshcluster.py), `clusterctl bench --backend mpi --ops all_sum --json` runs
--repeat times per size; every run times MLX's all_sum and mpi4py's Allreduce on the same buffer side by
side in one launch (same mpirun, same MCA settings), so their ratio is measured in one run. The ring
backend's busbw is recorded beside it for reference. Medians over the runs. Then one `clusterctl run`
per cluster times, alternating in one launch, MLX's all_sum against mpi4py into a reused and into a
fresh receive buffer: where the gap comes from. Writes benchmarks/results/bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from record import write_record  # noqa: E402
from sshcluster import SSHCluster  # noqa: E402

from clusterctl.bench.report import format_bytes, parse_size  # noqa: E402

# Where MLX's all_sum loses to a raw Allreduce on CPU: MLX writes every result into a new array, and its CPU
# allocator keeps no cache, so each op first-touches fresh pages. Timed in one launch, alternating:
# MLX, mpi4py into a reused buffer (what bench compares against), mpi4py into a fresh buffer each op.
GAP = """\
import json, statistics, sys, time
import mlx.core as mx
g = mx.distributed.init(backend="mpi", strict=True)
import mpi4py
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
from mpi4py import MPI
comm = MPI.COMM_WORLD
x = mx.ones((int(sys.argv[1]) // 4,))
mx.eval(x)
send, reused = memoryview(x), bytearray(x.nbytes)
ops = {"mlx": lambda: mx.eval(mx.distributed.all_sum(x, group=g)),
       "mpi4py_reused": lambda: comm.Allreduce([send, MPI.FLOAT], [reused, MPI.FLOAT]),
       "mpi4py_fresh": lambda: comm.Allreduce([send, MPI.FLOAT], [bytearray(x.nbytes), MPI.FLOAT])}
times = {k: [] for k in ops}
for f in ops.values():
    f()
for _ in range(5):
    for k, f in ops.items():
        comm.Barrier()
        t = time.perf_counter()
        f()
        times[k].append(time.perf_counter() - t)
med = {k: comm.allreduce(statistics.median(v), op=MPI.MAX) for k, v in times.items()}
if g.rank() == 0:
    print("GAP " + json.dumps(med), flush=True)
"""


def bench(inventory: str, backend: str, size: str, cwd: str) -> dict:
    argv = [sys.executable, "-m", "clusterctl", "bench", "--hosts", inventory, "--backend", backend,
            "--sizes", size, "--ops", "all_sum", "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=600,
                       env={**os.environ, "XDG_CACHE_HOME": os.path.join(cwd, "cache")})
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {r.stderr[-1500:]}")
    return {row["impl"]: row for row in json.loads(r.stdout)["rows"]}


def measure(hosts: int, size: str, repeat: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-bench-{hosts}-") as tmp:
        cluster = SSHCluster(os.path.join(tmp, "cluster"), hosts).start()
        try:
            inventory = str(cluster.inventory)
            bench(inventory, "mpi", "1M", tmp)                 # warm-up: host keys, page cache, plan cache
            runs = {"mlx": [], "mpi4py": [], "ratio": [], "ring": [], "mlx_time": [], "mpi4py_time": []}
            for _ in range(repeat):
                rows = bench(inventory, "mpi", size, tmp)
                runs["mlx"].append(rows["mlx"]["busbw_gbs"])
                runs["mpi4py"].append(rows["mpi4py"]["busbw_gbs"])
                runs["mlx_time"].append(rows["mlx"]["time_s"])
                runs["mpi4py_time"].append(rows["mpi4py"]["time_s"])
                runs["ratio"].append(rows["mlx"]["busbw_gbs"] / rows["mpi4py"]["busbw_gbs"])
                runs["ring"].append(bench(inventory, "ring", size, tmp)["mlx"]["busbw_gbs"])
            out = {k: statistics.median(v) for k, v in runs.items()} | {"ratios": runs["ratio"]}
            return out | {"gap_s": gap(inventory, size, tmp)}
        finally:
            cluster.stop_all()


def gap(inventory: str, size: str, cwd: str) -> dict:
    script = os.path.join(cwd, "gap.py")
    with open(script, "w") as f:
        f.write(GAP)
    r = subprocess.run([sys.executable, "-m", "clusterctl", "run", script, str(parse_size(size)), "--hosts", inventory,
                        "--backend", "mpi", "--rank0-only", "--runs-dir", os.path.join(cwd, "runs")],
                       capture_output=True, text=True, cwd=cwd, timeout=300,
                       env={**os.environ, "XDG_CACHE_HOME": os.path.join(cwd, "cache")})
    line = [x for x in r.stdout.splitlines() if "] GAP " in x]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"gap script failed: {r.stdout[-800:]} {r.stderr[-1500:]}")
    return {k: round(v, 4) for k, v in json.loads(line[0].split("] GAP ", 1)[1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="2,4")
    parser.add_argument("--size", default="64M")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    nbytes = parse_size(args.size)
    results = {int(h): measure(int(h), args.size, args.repeat) for h in args.hosts.split(",")}
    print(f"all_sum of {format_bytes(nbytes)}, busbw GB/s, median of {args.repeat} runs (each ratio from one launch)")
    print(f"{'hosts':>5} {'MLX (mpi)':>10} {'mpi4py':>10} {'MLX/mpi4py':>10} {'per-run ratios':>22} {'MLX (ring)':>10}")
    for hosts, m in results.items():
        ratios = " ".join(f"{r:.2f}" for r in m["ratios"])
        print(f"{hosts:>5} {m['mlx']:>10.3f} {m['mpi4py']:>10.3f} {m['ratio']:>10.2f} {ratios:>22} {m['ring']:>10.3f}")
    print("why: time per op (ms), median of 5, alternating in one launch")
    print(f"{'hosts':>5} {'MLX all_sum':>11} {'mpi4py, reused buffer':>21} {'mpi4py, fresh buffer':>20}")
    for hosts, m in results.items():
        g = m["gap_s"]
        print(f"{hosts:>5} {g['mlx'] * 1e3:>11.1f} {g['mpi4py_reused'] * 1e3:>21.1f} {g['mpi4py_fresh'] * 1e3:>20.1f}")
    write_record("bench", bytes=nbytes, repeat=args.repeat,
                 results={str(h): {k: (round(v, 4) if isinstance(v, float) else
                                       [round(x, 3) for x in v] if isinstance(v, list) else v)
                                   for k, v in m.items()} for h, m in results.items()})


if __name__ == "__main__":
    main()
