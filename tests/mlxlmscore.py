"""mlx-lm's own score of a model and its adapters: `mlx_lm.lora --test`'s evaluate (mlx_lm.tuner.trainer.evaluate on
its own dataset loader), as it is ("mlx_lm": it also scores one padding token after each record) and with that
padding target masked out ("no_pad": the definition clusterctl's trainer scores with; docs/from-mlx-lm.md#scores).
Run in its own process, as `mlx_lm.lora --test` runs:

    python tests/mlxlmscore.py '{"jobs": [["MODEL_DIR", "ADAPTER_DIR" or null], ...], "sets": [["DATA_DIR", true],
                                 ...], "split": "test", "losses": ["mlx_lm", "no_pad"]}'       # true: mask_prompt
    [[{"mlx_lm": 4.27, "no_pad": 3.82, "records": 60}, ...], ...]                # per job, per set

Several (model, adapters) pairs are scored in one process (score_many_in_process), so a comparison pays for one
start of mlx-lm, not one per result.

The quality check (tests/train/test_finetune_quality.py, benchmarks/bench_lora_quality.py) scores every trainer's
result with it, so ours and mlx-lm's are judged by mlx-lm's own code."""
from __future__ import annotations

import json
import subprocess
import sys
import types


def without_padding_target(model, batch, lengths):
    """mlx-lm's default_loss, its mask ending at the record's last token instead of one past it."""
    import mlx.core as mx
    import mlx.nn as nn

    inputs, targets = batch[:, :-1], batch[:, 1:]
    steps = mx.arange(1, targets.shape[1] + 1)
    mask = mx.logical_and(steps >= lengths[:, 0:1], steps < lengths[:, 1:])
    ce = nn.losses.cross_entropy(model(inputs), targets) * mask
    ntoks = mask.sum()
    return ce.astype(mx.float32).sum() / ntoks, ntoks


LOSSES = ("mlx_lm", "no_pad")          # mlx-lm's default_loss as it is; without its padding target


def loss_named(name: str):
    if name == "no_pad":
        return without_padding_target
    from mlx_lm.tuner.trainer import default_loss
    return default_loss


def score(model_dir: str, adapter: str | None, sets: list[tuple[str, bool]], split: str = "test",
          batch_size: int = 4, losses=LOSSES) -> list[dict]:
    """Each (data directory, mask_prompt) of `sets` scored by the model with the adapters (one load for all), by
    each of `losses` (of LOSSES)."""
    from mlx_lm import load
    from mlx_lm.tuner.datasets import CacheDataset, load_dataset
    from mlx_lm.tuner.trainer import evaluate

    model, tokenizer = load(model_dir, adapter_path=adapter or None)
    out = []
    for data, mask_prompt in sets:
        args = types.SimpleNamespace(data=data, mask_prompt=mask_prompt, train=split == "valid",
                                     test=split == "test", hf_dataset=None)
        _, valid, test = load_dataset(args, tokenizer)
        dataset = CacheDataset(test if split == "test" else valid)
        got = {name: evaluate(model, dataset, batch_size, -1, 2048, loss=loss_named(name)) for name in losses}
        out.append({**got, "records": len(dataset) // batch_size * batch_size})
    return out


def score_many_in_process(jobs, sets: list[tuple[str, bool]], split: str = "test", losses=LOSSES,
                          timeout: int = 600) -> list[list[dict]]:
    """score() of each (model directory, adapter directory or None) of `jobs`, all in one process of their own (as
    mlx_lm.lora --test would be run: its evaluate initialises MLX's distributed group)."""
    request = {"jobs": [[str(m), str(a) if a else None] for m, a in jobs], "sets": [[str(d), m] for d, m in sets],
               "split": split, "losses": list(losses)}
    r = subprocess.run([sys.executable, __file__, json.dumps(request)], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"scoring {jobs} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def score_in_process(model_dir, adapter, sets: list[tuple[str, bool]], split: str = "test", losses=LOSSES,
                     timeout: int = 300) -> list[dict]:
    """score() of one model and its adapters in a process of its own."""
    return score_many_in_process([(model_dir, adapter)], sets, split, losses, timeout)[0]


if __name__ == "__main__":
    asked = json.loads(sys.argv[1])
    print(json.dumps([score(model, adapter, [tuple(x) for x in asked["sets"]], asked["split"],
                            losses=asked["losses"]) for model, adapter in asked["jobs"]]))
