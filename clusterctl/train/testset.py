"""The test set of a fine-tune: `test.jsonl` beside train.jsonl (mlx-lm's layout), scored once at the end of the
run, as `mlx_lm lora --test` scores it: the mean cross-entropy over every trained target of every test record
and its exponential, the perplexity. Each record counts once: the rows are dealt to the ranks, every rank scores
the same number of batches (a rank with fewer rows scores an empty one, which zero3's gathers need) and one
all_sum adds the ranks' sums.

    result = score(model, config, tokenizer, group)      # None without test.jsonl
    result = {"loss": ..., "perplexity": ..., "records": ..., "targets": ...}
"""
from __future__ import annotations

import math
import os

TEST = "test.jsonl"


def score(model, config, tokenizer, group) -> dict | None:
    """`config.data`'s test.jsonl scored by `model` (every rank calls this), or None when there is none."""
    if not config.data or not os.path.isfile(os.path.join(config.data, TEST)):
        return None
    import mlx.core as mx

    from ..data import records
    from .strategies import get

    test = records.read_records(os.path.join(config.data, TEST))
    packed = records.rows_of(test, tokenizer, config.block_size, config.mask_prompt == "on")
    rows = mx.array(packed.rows, dtype=mx.int32)
    labels = mx.array(packed.labels, dtype=mx.int32)
    rank, world, batch = group.rank(), group.size(), config.batch_size
    batches = -(-len(packed.rows) // (world * batch))
    total, count = mx.array(0.0), mx.array(0.0)
    loss_of = get(config.strategy).loss
    model.eval()
    for b in range(batches):
        first = (b * world + rank) * batch
        mine = list(range(first, min(first + batch, len(packed.rows))))
        x, y = (rows[mx.array(mine)][:, :-1], labels[mx.array(mine)][:, 1:]) if mine else \
            (rows[:1, :-1], mx.full(labels[:1, 1:].shape, records.IGNORE, dtype=mx.int32))     # nothing of ours
        mean = loss_of(model, x, y)
        targets = (y >= 0).sum().astype(mx.float32)
        total, count = total + mean * targets, count + targets
        mx.eval(total, count)
    model.train()
    if world > 1:
        total = mx.distributed.all_sum(total, group=group, stream=mx.cpu)
        count = mx.distributed.all_sum(count, group=group, stream=mx.cpu)
    loss = (total / mx.maximum(count, 1.0)).item()
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "records": len(test), "targets": int(count.item())}


def record(out_dir: str, step: int, result: dict) -> None:
    """Rank 0 says it, and keeps it: a metrics.jsonl line (`runs` shows the test loss) and trainer.json's "test",
    which `clusterctl run` puts into summary.json."""
    import json

    from ..atomic import write_text
    from ..trainer_contract import TRAINER_SUMMARY

    print(f"test: loss {result['loss']:.4f}, perplexity {result['perplexity']:.3f} over {result['records']:,} records "
          f"of {TEST} ({result['targets']:,} targets)", flush=True)
    with open(os.path.join(out_dir, "metrics.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "test_loss": result["loss"], "test_perplexity": result["perplexity"]}) + "\n")
    path = os.path.join(out_dir, TRAINER_SUMMARY)
    try:
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = {}
    write_text(path, json.dumps({**summary, "test": result}, indent=1))
