"""A model bigger than one host: per-rank peak memory and speed of zero3 against dp and fsdp, and the memory
estimate against the measured peaks.

    .venv/bin/python benchmarks/bench_zero3.py [--steps 30] [--backends ring,mpi] [--worlds 2,4]

Four loopback sshd hosts (tests/sshcluster.py; world 2 uses the first two), the bundled trainer launched as
users launch it (`clusterctl run --hosts inventory.yaml --backend B --plain -- ...`) with the issue's
parameter-dominated model: 4 layers, dim 384, mlp 1536, block 16, batch 2 (9.54M parameters, 36 MiB in
float32), --balance off, no evaluation or checkpoint inside the timed steps. For each backend, world and
strategy: the largest `mx.get_peak_memory()` of any rank (metrics.jsonl's peak_mem_mb, the maximum over the
reports), the global tokens/s (median of the reports after step 10), the final loss, and
clusterctl.train.memory's estimate. At world 4 over ring, zero3's three gather modes (prefetch, plain, keep)
too. First, reduce-scatter on ring by size (mlx.launch, 2 and 4 ranks on this machine): all_sum then slice
against send/recv around the ring, which collectives.reduce_scatter picks from SENDRECV_MIN_BYTES up.
Writes benchmarks/results/zero3.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from record import run_trainer, write_record  # noqa: E402

from clusterctl.train.memory import Shape  # noqa: E402
from clusterctl.train.strategies import estimate  # noqa: E402

MODEL = ["--n-layers", "4", "--dim", "384", "--n-heads", "4", "--mlp-dim", "1536", "--block-size", "16",
         "--batch-size", "2", "--balance", "off", "--check-sync", "0", "--eval-every", "0", "--ckpt-every", "0",
         "--report-every", "5"]
SHAPE = Shape(vocab=257, n_layers=4, dim=384, n_heads=4, mlp_dim=1536, block_size=16, batch_size=2)
MiB = 2 ** 20


def one(inventory: str, backend: str, steps: int, extra: list[str]) -> dict:
    wall, records, _ = run_trainer(inventory, backend, [*MODEL, "--steps", str(steps), *extra])
    reports = [x for x in records if "tokens_per_s" in x]
    steady = [x["tokens_per_s"] for x in reports if x["step"] > 10] or [x["tokens_per_s"] for x in reports]
    return {"wall_s": wall, "tokens_per_s": statistics.median(steady), "final_loss": reports[-1]["loss"],
            "peak_mb": max(x["peak_mem_mb"] for x in reports)}


RS_SIZES = [2 ** 16, 2 ** 18, 2 ** 20, 2 ** 22, 2 ** 24]      # bytes of float32 reduce-scattered


def reduce_scatter_worker() -> None:
    """One rank (mlx.launch, ring): seconds per reduce-scatter of each size, all_sum-then-slice against
    send/recv around the ring (collectives.ring_reduce_scatter), interleaved, median of 7 after a warm-up."""
    import mlx.core as mx

    from clusterctl.train import collectives

    group = collectives.init_world("ring")
    n, r = group.size(), group.rank()
    out = {}
    for size in RS_SIZES:
        x = mx.random.normal((n, size // 4 // n)) + r
        mx.eval(x)
        ways = {"all_sum": lambda x=x: mx.distributed.all_sum(x, group=group)[r],
                "sendrecv": lambda x=x: collectives.ring_reduce_scatter(x, group)}
        times = {k: [] for k in ways}
        for i in range(8):
            for name, fn in ways.items():
                began = time.perf_counter()
                mx.eval(fn())
                if i:
                    times[name].append(time.perf_counter() - began)
        out[size] = {k: statistics.median(v) for k, v in times.items()}
    if r == 0:
        print(json.dumps(out), flush=True)


def reduce_scatter_sizes(world: int) -> dict:
    launch = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    r = subprocess.run([launch, "-n", str(world), "--backend", "ring", sys.executable, os.path.abspath(__file__),
                        "--reduce-scatter-worker"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": os.path.join(HERE, "..")})
    if r.returncode != 0:
        raise SystemExit(f"reduce-scatter sizes at world {world} failed:\n{r.stderr[-2000:]}")
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


def subset_inventory(text: str, keep: int) -> str:
    """The inventory with only its first `keep` hosts (the test cluster writes `- name:` then `address:`)."""
    out, seen, skipping = [], 0, False
    for line in text.splitlines():
        if line.startswith("  - name:"):
            seen += 1
            skipping = seen > keep
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backends", default="ring,mpi")
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--reduce-scatter-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reduce_scatter_worker:
        reduce_scatter_worker()
        return 0
    sizes = {}
    for w in (2, 4):
        sizes[w] = reduce_scatter_sizes(w)
        for size, t in sizes[w].items():
            print(f"ring reduce-scatter at world {w}, {int(size) / MiB:.2f} MiB: all_sum then slice "
                  f"{t['all_sum'] * 1e3:.1f} ms, send/recv {t['sendrecv'] * 1e3:.1f} ms "
                  f"({t['all_sum'] / t['sendrecv']:.2f}x)", flush=True)
    backends, worlds = args.backends.split(","), [int(w) for w in args.worlds.split(",")]
    from sshcluster import SSHCluster
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-zero3-") as tmp:
        cluster = SSHCluster(os.path.join(tmp, "cluster"), max(worlds)).start()
        try:
            text = cluster.inventory.read_text()
            inventories = {}
            for w in worlds:
                path = str(cluster.inventory.with_name(f"inventory-{w}.yaml"))    # beside its ssh_config
                with open(path, "w") as f:
                    f.write(subset_inventory(text, w))
                inventories[w] = path
            one(inventories[min(worlds)], backends[0], 2, [])       # warm: plan cache, SSH masters, kernels
            plan = [(b, w, s, []) for b in backends for w in worlds for s in ("dp", "fsdp", "zero3")]
            plan += [("ring", max(worlds), "zero3", ["--zero3-gather", g]) for g in ("plain", "keep")
                     if "ring" in backends]
            for backend, world, strategy, extra in plan:
                got = one(inventories[world], backend, args.steps, ["--strategy", strategy, *extra])
                est = estimate(SHAPE, strategy, world).total / MiB
                row = {"backend": backend, "world": world, "strategy": strategy,
                       "gather": extra[1] if extra else ("prefetch" if strategy == "zero3" else None),
                       **got, "estimate_mb": est, "estimate_over_peak": est / got["peak_mb"]}
                rows.append(row)
                print(f"{backend} world {world} {strategy}{' ' + extra[1] if extra else ''}: peak "
                      f"{got['peak_mb']:.1f} MB (estimate {est:.1f}, x{est / got['peak_mb']:.2f}), "
                      f"{got['tokens_per_s']:,.0f} tok/s, final loss {got['final_loss']:.4f}", flush=True)
        finally:
            cluster.stop_all()

    def pick(backend, world, strategy, gather=None):
        for r in rows:
            if (r["backend"], r["world"], r["strategy"]) == (backend, world, strategy) and (
                    gather is None or r["gather"] == gather):
                return r
        return None

    ratios = {}
    for backend in backends:
        for world in worlds:
            dp, z3 = pick(backend, world, "dp"), pick(backend, world, "zero3", "prefetch")
            fs = pick(backend, world, "fsdp")
            ratios[f"{backend} world {world}"] = {
                "zero3_peak_over_dp": z3["peak_mb"] / dp["peak_mb"], "fsdp_peak_over_dp": fs["peak_mb"] / dp["peak_mb"],
                "zero3_tokens_over_dp": z3["tokens_per_s"] / dp["tokens_per_s"],
                "zero3_loss_vs_dp": z3["final_loss"] / dp["final_loss"] - 1}
    for name, r in ratios.items():
        print(f"{name}: zero3 peak / dp {r['zero3_peak_over_dp']:.3f}, fsdp / dp {r['fsdp_peak_over_dp']:.3f}, "
              f"zero3 tok/s / dp {r['zero3_tokens_over_dp']:.2f}, final loss {r['zero3_loss_vs_dp'] * 100:+.2f}%")
    worst = max(abs(r["estimate_over_peak"] - 1) for r in rows)
    print(f"estimate within {worst * 100:.0f}% of every measured peak")
    write_record("zero3", steps=args.steps, flags=MODEL, rows=rows, ratios=ratios, estimate_worst=worst,
                 reduce_scatter_ring=sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
