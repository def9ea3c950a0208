"""QLoRA: the bundled trainer's `--adapter lora` on a 4-bit model against `mlx_lm lora` (its default LoRA) on the
same one, both launched as users launch them (`clusterctl run --hosts inventory.yaml --backend B --plain ...`) on
the same 2 loopback sshd hosts (tests/sshcluster.py), base, data, batch and sequence length, side by side in one run.

    .venv/bin/python benchmarks/bench_qlora.py [--steps 15] [--backends ring,mpi]

The base: bench_finetune.py's 1.7M-parameter llama (4 layers, dim 192, mlp 512) quantized to 4 bits, groups of
64, by mlx-lm's own convert; the data its 600 text records. Both adapt every linear layer of every block at rank 8,
scale 20 (mlx-lm's defaults; ours: --lora-layers -1). mlx-lm: --batch-size 8 (global: 4 records a rank),
--max-seq-length 128; its tokens/s is its own figure (real tokens of every rank, padding left out), its per-rank
peak from `mx.get_peak_memory()` (benchmarks/lora_metrics.py). Ours: --batch-size 4 (a rank's) --block-size 128,
dp and fsdp; packed rows have no padding. The median of the reports after the first two; the largest peak of any
rank.

Part 2, world 4 over ring (4 hosts): a 16-block 4-bit llama (width 256, mlp 768; groups of 64), LoRA on every
linear layer of every block, batch 2, block 64, dp against zero3 over 10 steps: per-rank peak (the issue's target:
zero3 at most 0.5x dp's, goal 0.35x) and final loss. Writes benchmarks/results/qlora.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_finetune import BATCH, SEQ, make_project, mlx_lm_lora, ours, over_mlx_lm, zero3_over_dp  # noqa: E402
from bench_zero3 import subset_inventory  # noqa: E402
from record import write_record  # noqa: E402

WIDE = ["--model", "models/b16-4bit", "--data", "data/text", "--adapter", "lora", "--lora-layers", "-1",
        "--batch-size", "2", "--block-size", "64", "--lr", "1e-3", "--warmup", "2", "--report-every", "1",
        "--eval-every", "0", "--ckpt-every", "0", "--steps", "10"]
OURS = ["--model", "models/m1-4bit", "--data", "data/text", "--adapter", "lora", "--lora-layers", "-1",
        "--batch-size", str(BATCH), "--block-size", str(SEQ), "--lr", "1e-3", "--warmup", "2", "--report-every", "1",
        "--eval-every", "0", "--ckpt-every", "0"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--backends", default="ring,mpi")
    args = parser.parse_args()
    import lmfixture
    from sshcluster import SSHCluster

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-qlora-") as tmp:
        project = os.path.join(tmp, "project")
        make_project(project)
        lmfixture.quantize(os.path.join(project, "models", "m1"), os.path.join(project, "models", "m1-4bit"),
                           bits=4, group_size=64)
        b16 = lmfixture.make_model(os.path.join(tmp, "b16"), "llama", layers=16, dim=256, mlp=768)
        lmfixture.quantize(b16, os.path.join(project, "models", "b16-4bit"), bits=4, group_size=64)
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 4).start()
        world4 = []
        try:
            two = str(cluster.inventory.with_name("inventory-2.yaml"))
            with open(two, "w") as f:
                f.write(subset_inventory(cluster.inventory.read_text(), 2))
            ours(project, two, "ring", [*OURS, "--steps", "2"])          # warm: plan cache, SSH masters, sync
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
            for strategy in ("dp", "zero3"):
                got = ours(project, str(cluster.inventory), "ring", [*WIDE, "--strategy", strategy])
                world4.append({"strategy": strategy, **got})
                print(f"ring world 4, 16-block 4-bit base, {strategy}: peak {got['peak_mb']:.1f} MB, final loss "
                      f"{got['final_loss']:.4f}, {got['tokens_per_s']:,.0f} tok/s", flush=True)
        finally:
            cluster.stop_all()
    ratios = over_mlx_lm(rows, args.backends.split(","), "mlx_lm lora", ("dp", "fsdp"))
    wide = zero3_over_dp(*world4)
    write_record("qlora", steps=args.steps, flags=OURS, rows=rows, ratios=ratios, world4_flags=WIDE, world4=world4,
                 world4_ratios=wide)
    return 0


if __name__ == "__main__":
    sys.exit(main())
