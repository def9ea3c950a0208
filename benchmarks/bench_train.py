"""The bundled trainer's benchmarks, each a ratio measured side by side in one run.

    .venv/bin/python benchmarks/bench_train.py [--stories 40000] [--steps 30]

1. memory: per-rank peak memory (MLX's get_peak_memory and the process's peak RSS, max over ranks) at
   world 1, 2, 4, training from `clusterctl data prepare` shards (each rank memory-maps its own shard,
   clusterctl.data.loader.rank_tokens) against a whole-dataset-per-rank loader (every rank reads every
   shard into one mx.array, as a naive loader does), and a baseline run (same launcher, model and steps,
   a few KB of tokens). Resident memory is split into anonymous (private) and file-backed: a mapped shard
   is file-backed page cache, and Linux may map whole large folios per fault, so its file RSS can reach
   the shard's size while the private memory stays flat.
   Goal: sharded at world 4 <= 1.1x world 1.
2. averaging: DP step time with nn.average_gradients (bucketed: a few all_sums) against a per-tensor
   all_sum over the gradient tree (the seeds' `tree_map(lambda g: all_sum(g) / N, grads)`), on a model of
   many small tensors, both compiled, interleaved, at world 2 over mpi and ring.
3. throughput: the trainer's own reported global tokens/s (`python -m clusterctl.train`, mpi) at world
   1, 2, 4.

World sizes above the core count share cores (this machine has 2), so absolute throughput at world 4 is
not a scaling result; the memory ratios do not depend on it. Writes benchmarks/results/train.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
ENV = {**os.environ, "PYTHONPATH": REPO}
MODEL = ["--n-layers", "2", "--dim", "64", "--n-heads", "4", "--mlp-dim", "128", "--block-size", "128"]


def mpirun(n: int) -> list[str]:
    """mpirun for n > 1. World 1 runs without a launcher: under `mpirun -np 1` MLX 0.32.4 leaves MPI
    initialised but not finalised and mpirun then fails the job ("exiting improperly";
    docs/facts/mlx-distributed.md#mpi-world-of-one-not-finalized)."""
    if n == 1:
        return []
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "--oversubscribe", "-np", str(n), "-x", "PYTHONPATH", "-x", "CLUSTERCTL_WORLD_SIZE"]


def ring(n: int) -> list[str]:
    from clusterctl.launch.backends.mlxlaunch import find_mlx_launch
    return find_mlx_launch() + ["-n", str(n), "--backend", "ring", "--env", f"PYTHONPATH={REPO}",
                                "--env", f"CLUSTERCTL_WORLD_SIZE={n}", "--"]


def launch(argv, world: int) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                       env={**ENV, "CLUSTERCTL_WORLD_SIZE": str(world)})
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv[:8])}...\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def rank_reports(out_dir: str, world: int) -> list[dict]:
    return [json.load(open(os.path.join(out_dir, f"rank-{r}.json"))) for r in range(world)]


# ---- workers (one per rank, started by mpirun / mlx.launch) -----------------------------------

