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
rank. Writes benchmarks/results/qlora.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_finetune import BATCH, SEQ, make_project, mlx_lm_lora, ours, over_mlx_lm  # noqa: E402
from bench_zero3 import subset_inventory  # noqa: E402
from record import write_record  # noqa: E402

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
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 2).start()
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
        finally:
            cluster.stop_all()
    ratios = over_mlx_lm(rows, args.backends.split(","), "mlx_lm lora", ("dp", "fsdp"))
    write_record("qlora", steps=args.steps, flags=OURS, rows=rows, ratios=ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
