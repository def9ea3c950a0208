"""The test set of a fine-tune: `test.jsonl` beside train.jsonl (mlx-lm's layout), scored once at the end of the
run, as `mlx_lm lora --test` scores it: each record alone (per-record attention in packed rows), the mean
cross-entropy over every trained target of every test record, and its exponential, the perplexity. Each record
counts once: the global batches are dealt to the ranks, every rank scores the same number of batches (a rank with
no records left scores a row of padding, which zero3's gathers need) and one all_sum adds the ranks' sums.
mlx-lm also scores one padding token after each record and leaves out the last batch when it is not whole; ours
does neither (docs/from-mlx-lm.md#scores says how the two numbers relate).

    result = score(model, finetune.test_set(...), config.test_batches, group, entry.loss)
    result = {"loss": ..., "perplexity": ..., "records": ..., "targets": ...}
"""
from __future__ import annotations

import math
import os

TEST = "test.jsonl"


def evaluate(model, loader, batches: int, group, loss) -> float:
    """The held-out loss over `loader`'s first `batches` held-out batches (-1: all) on every rank: every trained
    target weighs the same, summed over the ranks (mlx-lm's definition; the bundled model's batches are all the
    same size, so it is their mean). `loss`: the strategy's (strategies.Strategy.loss), a batch's mean."""
    return scored(model, loader, batches, group, loss)[0]


def scored(model, loader, batches: int, group, loss) -> tuple[float, int]:
    """(the mean loss over every trained target, how many there were): see evaluate."""
    import mlx.core as mx

    model.eval()
    total, count = mx.array(0.0), mx.array(0.0)
    for batch in loader.held_out(batches):
        targets = (batch[1] >= 0).sum().astype(mx.float32)
        total, count = total + loss(model, *batch) * targets, count + targets
        mx.eval(total, count)
    model.train()
    if group.size() > 1:
        total = mx.distributed.all_sum(total, group=group, stream=mx.cpu)
        count = mx.distributed.all_sum(count, group=group, stream=mx.cpu)
    return (total / mx.maximum(count, 1.0)).item(), int(count.item())


def score(model, test, batches: int, group, loss) -> dict:
    """The test set (`test`: a records.HeldOut of test.jsonl) scored by `model` on every rank: the mean loss over its
    first `batches` global batches (-1: all; --test-batches) and its exponential."""
    loss_value, targets = scored(model, test, batches, group, loss)
    records = min(test.count(batches) * test.batch_size, len(test.seqs))
    return {"loss": loss_value, "perplexity": math.exp(min(loss_value, 700.0)), "records": records,
            "targets": targets}


def record(out_dir: str, step: int, result: dict) -> None:
    """Rank 0 says it, and keeps it: a metrics.jsonl line (`runs` shows the test loss) and trainer.json's "test",
    which `clusterctl run` puts into summary.json."""
    import json

    from ..atomic import write_text
    from ..trainer_contract import TRAINER_SUMMARY

    print(f"test: loss {result['loss']:.4f}, perplexity {result['perplexity']:.3f} over {result['records']:,} records "
          f"of {TEST} ({result['targets']:,} targets)", flush=True)
    os.makedirs(out_dir, exist_ok=True)          # scoring alone (--test without --train) trained nothing there
    with open(os.path.join(out_dir, "metrics.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "test_loss": result["loss"], "test_perplexity": result["perplexity"]}) + "\n")
    path = os.path.join(out_dir, TRAINER_SUMMARY)
    try:
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = {}
    write_text(path, json.dumps({**summary, "test": result}, indent=1))