def memory_worker(mode: str, data_dir: str, steps: int, out_dir: str) -> None:
    import mlx.core as mx

    from clusterctl.data.loader import BatchLoader, TokenArray, rank_tokens
    from clusterctl.data.shards import read_manifest
    from clusterctl.train.config import parse_args
    from clusterctl.train.model import ModelArgs, Transformer
    from clusterctl.train.step import make_optimizer
    from clusterctl.train.strategies import get
    from clusterctl.train.trainer import init_world, micro_batches

    group = init_world()
    rank, world = group.rank(), group.size()
    config = parse_args(MODEL + ["--batch-size", "8", "--steps", str(steps)])
    manifest = read_manifest(data_dir)
    if mode == "sharded":
        tokens, _ = rank_tokens(rank, world, data_dir=data_dir)
    elif mode == "whole":   # every rank holds the whole dataset: all shards, as one array
        tokens = WholeDataset(data_dir, manifest)
    else:                   # baseline: the same process and launcher with almost no data
        tokens = TokenArray(list(range(256)) * 64)
    mx.random.seed(0)
    model = Transformer(ModelArgs.from_config(config, manifest.vocab_size))
    optimizer = make_optimizer(config)
    step = get(config.strategy).make_step(model, optimizer, config, group)
    loader = BatchLoader(tokens, config.batch_size, config.block_size, 0, rank)
    for s in range(steps):
        mx.eval(step(*micro_batches(loader, s, 1)), model.state, optimizer.state)
    report(out_dir, rank, {"mlx_peak_mb": mx.get_peak_memory() / 2**20,
                           "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                           **rss_parts(), "tokens_held": len(tokens)})


def rss_parts() -> dict:
    """Resident memory now, split: anonymous (private: what a rank really costs) and file-backed (mapped
    page cache: clean, shared, reclaimable; a memory-mapped shard shows up here)."""
    parts = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                parts[line.split(":")[0].replace("Rss", "").lower() + "_rss_mb"] = int(line.split()[1]) / 1024
    return parts


class WholeDataset:
    """The naive loader: every shard read into one mx.array on every rank."""

    def __init__(self, data_dir, manifest):
        import mlx.core as mx

        parts = []
        for shard in manifest.shards:
            with open(os.path.join(data_dir, shard.file), "rb") as f:
                parts.append(mx.array(memoryview(f.read()).cast("H")))
        self.tokens = mx.concatenate(parts)
        mx.eval(self.tokens)
        self.path = data_dir

    def __len__(self):
        return self.tokens.size

    def window(self, start, length):
        return self.tokens[start:start + length]


def averaging_worker(steps: int, out_dir: str) -> None:
    from functools import partial

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten, tree_map

    from clusterctl.train.trainer import init_world

    group = init_world()
    world = group.size()

    class ManySmall(nn.Module):     # 128 Linear(32, 32) with bias: 256 tensors of 4 KiB or less
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(32, 32) for _ in range(128)]

        def __call__(self, x):
            for layer in self.layers:
                x = x + 0.1 * nn.gelu(layer(x))
            return x

    def per_tensor(grads):
        return tree_map(lambda g: mx.distributed.all_sum(g, group=group) / world, grads)

    def bucketed(grads):
        return nn.average_gradients(grads, group=group)

    def build(average):
        mx.random.seed(0)
        model = ManySmall()
        optimizer = optim.AdamW(1e-3)
        state = [model.state, optimizer.state]

        @partial(mx.compile, inputs=state, outputs=state)
        def step(x):
            loss, grads = nn.value_and_grad(model, lambda m, x: m(x).square().mean())(model, x)
            optimizer.update(model, average(grads))
            return loss
        return model, optimizer, step

    variants = {"bucketed": build(bucketed), "per_tensor": build(per_tensor)}
    x = mx.random.normal((16, 32), key=mx.random.key(group.rank()))
    times = {name: [] for name in variants}
    for round_ in range(steps + 3):                  # interleaved; the first 3 rounds warm up (compile)
        for name, (model, optimizer, step) in variants.items():
            start = time.perf_counter()
            mx.eval(step(x), model.state, optimizer.state)
            if round_ >= 3:
                times[name].append(time.perf_counter() - start)
    tensors = len(tree_flatten(variants["bucketed"][0].parameters()))
    report(out_dir, group.rank(), {"tensors": tensors, **{k: statistics.median(v) for k, v in times.items()}})


def report(out_dir, rank, values):
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(values, f)


# ---- the driver -------------------------------------------------------------------------------

def bench_memory(tmp, stories, steps) -> list[dict]:
    from clusterctl.data.shards import prepare

    rows = []
    for world in (1, 2, 4):
        data_dir = os.path.join(tmp, f"shards-{world}")
        manifest = prepare(f"embedded:{stories}", world, data_dir)
        row = {"world": world, "dataset_tokens": manifest.tokens_per_shard * world}
        for mode in ("baseline", "sharded", "whole"):
            out = tempfile.mkdtemp(dir=tmp)
            launch(mpirun(world) + [sys.executable, __file__, "--worker", "memory", mode, data_dir, str(steps), out],
                   world)
            reps = rank_reports(out, world)
            row[f"{mode}_mlx_peak_mb"] = max(r["mlx_peak_mb"] for r in reps)
            row[f"{mode}_rss_peak_mb"] = max(r["rss_peak_mb"] for r in reps)
            row[f"{mode}_tokens_per_rank"] = max(r["tokens_held"] for r in reps)
            row[f"{mode}_anon_rss_mb"] = max(r.get("anon_rss_mb", 0.0) for r in reps)
            row[f"{mode}_file_rss_mb"] = max(r.get("file_rss_mb", 0.0) for r in reps)
        rows.append(row)
        shutil.rmtree(data_dir)
    for row in rows:
        for mode in ("sharded", "whole"):
            for kind in ("mlx_peak_mb", "rss_peak_mb", "anon_rss_mb"):
                row[f"{mode}_{kind}_vs_world1"] = row[f"{mode}_{kind}"] / rows[0][f"{mode}_{kind}"]
        for kind in ("mlx_peak_mb", "rss_peak_mb"):
            row[f"whole_over_sharded_{kind}"] = row[f"whole_{kind}"] / row[f"sharded_{kind}"]
        for mode in ("sharded", "whole"):   # what the data costs above the same process without data
            row[f"{mode}_data_rss_mb"] = row[f"{mode}_rss_peak_mb"] - row["baseline_rss_peak_mb"]
    return rows


def bench_averaging(tmp, steps) -> list[dict]:
    rows = []
    for backend, prefix in (("mpi", mpirun(2)), ("ring", ring(2))):
        out = tempfile.mkdtemp(dir=tmp)
        launch(prefix + [sys.executable, __file__, "--worker", "averaging", str(steps), out], 2)
        reps = rank_reports(out, 2)
        b = max(r["bucketed"] for r in reps)
        p = max(r["per_tensor"] for r in reps)
        rows.append({"backend": backend, "world": 2, "tensors": reps[0]["tensors"], "bucketed_step_s": b,
                     "per_tensor_step_s": p, "per_tensor_over_bucketed": p / b})
    return rows


def bench_throughput(tmp, steps) -> list[dict]:
    rows = []
    for world in (1, 2, 4):
        out = os.path.join(tmp, f"tput-{world}")
        launch(mpirun(world) + [sys.executable, "-m", "clusterctl.train", *MODEL, "--batch-size", "8",
                                "--steps", str(steps), "--report-every", "5", "--eval-every", "0",
                                "--ckpt-every", "0", "--out", out], world)
        records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in line]
        rates = [r["tokens_per_s"] for r in records[1:]]          # the first interval includes compiling
        rows.append({"world": world, "tokens_per_s": statistics.median(rates),
                     "per_rank_tokens_per_s": statistics.median(rates) / world})
    for row in rows:
        row["vs_world1"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stories", type=int, default=40000, help="Embedded stories in the memory dataset.")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        memory = bench_memory(tmp, args.stories, 5)
        averaging = bench_averaging(tmp, args.steps)
        throughput = bench_throughput(tmp, args.steps)

    print("per-rank memory (max over ranks), MB. mlx = mx.get_peak_memory(); anon / file = resident anonymous /")
    print("file-backed memory at the end (Linux); x = against world 1")
    print(f"{'world':>5} {'tokens':>11} | {'base anon':>9} | {'sharded mlx':>11} {'anon':>6} {'file':>6} | "
          f"{'whole mlx':>9} {'anon':>6} {'file':>6} | {'sharded mlx x':>13} {'anon x':>6} | {'whole/sharded mlx':>17} {'anon':>5}")
    for r in memory:
        print(f"{r['world']:>5} {r['dataset_tokens']:>11,} | {r['baseline_anon_rss_mb']:>9.1f} | "
              f"{r['sharded_mlx_peak_mb']:>11.1f} {r['sharded_anon_rss_mb']:>6.1f} {r['sharded_file_rss_mb']:>6.1f} | "
              f"{r['whole_mlx_peak_mb']:>9.1f} {r['whole_anon_rss_mb']:>6.1f} {r['whole_file_rss_mb']:>6.1f} | "
              f"{r['sharded_mlx_peak_mb_vs_world1']:>13.2f} {r['sharded_anon_rss_mb_vs_world1']:>6.2f} | "
              f"{r['whole_over_sharded_mlx_peak_mb']:>17.2f} {r['whole_anon_rss_mb'] / r['sharded_anon_rss_mb']:>5.2f}")
    print("\nDP step time, world 2: bucketed average_gradients vs per-tensor all_sum")
    for r in averaging:
        print(f"{r['backend']:>5} {r['tensors']} tensors: bucketed {r['bucketed_step_s'] * 1e3:.2f} ms, per-tensor "
              f"{r['per_tensor_step_s'] * 1e3:.2f} ms, per-tensor / bucketed {r['per_tensor_over_bucketed']:.2f}")
    print("\ntrainer throughput (mpi), global tokens/s")
    for r in throughput:
        print(f"world {r['world']}: {r['tokens_per_s']:,.0f} tokens/s ({r['per_rank_tokens_per_s']:,.0f} per rank, "
              f"{r['vs_world1']:.2f}x world 1)")
    results = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.platform(),
               "python": platform.python_version(), "cpus": os.cpu_count(), "model_flags": MODEL,
               "load_average_at_end": os.getloadavg(), "elapsed_s": round(time.monotonic() - started, 1),
               "memory": memory, "averaging": averaging, "throughput": throughput}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "train.json"), "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        kind, *rest = sys.argv[2:]
        if kind == "memory":
            memory_worker(rest[0], rest[1], int(rest[2]), rest[3])
        else:
            averaging_worker(int(rest[0]), rest[1])
    else:
        main()
