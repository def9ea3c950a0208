"""Per-rank memory of FSDP (clusterctl.train.fsdp) against data parallel, at world 2 (and 4 on mpi).

    .venv/bin/python benchmarks/bench_fsdp.py [--steps 5]

A 4.2M-parameter MLP (three 1024x1024 Linear layers and a 1024->1023 one, whose weight has an odd first
dimension) trains with AdamW, once as data parallel (nn.average_gradients + optimizer.update) and once
with fsdp_apply_gradients, each in its own launch (mpirun for mpi, mlx.launch for ring) so the peaks do
not mix. Each rank reports the bytes of its parameters and optimizer state after the last step and
mx.get_peak_memory() over the steps after a warm-up. Writes benchmarks/results/fsdp.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from record import write_record  # noqa: E402

MiB = 1024**2


def worker(mode: str, backend: str, steps: int, out_dir: str) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from clusterctl.train.collectives import init_world, reduce_scatter_method
    from clusterctl.train.fsdp import fsdp_apply_gradients

    world = init_world(backend)
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1023))
    optimizer = optim.AdamW(learning_rate=1e-3)
    loss_grad = nn.value_and_grad(model, lambda x, y: nn.losses.mse_loss(model(x), y))

    def step(i):
        key = mx.random.key(1000 * i + world.rank())
        x, y = mx.random.normal((16, 1024), key=key), mx.random.normal((16, 1023), key=key)
        _, grads = loss_grad(x, y)
        if mode == "dp":
            optimizer.update(model, nn.average_gradients(grads, group=world))
        else:
            model.update(fsdp_apply_gradients(grads, model.parameters(), optimizer, max_norm=1.0)[0])
        mx.eval(model.parameters(), optimizer.state)

    step(0)                      # warm-up: optimizer state exists from here on
    mx.reset_peak_memory()
    for i in range(1, steps + 1):
        step(i)

    def nbytes(tree):
        return sum(v.nbytes for _, v in tree_flatten(tree))

    report = {"params": nbytes(model.parameters()), "optimizer_state": nbytes(optimizer.state),
              "peak": mx.get_peak_memory(), "n_params": sum(v.size for _, v in tree_flatten(model.parameters())),
              "reduce_scatter": reduce_scatter_method(world) if mode == "fsdp" else "-"}
    with open(os.path.join(out_dir, f"{mode}-rank-{world.rank()}.json"), "w") as f:
        json.dump(report, f)


def launch(backend: str, world: int, mode: str, steps: int, out_dir: str) -> list[dict]:
    script = [sys.executable, os.path.abspath(__file__), "--worker", mode, backend, str(steps), out_dir]
    env = {**os.environ, "CLUSTERCTL_WORLD_SIZE": str(world), "PYTHONPATH": REPO}
    if backend == "mpi":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        argv = ["mpirun", *root, "--oversubscribe", "-np", str(world), "-x", "CLUSTERCTL_WORLD_SIZE", *script]
    else:
        mlx_launch = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
        argv = [mlx_launch if os.path.exists(mlx_launch) else shutil.which("mlx.launch"), "-n", str(world),
                "--backend", "ring", "--env", f"CLUSTERCTL_WORLD_SIZE={world}", "--env", f"PYTHONPATH={REPO}",
                "--", *script]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{backend} {mode} failed: {r.stdout[-500:]} {r.stderr[-1500:]}")
    return [json.load(open(os.path.join(out_dir, f"{mode}-rank-{rank}.json"))) for rank in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker", nargs=4, metavar=("MODE", "BACKEND", "STEPS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        mode, backend, steps, out_dir = args.worker
        return worker(mode, backend, int(steps), out_dir)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as tmp:
        for backend, world in (("mpi", 2), ("ring", 2), ("mpi", 4)):
            dp = launch(backend, world, "dp", args.steps, tmp)
            fs = launch(backend, world, "fsdp", args.steps, tmp)
            # Per rank: the largest over ranks (FSDP's padded shares differ by at most a chunk).
            row = {"backend": backend, "world": world, "n_params": dp[0]["n_params"],
                   "reduce_scatter": fs[0]["reduce_scatter"]}
            for name, reports in (("dp", dp), ("fsdp", fs)):
                row[f"{name}_params"] = max(r["params"] for r in reports)
                row[f"{name}_state"] = max(r["optimizer_state"] for r in reports)
                row[f"{name}_params_state"] = max(r["params"] + r["optimizer_state"] for r in reports)
                row[f"{name}_peak"] = max(r["peak"] for r in reports)
            row["params_state_ratio"] = row["fsdp_params_state"] / row["dp_params_state"]
            row["state_ratio"] = row["fsdp_state"] / row["dp_state"]
            row["peak_ratio"] = row["fsdp_peak"] / row["dp_peak"]
            results.append(row)
    print(f"{'backend':<6} {'world':>5} {'reduce-scatter':>14} {'DP params+state':>15} {'FSDP params+state':>17} "
          f"{'ratio':>5} {'state ratio':>11} {'DP peak':>9} {'FSDP peak':>9} {'ratio':>5}")
    for r in results:
        print(f"{r['backend']:<6} {r['world']:>5} {r['reduce_scatter']:>14} {r['dp_params_state'] / MiB:>11.1f} MiB "
              f"{r['fsdp_params_state'] / MiB:>13.1f} MiB {r['params_state_ratio']:>5.2f} {r['state_ratio']:>11.2f} "
              f"{r['dp_peak'] / MiB:>5.1f} MiB {r['fsdp_peak'] / MiB:>5.1f} MiB {r['peak_ratio']:>5.2f}")
    write_record("fsdp", steps=args.steps, results=results)


if __name__ == "__main__":
    main()
