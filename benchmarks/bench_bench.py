"""`clusterctl bench`: MLX all_sum bus bandwidth against raw mpi4py Allreduce at 64 MiB, 2 and 4 hosts.

    .venv/bin/python benchmarks/bench_bench.py [--hosts 2,4] [--size 64M] [--repeat 3]

On loopback clusters (tests/sshcluster.py), `clusterctl bench --backend mpi --ops all_sum --json` runs
--repeat times per size; every run times MLX's all_sum and mpi4py's Allreduce on the same buffer side by
side in one launch (same mpirun, same MCA settings), so their ratio is measured in one run. The ring
backend's busbw is recorded beside it for reference. Medians over the runs. Writes
benchmarks/results/bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from sshcluster import SSHCluster  # noqa: E402

from clusterctl.bench.report import format_bytes, parse_size  # noqa: E402


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
            return {k: statistics.median(v) for k, v in runs.items()} | {"ratios": runs["ratio"]}
        finally:
            cluster.stop_all()


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
    record = {"benchmark": "bench", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
              "bytes": nbytes, "repeat": args.repeat,
              "results": {str(h): {k: (round(v, 4) if isinstance(v, float) else [round(x, 3) for x in v])
                                   for k, v in m.items()} for h, m in results.items()}}
    out = os.path.join(HERE, "results", "bench.json")
    with open(out + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(out + ".tmp", out)
    print(f"wrote {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
