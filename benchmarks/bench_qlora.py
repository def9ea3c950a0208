"""QLoRA: the bundled trainer's `--adapter lora` on a 4-bit model against `mlx_lm lora` (its default LoRA) on the
same one, both launched as users launch them (`clusterctl run --hosts inventory.yaml --backend B --plain ...`) on
the same 2 loopback sshd hosts (tests/sshcluster.py), base, data, batch and sequence length, side by side in one run.

    .venv/bin/python benchmarks/bench_qlora.py [--steps 15] [--backends ring,mpi] [--part 1|2] [--repeat 1]

The base: bench_finetune.py's 1.7M-parameter llama (4 layers, dim 192, mlp 512) quantized to 4 bits, groups of
64, by mlx-lm's own convert; the data its 600 text records. Both adapt every linear layer of every block at rank 8,
scale 20 (mlx-lm's defaults; ours: --lora-layers -1). mlx-lm: --batch-size 8 (global: 4 records a rank),
--max-seq-length 128; its tokens/s is its own figure (real tokens of every rank, padding left out), its per-rank
peak from `mx.get_peak_memory()` (benchmarks/lora_metrics.py). Ours: the same --batch-size 8 (global) and --max-seq-length 128,
dp and fsdp; packed rows have no padding. The median of the reports after the first two; the largest peak of any
rank.

Part 2, world 4 over ring (4 hosts): a 16-block 4-bit llama (width 256, mlp 768; groups of 64), LoRA on every
linear layer of every block, 2 records a rank (--batch-size 8, global) cut to 64 tokens, dp against zero3 over 10 steps: per-rank peak (the issue's target:
zero3 at most 0.5x dp's, goal 0.35x), tokens/s (at least 0.5x dp's) and final loss; `--repeat N` runs the pair N
times, interleaved (this machine's 2 cores are shared, and a run's speed moves with what else runs): the ratios are
each pair's, their median kept. `--part 1` or `--part 2` runs one part; the other's figures are carried over from
the last record. Writes benchmarks/results/qlora.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_finetune import BATCH, SEQ, make_project, mlx_lm_lora, ours, over_mlx_lm, zero3_over_dp  # noqa: E402
from bench_zero3 import subset_inventory  # noqa: E402
from record import write_record  # noqa: E402

WIDE = ["--model", "models/b16-4bit", "--data", "data/text", "--adapter", "lora", "--lora-layers", "-1",
        "--batch-size", "8", "--max-seq-length", "64", "--lr", "1e-3", "--warmup", "2", "--report-every", "1",
        "--eval-every", "0", "--ckpt-every", "0", "--steps", "10"]
OURS = ["--model", "models/m1-4bit", "--data", "data/text", "--adapter", "lora", "--lora-layers", "-1",
        "--batch-size", str(2 * BATCH), "--max-seq-length", str(SEQ), "--lr", "1e-3", "--warmup", "2", "--report-every", "1",
        "--eval-every", "0", "--ckpt-every", "0"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--backends", default="ring,mpi")
    parser.add_argument("--part", type=int, choices=(1, 2), help="run this part only (default: both)")
    parser.add_argument("--repeat", type=int, default=1, help="part 2's dp and zero3 pair this many times")
    args = parser.parse_args()
    import lmfixture
    from sshcluster import SSHCluster

    rows, world4 = [], []
    with tempfile.TemporaryDirectory(prefix="bench-qlora-") as tmp:
        project = os.path.join(tmp, "project")
        make_project(project)
        lmfixture.quantize(os.path.join(project, "models", "m1"), os.path.join(project, "models", "m1-4bit"),
                           bits=4, group_size=64)
        b16 = lmfixture.make_model(os.path.join(tmp, "b16"), "llama", layers=16, dim=256, mlp=768)
        lmfixture.quantize(b16, os.path.join(project, "models", "b16-4bit"), bits=4, group_size=64)
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 4).start()
        try:
            two = str(cluster.inventory.with_name("inventory-2.yaml"))
            with open(two, "w") as f:
                f.write(subset_inventory(cluster.inventory.read_text(), 2))
            ours(project, two, "ring", [*OURS, "--steps", "2"])          # warm: plan cache, SSH masters, sync
            if args.part in (None, 1):
                rows = part_one(project, two, args)
            if args.part in (None, 2):
                world4 = part_two(project, str(cluster.inventory), args.repeat)
        finally:
            cluster.stop_all()
    previous = _previous()
    part1 = ({"steps": args.steps, "flags": OURS, "rows": rows,
              "ratios": over_mlx_lm(rows, args.backends.split(","), "mlx_lm lora", ("dp", "fsdp"))} if rows else
             {k: previous[k] for k in ("steps", "flags", "rows", "ratios")} | {"part1_date": previous.get("part1_date",
                                                                                                     previous["date"])})
    part2 = ({"world4_flags": WIDE, "world4": world4, "world4_ratios": _median_ratios(world4)} if world4 else
             {k: previous[k] for k in ("world4_flags", "world4", "world4_ratios")} | {
                 "part2_date": previous.get("part2_date", previous["date"])})
    write_record("qlora", **part1, **part2)
    return 0


def part_one(project: str, two: str, args) -> list[dict]:
    rows = []
    for backend in args.backends.split(","):
        got = mlx_lm_lora(project, two, backend, args.steps, kind="lora", model="models/m1-4bit")
        rows.append({"backend": backend, "trainer": "mlx_lm lora", **got})
        print(f"{backend} world 2 mlx_lm lora: {got['tokens_per_s']:,.0f} tok/s, peak {got['peak_mb']:.1f} MB, "
              f"final loss {got['final_loss']:.3f}", flush=True)
        for strategy in ("dp", "fsdp"):
            got = ours(project, two, backend, [*OURS, "--steps", str(args.steps), "--strategy", strategy])
            rows.append({"backend": backend, "trainer": f"clusterctl {strategy}", **got})
            print(f"{backend} world 2 clusterctl --adapter lora {strategy}: {got['tokens_per_s']:,.0f} tok/s, "
                  f"peak {got['peak_mb']:.1f} MB, final loss {got['final_loss']:.3f}", flush=True)
    return rows


def part_two(project: str, inventory: str, repeat: int) -> list[dict]:
    """dp then zero3 at world 4, `repeat` rounds: a row each, with its round."""
    world4 = []
    for round_ in range(1, repeat + 1):
        for strategy in ("dp", "zero3"):
            got = ours(project, inventory, "ring", [*WIDE, "--strategy", strategy])
            world4.append({"strategy": strategy, "round": round_, **got})
            print(f"ring world 4, 16-block 4-bit base, round {round_}, {strategy}: peak {got['peak_mb']:.1f} MB, "
                  f"final loss {got['final_loss']:.4f}, {got['tokens_per_s']:,.0f} tok/s", flush=True)
    return world4


def _median_ratios(world4: list[dict]) -> dict:
    """zero3 against dp, each round's pair, then the median of each ratio over the rounds (with every round's)."""
    pairs = [zero3_over_dp(*(next(r for r in world4 if r["round"] == n and r["strategy"] == s) for s in ("dp", "zero3")))
             for n in sorted({r["round"] for r in world4})]
    return {**{k: statistics.median(p[k] for p in pairs) for k in pairs[0]}, "rounds": pairs}


def _previous() -> dict:
    with open(os.path.join(HERE, "results", "qlora.json"), encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    sys.exit(main())
