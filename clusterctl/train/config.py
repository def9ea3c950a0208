"""The trainer's configuration: one frozen dataclass whose field help becomes the argparse flags.

Precedence, highest first: command-line flags > `--config FILE.yaml` > the checkpoint's config (when
resuming) > the preset (`--preset`, else chosen by MLX's default device: presets.py) > the defaults below.
argparse, not click: the trainer runs under mpirun / mlx.launch with only the standard library, mlx and
yaml.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from dataclasses import dataclass, field, fields

from ..data.records import MAX_BLOCK_SIZE
from ..errors import ConfigError
from ..trainer_contract import DEFAULT_STRATEGY, RUNS_DIR
from . import presets, strategies

# Options that describe this invocation rather than the training run; never taken from a checkpoint.
RUN_OPTIONS = ("out", "resume", "config")
MAX_LORA_RANK = 65536        # beyond any projection's width: a rank is at most min(in, out) to be of use


def _opt(default, help: str, **extra):
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class TrainConfig:
    preset: str | None = _opt(None, presets.help_text(), metavar="|".join(presets.PRESETS))
    # model
    model: str | None = _opt(None, "Fine-tune this local mlx-lm model directory (config.json, safetensors, tokenizer; "
                                   "needs mlx-lm) instead of training the bundled model from scratch; --data names "
                                   "a directory of train.jsonl / valid.jsonl records (docs/finetune.md). The model "
                                   "flags below are then the model's own.", metavar="DIR")
    precision: str = _opt("float32", "float32: weights, gradients and AdamW state in float32; bfloat16: weights and "
                                     "gradients in bfloat16 (half the memory, and bfloat16 compute where the device has "
                                     "it), AdamW's moments in float32 and each update computed in float32, then rounded "
                                     "to the weight (docs/finetune.md#precision).", choices=("float32", "bfloat16"))
    adapter: str | None = _opt(None, "With --model: train low-rank adapters instead of every weight, lora or dora "
                                     "(mlx-lm's own layers): the base stays frozen, and may be quantized (4-bit, 8-bit, "
                                     "mxfp4, ...); the run writes mlx-lm's adapter layout, <run>/adapters "
                                     "(docs/finetune.md#lora-and-dora).", choices=("lora", "dora"), metavar="lora|dora")
    lora_rank: int = _opt(8, "--adapter: the adapters' rank (mlx-lm's lora_parameters.rank).")
    lora_scale: float = _opt(20.0, "--adapter: the scale of the adapters' output (mlx-lm's lora_parameters.scale).")
    lora_dropout: float = _opt(0.0, "--adapter: dropout on the adapters' input (mlx-lm's lora_parameters.dropout).")
    lora_layers: int | None = _opt(None, "--adapter: how many blocks, from the top, get adapters; -1: all (mlx-lm's "
                                         "--num-layers; default: 16, or all of a model with fewer).", metavar="N")
    lora_keys: str | None = _opt(None, "--adapter: which projections get adapters, comma-separated names inside a block "
                                       "(self_attn.q_proj,self_attn.v_proj); default: every linear layer of the block, "
                                       "as mlx-lm does.", metavar="NAMES")
    mask_prompt: str = _opt("on", "With --model: on trains only on the answers of chat and prompt/completion records "
                                  "(as mlx-lm's --mask-prompt), off on every token.", choices=("on", "off"))
    n_layers: int = _opt(4, "Transformer blocks.")
    dim: int = _opt(256, "Model (embedding) width.")
    n_heads: int = _opt(4, "Attention heads; must divide --dim.")
    mlp_dim: int = _opt(512, "Hidden width of the SwiGLU MLP.")
    block_size: int = _opt(256, "Context length in tokens (the length of every training sequence).")
    rope_theta: float = _opt(10000.0, "RoPE base frequency.")
    dropout: float = _opt(0.0, "Dropout on attention and MLP outputs (uses the saved random state).")
    # optimisation
    steps: int = _opt(1000, "Optimizer steps to train for (every rank runs exactly this many).")
    batch_size: int = _opt(16, "Sequences per micro-batch PER RANK (global batch = this x accum x world).")
    accum: int = _opt(1, "Micro-batches whose gradients are summed into one optimizer step.")
    lr: float = _opt(1e-3, "Peak learning rate (AdamW).")
    warmup: int = _opt(50, "Linear warm-up steps from 0 to --lr.")
    min_lr: float = _opt(1e-4, "Learning rate at the end of the cosine decay.")
    weight_decay: float = _opt(0.1, "AdamW decoupled weight decay.")
    beta1: float = _opt(0.9, "AdamW beta1.")
    beta2: float = _opt(0.95, "AdamW beta2.")
    max_norm: float = _opt(1.0, "Clip the global gradient norm to this (0 turns clipping off).")
    balance: str = _opt("auto", "Shares of the global batch: auto (in proportion to each rank's measured speed, "
                                "even while the ranks are within 20%% of each other), off (even), or fixed "
                                "weights W1,W2,... one per rank (see docs/trainer.md#balanced-data-parallelism).",
                        metavar="auto|off|W1,W2,...")
    check_sync: int = _opt(100, "Every N steps the ranks compare a digest of their parameters and stop, naming "
                                "the rank that differs, if a replica drifted (0: never).", metavar="N")
    strategy: str = _opt(DEFAULT_STRATEGY, strategies.help_text(), choices=strategies.names() + (strategies.AUTO,))
    zero3_gather: str = _opt("prefetch", "zero3: prefetch (gather the next unit's weights while this one computes), "
                                         "plain (no overlap, least memory) or keep (the forward pass's weights kept "
                                         "for the backward pass: no second gather, the full model in memory).",
                             choices=("prefetch", "plain", "keep"))
    memory_check: str = _opt("on", "on: refuse a run whose estimated memory per rank exceeds the smallest host's "
                                   "(naming a strategy that fits); off: only warn (docs/trainer.md#memory-planning).",
                             choices=("on", "off"))
    seed: int = _opt(0, "Seed for initialisation, data order and dropout; a run is a function of it.")
    # data
    data: str | None = _opt(None, "A directory from `clusterctl data prepare` (each rank reads only its "
                                  "shard); overrides --source. With --model: a directory of train.jsonl "
                                  "(and valid.jsonl) records.", metavar="DIR")
    source: str = _opt("embedded", "Without --data: 'embedded' (the built-in story corpus), a .txt/.jsonl "
                                   "file or a directory of them; each rank tokenizes only its share.")
    tokenizer: str | None = _opt(None, "Without --data: 'byte' (default) or a local tokenizer.json.",
                                 metavar="PATH")
    # evaluation, reporting, checkpoints
    eval_every: int = _opt(100, "Held-out loss every N steps (0: only at the end).", metavar="N")
    eval_batches: int = _opt(4, "Batches per rank for each held-out loss.", metavar="N")
    report_every: int = _opt(10, "Rank 0 prints and logs a metrics line every N steps.", metavar="N")
    ckpt_every: int = _opt(200, "Checkpoint every N steps (0: only at the end).", metavar="N")
    ckpt_minutes: float = _opt(10.0, "Also checkpoint once this many minutes have passed since the last checkpoint "
                                     "(every rank at the same step; 0: only by steps). Ctrl-C / SIGTERM always "
                                     "checkpoints before stopping.", metavar="M")
    keep: int = _opt(3, "Checkpoints to keep (0: keep all).", metavar="N")
    out: str | None = _opt(None, "Run directory for metrics.jsonl and checkpoints/ (default: "
                                 "$CLUSTERCTL_RUN_DIR, else ./runs/train-<timestamp>).", metavar="DIR")
    resume: str | None = _opt(None, "Continue from a checkpoint: 'latest' (in --out), a run directory "
                                    "or a checkpoints/step-N directory.", metavar="DIR|latest")
    config: str | None = _opt(None, "A YAML file of these settings (flags still win).", metavar="FILE")

    def __post_init__(self):
        for name in ("n_layers", "dim", "n_heads", "mlp_dim", "block_size", "steps", "batch_size", "accum",
                     "eval_batches", "report_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{flag(name)} must be at least 1, not {getattr(self, name)}")
        if self.block_size > MAX_BLOCK_SIZE:
            raise ConfigError(f"--block-size must be at most {MAX_BLOCK_SIZE}, not {self.block_size}")
        for name in ("warmup", "eval_every", "ckpt_every", "keep", "check_sync"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag(name)} must not be negative")
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ConfigError(f"--dim {self.dim} must split into --n-heads {self.n_heads} heads of even size")
        for f in fields(self):          # a --config file or a checkpoint is not checked by argparse
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices and not (f.default is None and getattr(self, f.name) is None):
                raise ConfigError(f"--{flag(f.name)} must be one of {', '.join(choices)}, not {getattr(self, f.name)!r}")
        if not 0 <= self.dropout < 1:
            raise ConfigError("--dropout must be in [0, 1)")
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError("need 0 <= --min-lr <= --lr and --lr > 0")
        if self.max_norm < 0:
            raise ConfigError("--max-norm must not be negative")
        if not self.ckpt_minutes >= 0:
            raise ConfigError("--ckpt-minutes must not be negative")
        from .balance import parse_balance
        parse_balance(self.balance)
        if self.strategy != strategies.AUTO:
            strategies.get(self.strategy)                  # a --config file's strategy is not argparse's choice
        if self.balance not in ("auto", "off") and (
                self.strategy == strategies.AUTO or not strategies.get(self.strategy).replicated):
            replicated = " or ".join(n for n in strategies.names() if strategies.get(n).replicated)
            raise ConfigError(f"--balance with fixed weights needs --strategy {replicated}, not {self.strategy}: "
                              "a strategy that shards the weights splits the batch evenly (docs/trainer.md#zero3)")
        if self.preset is not None:
            presets.get(self.preset)
        if self.adapter and not self.model:
            raise ConfigError(f"--adapter {self.adapter} adapts a model: give it with --model DIR (an mlx-lm model "
                              "directory, quantized or not; docs/finetune.md#lora-and-dora)")
        if not 1 <= self.lora_rank <= MAX_LORA_RANK:
            raise ConfigError(f"--lora-rank must be from 1 to {MAX_LORA_RANK}, not {str(self.lora_rank)[:20]}")
        if not math.isfinite(self.lora_scale):
            raise ConfigError("--lora-scale must be a finite number")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError("--lora-dropout must be in [0, 1)")
        if self.lora_layers is not None and (self.lora_layers == 0 or self.lora_layers < -1):
            raise ConfigError(f"--lora-layers must be -1 (every block) or at least 1, not {self.lora_layers}")
        if self.model and self.balance not in ("auto", "off"):
            raise ConfigError("--balance with fixed weights is not available with --model: fine-tuning splits each "
                              "step's rows evenly over the ranks (docs/finetune.md)")

    def training_dict(self) -> dict:
        """The settings that define the run (saved in checkpoints), without the per-invocation options."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in RUN_OPTIONS}


