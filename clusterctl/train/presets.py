"""Named sizes for the trainer: a model and the step count, learning-rate schedule and report / held-out /
checkpoint cadence that suit it, so that a bare `python -m clusterctl.train` (or `clusterctl run`) trains
something sensible for the machine and then stops.

A preset only supplies values nothing else gave: flags > `--config FILE` > the checkpoint's settings (when
resuming) > the preset > TrainConfig's defaults. Without `--preset`, MLX's default device decides: a GPU
(Apple Silicon's Metal) gets `small`, a CPU gets `tiny`. Resuming, the checkpoint's preset is kept even on
another device: its settings are the run's.

Standard library only: config.py (argparse) and the tests read this table without MLX.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from ..errors import ConfigError


@dataclass(frozen=True)
class Preset:
    name: str
    purpose: str                      # one clause for --help and docs/trainer.md#presets
    settings: Mapping[str, object]    # TrainConfig field -> value


def _preset(name: str, purpose: str, **settings) -> Preset:
    return Preset(name, purpose, MappingProxyType(settings))


# tiny is the README's former main-job line, measured on a 2-core CPU (45-48 s, loss 5.51 -> 1.24:
# benchmarks/RESULTS.md, main_job).
# small and base are sized for a GPU; base is TrainConfig's own defaults, so TrainConfig() is a base run.
PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    _preset("tiny", "the default on a CPU: under a minute on 2 cores",
            n_layers=2, dim=64, n_heads=4, mlp_dim=128, block_size=64, batch_size=8,
            steps=400, lr=3e-3, warmup=20, min_lr=1e-4, report_every=40, eval_every=200, ckpt_every=200),
    _preset("small", "the default on a GPU",
            n_layers=4, dim=128, n_heads=4, mlp_dim=256, block_size=128, batch_size=16,
            steps=1000, lr=2e-3, warmup=50, min_lr=2e-4, report_every=50, eval_every=250, ckpt_every=500),
    _preset("base", "a longer GPU run; TrainConfig's own defaults",
            n_layers=4, dim=256, n_heads=4, mlp_dim=512, block_size=256, batch_size=16,
            steps=1000, lr=1e-3, warmup=50, min_lr=1e-4, report_every=10, eval_every=100, ckpt_every=200),
)})

# A fine-tune (--model) has no preset: mlx-lm's own defaults (mlx_lm.lora's CONFIG_DEFAULTS) take its place, which
# its users know. The optimizer's Nones are its own defaults (MLX's Adam: betas 0.9 and 0.999, no bias correction);
# no gradient clipping, a constant rate, as mlx-lm. A setting or a config file in mlx-lm's vocabulary gets these as
# they are (what mlx_lm.lora would do with it).
MLX_LM_DEFAULTS: Mapping[str, object] = MappingProxyType(dict(
    steps=1000, batch_size=4, lr=1e-5, lr_schedule="constant", warmup=0, min_lr=0.0, optimizer="adam", beta1=None,
    beta2=None, weight_decay=None, bias_correction=None, max_norm=0.0, eval_every=200, eval_batches=25,
    report_every=10, ckpt_every=100, mask_prompt="off"))
# Ours differ from them only where a measurement on the quality check showed better (benchmarks/
# bench_lora_quality.py, docs/finetune.md#settings): --mask-prompt on (training on the answers only) lowered the
# answers-only loss 3.82 -> 2.85 and kept more of what the base knew (plain-text loss 1.428 -> 1.406; base 1.391).
FINETUNE: Mapping[str, object] = MappingProxyType({**MLX_LM_DEFAULTS, "mask_prompt": "on"})

# The fields every preset sets (the same for all of them).
PRESET_FIELDS: tuple[str, ...] = tuple(PRESETS["tiny"].settings)

# MLX's default device type (mx.default_device().type.name) -> the preset used when none is given.
BY_DEVICE: Mapping[str, str] = MappingProxyType({"gpu": "small", "cpu": "tiny"})


def get(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: choose {', '.join(PRESETS)}")
    return PRESETS[name]


def for_device(kind: str) -> str:
    """The preset for a device type name ('gpu', 'cpu'); anything unknown is treated as a CPU."""
    return BY_DEVICE.get(kind, BY_DEVICE["cpu"])


def choose(flag: str | None, file: str | None, checkpoint: str | None, device: str) -> tuple[str, str]:
    """(preset name, how it was chosen) from the flag, the config file, a resumed checkpoint and the device.

    A checkpoint's settings already fix every value a preset would supply, so naming another preset when
    resuming is refused rather than silently ignored."""
    named = flag or file
    if named:
        get(named)
        if checkpoint and named != checkpoint:
            raise ConfigError(f"the checkpoint was trained with preset {checkpoint}, not {named}: its "
                              f"settings win over a preset, so change them with flags (e.g. --steps)")
        return named, "given"
    if checkpoint:
        return get(checkpoint).name, "from the checkpoint"
    return for_device(device), f"chosen for {device}"


def overridden(preset: Preset, values: Mapping[str, object]) -> list[str]:
    """The preset's fields whose value in `values` (a run's settings) is not the preset's."""
    return [k for k, v in preset.settings.items() if values.get(k) != v]


def describe(values: Mapping[str, object], how: str, parameters: int) -> str:
    """The line rank 0 prints at the start, e.g.
    `preset tiny (chosen for cpu): 2 layers, dim 64, 0.10M parameters, 400 steps`."""
    preset = get(values["preset"])
    changed = overridden(preset, values)
    note = f"; overridden: {', '.join('--' + k.replace('_', '-') for k in changed)}" if changed else ""
    return (f"preset {preset.name} ({how}{note}): {values['n_layers']} layers, dim {values['dim']}, "
            f"{parameters / 1e6:.2f}M parameters, {values['steps']} steps")


def help_text() -> str:
    """--preset's help: every preset's sizes and schedule, and the device rule."""
    def one(p: Preset) -> str:
        s = p.settings
        return (f"{p.name}: {s['n_layers']} layers, dim {s['dim']}, {s['n_heads']} heads, mlp {s['mlp_dim']}, "
                f"block {s['block_size']}, batch {s['batch_size']}, {s['steps']} steps at lr {s['lr']:g} "
                f"({p.purpose})")
    device_rule = ", ".join(f"{name} on a {kind.upper()}" for kind, name in BY_DEVICE.items())
    return ("Named size: the model and the steps, learning-rate schedule and report/eval/checkpoint cadence "
            "that suit it; flags, --config and a resumed checkpoint win over it. "
            + "; ".join(one(p) for p in PRESETS.values()) + f". (default: {device_rule})")
