"""QLoRA on one GPU: the bundled trainer's `--adapter lora` against `mlx_lm lora` on the same 4-bit base, data,
batch and sequence length, one process each, side by side in one run (MLX's CUDA backend, `mlx[cuda13]`).

    python benchmarks/bench_qlora_gpu.py [--steps 30] [--sizes small,1b]

No SSH and no launcher: one rank on one GPU, `python -m clusterctl.train` and `python lora_metrics.py` (mlx-lm's
own lora with a callback that prints its tokens/s and peak), each run as its own process. The bases, made here
with random weights by tests/lmfixture.py and quantized to 4 bits, groups of 64, by mlx-lm's convert:

- small: bench_qlora.py's 1.7M-parameter llama (4 layers, dim 192): the CPU table's run, for the ratio;
- 1b: a 1.1B-parameter llama shaped as TinyLlama (22 blocks, dim 2048, mlp 5632, 32 heads, 4 kv heads), bf16.

Both trainers adapt every linear layer of every block at rank 8, scale 20 (mlx-lm's defaults); the data are
bench_finetune.py's 600 text records; batch 8, sequence 128 (small) or 512 (1b). tokens/s: the median of the
reports after the first two (ours: packed rows, every token real; mlx-lm's: real tokens, padding left out);
peak: `mx.get_peak_memory()` of the process. Writes benchmarks/results/qlora_gpu.json. Without a GPU it
says so and stops (run_all.py runs it too).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)

from record import write_record  # noqa: E402

SIZES = {   # name: (make_model keywords, batch, sequence)
    "small": (dict(layers=4, dim=192, mlp=512), 8, 128),
    "1b": (dict(layers=22, dim=2048, mlp=5632, heads=32, kv_heads=4, dtype="bfloat16"), 8, 512),
    "tiny-check": (dict(layers=2, dim=128, mlp=256, heads=4, kv_heads=2, dtype="bfloat16"), 4, 128),
}


def make_data(root: str) -> str:
    import random

    import lmfixture

    rng, pool = random.Random(0), lmfixture.sentences(4000)
    path = os.path.join(root, "data", "text")
    os.makedirs(path)
    for name, n in (("train.jsonl", 600), ("valid.jsonl", 20)):
        with open(os.path.join(path, name), "w") as f:
            for _ in range(n):
                f.write(json.dumps({"text": " ".join(rng.sample(pool, rng.randint(1, 8)))}) + "\n")
    return path


def timed(cmd: list[str], cwd: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if r.returncode:
        sys.exit(f"{cmd[:3]} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall, r.stdout


def ours(root: str, model: str, data: str, batch: int, seq: int, steps: int) -> dict:
    out = os.path.join(root, f"ours-{os.path.basename(model)}")
    wall, _ = timed([sys.executable, "-m", "clusterctl.train", "--model", model, "--data", data, "--adapter", "lora",
                     "--lora-layers", "-1", "--batch-size", str(batch), "--max-seq-length", str(seq), "--lr", "1e-4", "--min-lr", "0",
                     "--warmup", "2", "--report-every", "1", "--eval-every", "0", "--ckpt-every", "0",
                     "--steps", str(steps), "--out", out], root)
    reports = [x for x in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "tokens_per_s" in x]
    steady = [x["tokens_per_s"] for x in reports[2:]] or [x["tokens_per_s"] for x in reports]
    return {"wall_s": wall, "tokens_per_s": statistics.median(steady), "first_loss": reports[0]["loss"],
            "final_loss": reports[-1]["loss"], "peak_mb": max(x["peak_mem_mb"] for x in reports),
            "tokens_per_step": batch * seq}       # at most: records of up to seq tokens, packed


def mlx_lm(root: str, model: str, data: str, batch: int, seq: int, steps: int) -> dict:
    wall, stdout = timed([sys.executable, os.path.join(HERE, "lora_metrics.py"), "--model", model, "--train",
                          "--data", data, "--fine-tune-type", "lora", "--num-layers", "-1", "--batch-size", str(batch),
                          "--iters", str(steps), "--max-seq-length", str(seq), "--learning-rate", "1e-4",
                          "--steps-per-report", "1", "--steps-per-eval", "100000", "--val-batches", "1",
                          "--adapter-path", os.path.join(root, f"theirs-{os.path.basename(model)}"),
                          "--save-every", "100000"], root)
    reports = [json.loads(line.split("LORA_METRICS ", 1)[1]) for line in stdout.splitlines() if "LORA_METRICS " in line]
    steady = [x["tokens_per_s"] for x in reports[2:]] or [x["tokens_per_s"] for x in reports]
    return {"wall_s": wall, "tokens_per_s": statistics.median(steady), "first_loss": reports[0]["loss"],
            "final_loss": reports[-1]["loss"], "peak_mb": max(x["peak_mb"] for x in reports),
            "tokens_per_step": reports[-1]["trained_tokens"] / reports[-1]["iteration"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sizes", default="small,1b")
    args = parser.parse_args()
    import lmfixture
    import mlx.core as mx

    if not mx.is_available(mx.gpu):     # run_all.py runs every bench_*.py: on a CPU this one has nothing to say
        print("bench_qlora_gpu: no GPU here (MLX sees none): skipped; results/qlora_gpu.json keeps the last "
              "GPU figures", flush=True)
        return 0

    device = {"mlx": mx.__version__, "default_device": str(mx.default_device())}
    try:
        device["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                        "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        device["gpu"] = None
    print(json.dumps(device), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-qlora-gpu-") as root:
        data = make_data(root)
        for size in args.sizes.split(","):
            shape, batch, seq = SIZES[size]
            start = time.monotonic()
            base = lmfixture.make_model(os.path.join(root, "float", size), "llama", **shape)
            model = str(lmfixture.quantize(base, os.path.join(root, f"{size}-4bit"), bits=4, group_size=64))
            made = time.monotonic() - start
            for name, fn in (("mlx_lm lora", mlx_lm), ("clusterctl dp", ours)):
                got = fn(root, model, data, batch, seq, args.steps)
                rows.append({"size": size, "trainer": name, "batch": batch, "seq": seq, "steps": args.steps, **got})
                print(f"{size} ({made:.0f} s to make) {name}: {got['tokens_per_s']:,.0f} tok/s, peak "
                      f"{got['peak_mb']:,.1f} MB, loss {got['first_loss']:.3f} -> {got['final_loss']:.3f}, "
                      f"{got['wall_s']:.1f} s wall", flush=True)
    ratios = {}
    for size in args.sizes.split(","):
        theirs, mine = (next(r for r in rows if r["size"] == size and r["trainer"] == t)
                        for t in ("mlx_lm lora", "clusterctl dp"))
        ratios[size] = {"tokens_over_mlx_lm": mine["tokens_per_s"] / theirs["tokens_per_s"],
                        "peak_over_mlx_lm": mine["peak_mb"] / theirs["peak_mb"],
                        "tokens_per_step_over_mlx_lm": mine["tokens_per_step"] / theirs["tokens_per_step"]}
        print(f"{size}: clusterctl/mlx_lm tokens/s {ratios[size]['tokens_over_mlx_lm']:.2f}x, "
              f"peak {ratios[size]['peak_over_mlx_lm']:.2f}x with {ratios[size]['tokens_per_step_over_mlx_lm']:.2f}x the "
              f"tokens a step", flush=True)
    write_record("qlora_gpu", device=device, steps=args.steps, rows=rows, ratios=ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