def flag(name: str) -> str:
    return name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """One flag per field. Defaults are SUPPRESSed so we can tell a flag given from one left out."""
    parser = argparse.ArgumentParser(
        prog="python -m clusterctl.train", argument_default=argparse.SUPPRESS,
        description="Train a small Llama-style language model with MLX, on one or many ranks.",
        epilog="Precedence: flags > --config > a resumed checkpoint's settings > the preset > the defaults "
               "shown. Launch on 2 ranks: mlx.launch -n 2 --backend ring -- python -m clusterctl.train ... | "
               "mpirun -np 2 python -m clusterctl.train ... | clusterctl run (see docs/trainer.md).")
    for f in fields(TrainConfig):
        kind = _base_type(f.type)
        metavar = f.metadata.get("metavar") or {int: "N", float: "X"}.get(kind)
        parser.add_argument(f"--{flag(f.name)}", dest=f.name, type=kind,
                            choices=f.metadata.get("choices"), metavar=metavar,
                            help=f.metadata["help"] + _default_help(f.name, f.default))
    return parser


def _default_help(name: str, default) -> str:
    if name == "preset":
        return ""                                 # its help states the device rule itself
    if name in presets.PRESET_FIELDS:
        return " (default: the preset's: " + ", ".join(f"{p.name} {p.settings[name]:g}"
                                                       for p in presets.PRESETS.values()) + ")"
    return f" (default: {default})"


