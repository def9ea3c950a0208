"""mlx-lm's own score of a model and its adapters: `mlx_lm.lora --test`'s evaluate (mlx_lm.tuner.trainer.evaluate on
its own dataset loader), as it is ("mlx_lm": it also scores one padding token after each record) and with that
padding target masked out ("no_pad": the definition clusterctl's trainer scores with; docs/from-mlx-lm.md#scores).
Run in its own process, as `mlx_lm.lora --test` runs:

    python tests/mlxlmscore.py MODEL_DIR ADAPTER_DIR|- test|valid '[["DATA_DIR", true], ...]'    # mask_prompt
    [{"mlx_lm": 4.27, "no_pad": 3.82, "records": 60}, ...]

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


def score(model_dir: str, adapter: str | None, sets: list[tuple[str, bool]], split: str = "test",
          batch_size: int = 4) -> list[dict]:
    """Each (data directory, mask_prompt) of `sets` scored by the model with the adapters (one load for all)."""
    from mlx_lm import load
    from mlx_lm.tuner.datasets import CacheDataset, load_dataset
    from mlx_lm.tuner.trainer import default_loss, evaluate

    model, tokenizer = load(model_dir, adapter_path=adapter or None)
    out = []
    for data, mask_prompt in sets:
        args = types.SimpleNamespace(data=data, mask_prompt=mask_prompt, train=split == "valid",
                                     test=split == "test", hf_dataset=None)
        _, valid, test = load_dataset(args, tokenizer)
        dataset = CacheDataset(test if split == "test" else valid)
        got = {name: evaluate(model, dataset, batch_size, -1, 2048, loss=fn)
               for name, fn in (("mlx_lm", default_loss), ("no_pad", without_padding_target))}
        out.append({**got, "records": len(dataset) // batch_size * batch_size})
    return out


def score_in_process(model_dir, adapter, sets: list[tuple[str, bool]], split: str = "test",
                     timeout: int = 300) -> list[dict]:
    """score() in a process of its own (as mlx_lm.lora --test would be run)."""
    r = subprocess.run([sys.executable, __file__, str(model_dir), str(adapter) if adapter else "-", split,
                        json.dumps([[str(d), m] for d, m in sets])], capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"scoring {adapter} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    model_dir, adapter, split, sets = sys.argv[1:5]
    print(json.dumps(score(model_dir, None if adapter == "-" else adapter, [tuple(x) for x in json.loads(sets)],
                           split)))
