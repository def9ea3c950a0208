"""How fast any trainer could fine-tune these records on this machine's MLX, against mlx_lm.lora's batches: the
ceiling that packing can reach over mlx-lm when every token is trained (its default), one process.

    .venv/bin/python benchmarks/bench_lora_bound.py [--batches 100]

Both trainers run the same MLX kernels for a step (a compiled value_and_grad of the LoRA model and the optimizer's
update), so at the same settings they can differ only in the positions a step computes: mlx-lm sorts the records by
length, batches neighbours and pads each batch to one plus a multiple of 32; clusterctl packs records into rows with
per-record attention (data/records.py). This benchmark

1. measures the step time of the quality check's 4-bit base with LoRA on every block at 10 (rows, width) shapes and
   fits it as  a + b x positions + c x positions x width  (a position's own work, and its attention to the width of
   its row), printing the fit's largest error;
2. times real steps on mlx-lm's own batches (its iterate_batches, batch 4) and on ours (records.pack at
   attention_share, batches drawn at random as ours are by default, and grouped by length as mlx-lm's are);
3. prices, with the fitted model, a step that computes no padding and each record's own attention only (what no
   fixed-shape step can do): the ceiling of tokens/s over mlx-lm's.

Writes benchmarks/results/lora_bound.json.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import types
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from record import write_record  # noqa: E402

SHAPES = [(4, 64), (4, 96), (4, 128), (2, 96), (8, 96), (4, 192), (2, 256), (8, 48), (1, 96), (16, 32)]


def lora_step(model_dir: str):
    """(step(x, y[, segments]) compiled as both trainers compile theirs, the model, its tokenizer)."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load

    from clusterctl.train import packing

    model, tokenizer = load(model_dir)
    model.freeze()
    linear_to_lora_layers(model, len(model.layers), {"rank": 8, "scale": 20.0, "dropout": 0.0})
    optimizer = optim.Adam(learning_rate=5e-5)

    def loss(model, x, y, segments=None):
        logits = packing.forward(model, x, segments)
        trained = y >= 0
        return (nn.losses.cross_entropy(logits, mx.maximum(y, 0)) * trained).sum() / trained.sum()

    value_and_grad = nn.value_and_grad(model, loss)
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(*batch):
        value, grads = value_and_grad(model, *batch)
        optimizer.update(model, grads)
        return value

    return step, model, tokenizer


def seconds(step, batch, repeat: int) -> float:
    import mlx.core as mx

    for _ in range(2):
        mx.eval(step(*batch))            # compiled for this shape, warm
    began = time.perf_counter()
    for _ in range(repeat):
        mx.eval(step(*batch))
    return (time.perf_counter() - began) / repeat


def fit(step) -> tuple[list[float], float]:
    """The step-time model's (a, b, c) in seconds and its largest relative error over SHAPES."""
    import mlx.core as mx
    import numpy as np

    rows, times = [], []
    for n, w in SHAPES:
        x = mx.random.randint(0, 300, (n, w))
        times.append(seconds(step, (x, mx.random.randint(0, 300, (n, w))), 20))
        rows.append([1.0, n * w, n * w * w])
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)
    error = float(np.max(np.abs(np.array(rows) @ coef - times) / times))
    return [float(c) for c in coef], error


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=100)
    args = parser.parse_args()
    import lmfixture
    import mlx.core as mx
    from mlx_lm.tuner.datasets import CacheDataset, load_dataset
    from mlx_lm.tuner.trainer import iterate_batches

    from clusterctl.data import records
    from clusterctl.train.packing import attention_share

    with tempfile.TemporaryDirectory(prefix="bench-lora-bound-") as tmp:
        lmfixture.pretrain(os.path.join(tmp, "base"))
        base = lmfixture.quantize(os.path.join(tmp, "base"), os.path.join(tmp, "base-4bit"), bits=4, group_size=32)
        lmfixture.story_tasks(os.path.join(tmp, "data"))
        step, model, tokenizer = lora_step(str(base))
        (a, b, c), error = fit(step)
        print(f"step time = {a * 1e3:.2f} ms + {b * 1e6:.1f} us x positions + {c * 1e6:.3f} us x positions x width "
              f"(largest error over {len(SHAPES)} shapes {error:.1%})", flush=True)

        data = os.path.join(tmp, "data", "chat")
        options = types.SimpleNamespace(data=data, train=True, test=False, hf_dataset=None, mask_prompt=False)
        train = CacheDataset(load_dataset(options, tokenizer)[0])
        theirs = [(batch, [int(n) for n in lengths[:, 1].tolist()]) for _, (batch, lengths)
                  in zip(range(args.batches), iterate_batches(train, 4, 2048, seed=0))]
        seqs = records.tokenize_all(records.read_records(os.path.join(data, "train.jsonl")), tokenizer, False, 2048)
        share = attention_share(model)
        rng = random.Random(0)
        drawn = [rng.sample(range(len(seqs)), 4) for _ in range(args.batches)]
        by_length = sorted(range(len(seqs)), key=lambda k: len(seqs.ids[k]))
        grouped = [by_length[i:i + 4] for i in range(0, len(by_length) - 3, 4)]
        grouped = [grouped[k] for k in rng.sample(range(len(grouped)), min(args.batches, len(grouped)))]

        def ours(batches):
            out = []
            for picked in batches:
                rows = records.pack([records.pairs(seqs.ids[k], 0) for k in picked], 0, attention=share)
                out.append(((mx.array(rows.tokens), mx.array(rows.labels), mx.array(rows.segments)),
                            [len(seqs.ids[k]) for k in picked]))
            return out

        def mlx_lm(batches):            # inputs and targets as mlx-lm's default loss takes them (prompts trained)
            out = []
            for batch, lengths in batches:
                targets = mx.where(mx.arange(batch.shape[1] - 1)[None] < mx.array(lengths)[:, None] - 1,
                                   batch[:, 1:], -1)
                out.append(((batch[:, :-1], targets), lengths))
            return out

        def measured(batches) -> float:
            real = sum(sum(n - 1 for n in lengths) for _, lengths in batches)     # each record's inputs
            return real / sum(seconds(step, batch, 3) * 1 for batch, _ in batches)

        def modelled(lengths_of) -> float:
            real = sum(sum(n - 1 for n in lengths) for lengths in lengths_of)
            return real / sum(a + sum(b * (n - 1) + c * (n - 1) ** 2 for n in lengths) for lengths in lengths_of)

        rates = {"mlx_lm": measured(mlx_lm(theirs)), "ours_random": measured(ours(drawn)),
                 "ours_grouped": measured(ours(grouped)), "ceiling": modelled([n for _, n in theirs])}
    over = {k: v / rates["mlx_lm"] for k, v in rates.items()}
    for k in rates:
        print(f"{k}: {rates[k]:,.0f} tokens/s ({over[k]:.3f}x mlx-lm's batches)", flush=True)
    write_record("lora_bound", batches=args.batches, fit={"a_s": a, "b_s": b, "c_s": c, "largest_error": error},
                 attention_share=share, results={"tokens_per_s": rates, "over_mlx_lm": over})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
