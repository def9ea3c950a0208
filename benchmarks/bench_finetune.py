"""Fine-tuning an mlx-lm model: the bundled trainer's `--model` against `mlx_lm lora --fine-tune-type full`, both
launched as users launch them (`clusterctl run --hosts inventory.yaml --backend B --plain ...`) on the same
loopback sshd hosts (tests/sshcluster.py), model, data, batch and sequence length, side by side in one run.

    .venv/bin/python benchmarks/bench_finetune.py [--steps 15] [--backends ring,mpi]

Part 1, world 2: a 1.7M-parameter llama (4 layers, dim 192, mlp 512; tests/lmfixture.py) on 600 text records of
1 to 8 sentences (15 to 160 tokens). mlx-lm: --batch-size 8 (its batch is global: 4 records a rank),
--max-seq-length 128, --num-layers -1; its tokens/s is its own figure (real tokens of every rank, padding left
out), its per-rank peak from `mx.get_peak_memory()` through benchmarks/lora_metrics.py. Ours: the same
--batch-size 8 (global, as mlx-lm's) and --max-seq-length 128, dp, fsdp and zero3; a rank's records are packed,
each attending to itself, so less padding is computed. The median of the reports after the first two; the largest peak of any rank. mlx-lm trains the blocks
only (embedding, final norm and output matrix frozen: less work a step); ours trains every parameter.

Part 2, world 4 over ring: a parameter-dominated llama (4 layers, dim 384, mlp 1536, 9.8M parameters; block 16,
batch 2), dp against zero3 over 30 steps: per-rank peak and final loss. Writes benchmarks/results/finetune.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_zero3 import subset_inventory  # noqa: E402
from record import write_record  # noqa: E402

SEQ, BATCH = 128, 4
# the same records a step as mlx-lm's global --batch-size (BATCH a rank on 2), cut to the same length
OURS = ["--model", "models/m1", "--data", "data/text", "--batch-size", str(2 * BATCH), "--max-seq-length", str(SEQ),
        "--lr", "1e-3", "--warmup", "2", "--report-every", "1", "--eval-every", "0", "--ckpt-every", "0"]
BIG = ["--model", "models/m2", "--data", "data/text", "--batch-size", "8", "--max-seq-length", "16", "--lr", "1e-3",
       "--warmup", "3", "--report-every", "5", "--eval-every", "0", "--ckpt-every", "0"]


def make_project(root: str) -> None:
    import lmfixture

    lmfixture.make_model(os.path.join(root, "models", "m1"), "llama", layers=4, dim=192, mlp=512)
    lmfixture.make_model(os.path.join(root, "models", "m2"), "llama", layers=4, dim=384, mlp=1536)
    rng, pool = random.Random(0), lmfixture.sentences(4000)
    os.makedirs(os.path.join(root, "data", "text"))
    for name, n in (("train.jsonl", 600), ("valid.jsonl", 20)):
        with open(os.path.join(root, "data", "text", name), "w") as f:
            for _ in range(n):
                f.write(json.dumps({"text": " ".join(rng.sample(pool, rng.randint(1, 8)))}) + "\n")
    shutil.copy(os.path.join(HERE, "lora_metrics.py"), root)


def clusterctl_run(project: str, inventory: str, backend: str, program: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    argv = [sys.executable, "-m", "clusterctl", "run", "--hosts", inventory, "--backend", backend, "--plain", *program]
    began = time.monotonic()
    r = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return time.monotonic() - began, r


def ours(project: str, inventory: str, backend: str, args: list[str]) -> dict:
    wall, r = clusterctl_run(project, inventory, backend, ["--", *args])
    run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]+)", r.stderr).group(1)
    [path] = glob.glob(os.path.join(project, "runs", run_id, "metrics.jsonl"))
    reports = [x for x in map(json.loads, open(path)) if "tokens_per_s" in x]
    steady = [x["tokens_per_s"] for x in reports[2:]] or [x["tokens_per_s"] for x in reports]
    return {"wall_s": wall, "tokens_per_s": statistics.median(steady), "final_loss": reports[-1]["loss"],
            "peak_mb": max(x["peak_mem_mb"] for x in reports)}


def mlx_lm_lora(project: str, inventory: str, backend: str, steps: int, kind: str = "full",
                model: str = "models/m1") -> dict:
    """`mlx_lm lora --fine-tune-type KIND` of `model` on 2 ranks through `clusterctl run`, its own figures."""
    program = ["lora_metrics.py", "--model", model, "--train", "--data", "data/text", "--fine-tune-type", kind,
               "--num-layers", "-1", "--batch-size", str(2 * BATCH), "--iters", str(steps), "--max-seq-length",
               str(SEQ), "--learning-rate", "1e-3", "--steps-per-report", "1", "--steps-per-eval", "100000",
               "--val-batches", "1", "--adapter-path", "adapters", "--save-every", "100000"]
    wall, r = clusterctl_run(project, inventory, backend, program)
    reports = [json.loads(line.split("LORA_METRICS ", 1)[1]) for line in r.stdout.splitlines() if "LORA_METRICS " in line]
    rank0 = [x for x in reports if x["rank"] == 0]
    steady = [x["tokens_per_s"] for x in rank0[2:]] or [x["tokens_per_s"] for x in rank0]
    return {"wall_s": wall, "tokens_per_s": statistics.median(steady), "final_loss": rank0[-1]["loss"],
            "peak_mb": max(x["peak_mb"] for x in reports)}


def over_mlx_lm(rows: list[dict], backends: list[str], theirs: str, strategies: tuple[str, ...]) -> dict:
    """Per backend and strategy, our tokens/s and peak over mlx-lm's row `theirs`, printed as they are made."""
    ratios = {}
    for backend in backends:
        mine = {r["trainer"]: r for r in rows if r["backend"] == backend}
        ref = mine[theirs]
        ratios[backend] = {s: {"tokens_over_mlx_lm": mine[f"clusterctl {s}"]["tokens_per_s"] / ref["tokens_per_s"],
                               "peak_over_mlx_lm": mine[f"clusterctl {s}"]["peak_mb"] / ref["peak_mb"]}
                           for s in strategies}
        print(f"{backend} world 2: " + ", ".join(f"{s} tok/s {v['tokens_over_mlx_lm']:.2f}x mlx-lm, peak "
                                                 f"{v['peak_over_mlx_lm']:.2f}x" for s, v in ratios[backend].items()))
    return ratios