def _base_type(annotation) -> type:
    text = annotation if isinstance(annotation, str) else annotation.__name__
    return {"int": int, "float": float}.get(text.split("|")[0].strip(), str)


def from_mapping(values: dict, where: str) -> dict:
    """Check a mapping's keys and value types against the fields; returns it with values converted."""
    known = {f.name: f for f in fields(TrainConfig)}
    out = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(f"{where}: unknown setting {key!r}")
        kind = _base_type(known[name].type)
        if value is None:
            out[name] = None
            continue
        if kind is str and not isinstance(value, str) or kind is int and (isinstance(value, bool) or
                                                                          not isinstance(value, int)):
            raise ConfigError(f"{where}: {key} must be {kind.__name__}, not {value!r}")
        try:
            out[name] = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {key} must be {kind.__name__}, not {value!r}") from None
    return out


def load_yaml(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.safe_load(f) or {}
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    return from_mapping(values, path)


def resolve(argv: list[str] | None, checkpoint_config: dict | None = None,
            device: str = "cpu") -> tuple[TrainConfig, str]:
    """(config, how its preset was chosen): flags > --config file > checkpoint config > the preset (given,
    the checkpoint's, else the one for `device`, MLX's default device type: 'gpu' or 'cpu') > defaults."""
    given = vars(build_parser().parse_args(argv))
    from_file = load_yaml(given["config"]) if given.get("config") else {}
    from_checkpoint = {k: v for k, v in from_mapping(checkpoint_config or {}, "checkpoint").items()
                       if k not in RUN_OPTIONS}
    name, how = presets.choose(given.get("preset"), from_file.get("preset"), from_checkpoint.get("preset"),
                               device)
    merged = {**presets.get(name).settings, **from_checkpoint, **from_file, **given, "preset": name}
    return TrainConfig(**merged), how


def parse_args(argv: list[str] | None, checkpoint_config: dict | None = None,
               device: str = "cpu") -> TrainConfig:
    """flags > --config file > checkpoint config > preset > defaults (see resolve)."""
    return resolve(argv, checkpoint_config, device)[0]


def default_out_dir(when: time.struct_time) -> str:
    return os.path.join(RUNS_DIR, "train-" + time.strftime("%Y%m%d-%H%M%S", when))