def zero3_over_dp(dp: dict, z3: dict) -> dict:
    """zero3's peak, final loss and tokens/s against dp's in the same run (world 4), printed as they are made."""
    ratios = {"zero3_peak_over_dp": z3["peak_mb"] / dp["peak_mb"],
              "zero3_loss_vs_dp": z3["final_loss"] / dp["final_loss"] - 1,
              "zero3_tokens_over_dp": z3["tokens_per_s"] / dp["tokens_per_s"]}
    print(f"ring world 4: zero3 peak / dp {ratios['zero3_peak_over_dp']:.3f}, final loss "
          f"{ratios['zero3_loss_vs_dp'] * 100:+.2f}%, tok/s {ratios['zero3_tokens_over_dp']:.2f}x")
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--backends", default="ring,mpi")
    args = parser.parse_args()
    from sshcluster import SSHCluster

    rows, big = [], []
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        project = os.path.join(tmp, "project")
        make_project(project)
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 4).start()
        try:
            two = str(cluster.inventory.with_name("inventory-2.yaml"))       # beside its ssh_config
            with open(two, "w") as f:
                f.write(subset_inventory(cluster.inventory.read_text(), 2))
            ours(project, two, "ring", [*OURS, "--steps", "2"])          # warm: plan cache, SSH masters, sync
            for backend in args.backends.split(","):
                got = mlx_lm_lora(project, two, backend, args.steps)
                rows.append({"backend": backend, "trainer": "mlx_lm lora --fine-tune-type full", **got})
                print(f"{backend} world 2 mlx_lm lora full: {got['tokens_per_s']:,.0f} tok/s, peak {got['peak_mb']:.1f} MB, "
                      f"final loss {got['final_loss']:.3f}", flush=True)
                for strategy in ("dp", "fsdp", "zero3"):
                    got = ours(project, two, backend, [*OURS, "--steps", str(args.steps), "--strategy", strategy])
                    rows.append({"backend": backend, "trainer": f"clusterctl {strategy}", **got})
                    print(f"{backend} world 2 clusterctl {strategy}: {got['tokens_per_s']:,.0f} tok/s, peak "
                          f"{got['peak_mb']:.1f} MB, final loss {got['final_loss']:.3f}", flush=True)
            for strategy in ("dp", "zero3"):
                got = ours(project, str(cluster.inventory), "ring", [*BIG, "--steps", "30", "--strategy", strategy])
                big.append({"strategy": strategy, **got})
                print(f"ring world 4 big model {strategy}: peak {got['peak_mb']:.1f} MB, final loss "
                      f"{got['final_loss']:.4f}, {got['tokens_per_s']:,.0f} tok/s", flush=True)
        finally:
            cluster.stop_all()

    ratios = over_mlx_lm(rows, args.backends.split(","), "mlx_lm lora --fine-tune-type full", ("dp", "fsdp", "zero3"))
    world4 = zero3_over_dp(*big)
    write_record("finetune", steps=args.steps, flags=OURS, big_flags=BIG, rows=rows, world4=big, ratios=ratios,
                 world4_ratios=world4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
