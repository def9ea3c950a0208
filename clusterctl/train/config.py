"""The trainer's configuration: one frozen dataclass whose field help becomes the argparse flags.

Precedence, highest first: command-line flags > `--config FILE.yaml` (`-c`) > the checkpoint's config (when
resuming) > the preset (`--preset`, else chosen by MLX's default device: presets.py) > the defaults below. A
fine-tune (--model) has no preset: mlx-lm's defaults take its place (presets.FINETUNE), and rank 0 prints every
setting with where it came from (`settings_block`). Flags and config files also take mlx-lm's names
(vocabulary.py: `--iters`, `--learning-rate`, `lora_parameters`, ...).
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
from .vocabulary import UNSUPPORTED, speaks_mlx_lm, translate

# Options that describe this invocation rather than the training run; never taken from a checkpoint.
RUN_OPTIONS = ("out", "resume", "config", "train", "test", "adapter_path", "resume_adapter_file")
OPTIMIZERS = ("adam", "adamw", "muon", "sgd", "adafactor")
SCHEDULES = ("cosine", "constant")
MAX_WHOLE = 2**31 - 1       # every whole-number setting: steps, sizes and the seed are 32-bit integers in MLX
MAX_LORA_RANK = 65536        # beyond any projection's width: a rank is at most min(in, out) to be of use


def _opt(default, help: str, **extra):
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class TrainConfig:
    preset: str | None = _opt(None, presets.help_text(), metavar="|".join(presets.PRESETS))
    # model
    model: str | None = _opt(None, "Fine-tune this mlx-lm model: a directory (config.json, safetensors, tokenizer; "
                                   "needs mlx-lm), or through `clusterctl run` a Hugging Face id (ORG/NAME, resolved "
                                   "in the hub's cache on the controller: docs/models.md) instead of training the bundled "
                                   "model from scratch; --data names "
                                   "a directory of train.jsonl / valid.jsonl records (docs/finetune.md). The model "
                                   "flags below are then the model's own.", metavar="DIR|ORG/NAME")
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
                                  "(as mlx-lm's --mask-prompt), off on every token.", choices=("on", "off"),
                            switch=True)
    group_by_length: str = _opt("off", "With --model: on draws batches of records near in length (each 256 records "
                                       "of an epoch's order sorted by length, as mlx-lm sorts its batches): fewer "
                                       "padded positions, a faster step; off: batches at random, a better model at "
                                       "the same steps (docs/finetune.md#batches).", choices=("on", "off"),
                                switch=True)
    max_seq_length: int = _opt(2048, "With --model: a record longer than this many tokens is cut to it (mlx-lm's "
                                     "--max-seq-length).", metavar="N")
    resume_adapter_file: str | None = _opt(None, "With --adapter: start the adapters from these weights (an "
                                                 "adapters.safetensors; mlx-lm's --resume-adapter-file).",
                                           metavar="FILE")
    adapter_path: str | None = _opt(None, "With --adapter: also write the final adapters into this directory "
                                          "(mlx-lm's --adapter-path; they are always in <run>/adapters).",
                                    metavar="DIR")
    trust_remote_code: str = _opt("off", "With --model: let the tokenizer run code the model directory ships "
                                         "(mlx-lm's --trust-remote-code).", choices=("on", "off"), switch=True)
    n_layers: int = _opt(4, "Transformer blocks.")
    dim: int = _opt(256, "Model (embedding) width.")
    n_heads: int = _opt(4, "Attention heads; must divide --dim.")
    mlp_dim: int = _opt(512, "Hidden width of the SwiGLU MLP.")
    block_size: int = _opt(256, "Context length in tokens (the length of every training sequence).")
    rope_theta: float = _opt(10000.0, "RoPE base frequency.")
    dropout: float = _opt(0.0, "Dropout on attention and MLP outputs (uses the saved random state).")
    # optimisation
    steps: int = _opt(1000, "Optimizer steps to train for (every rank runs exactly this many).")
    batch_size: int = _opt(16, "The bundled model: sequences per micro-batch PER RANK (global batch = this x accum "
                               "x world). With --model: records per micro-batch, GLOBAL (mlx-lm's --batch-size), "
                               "split evenly over the ranks.")
    accum: int = _opt(1, "Micro-batches whose gradients are summed into one optimizer step.")
    optimizer: str = _opt("adamw", "adam, adamw, muon, sgd or adafactor: MLX's optimizers, made as mlx-lm makes "
                                   "them (their own defaults, then --optimizer-config, then --beta1/--beta2/"
                                   "--weight-decay/--bias-correction).", choices=OPTIMIZERS)
    optimizer_config: dict | None = _opt(None, "More arguments of the optimizer, as mlx-lm's optimizer_config: "
                                               "a YAML mapping of optimizer name to its arguments, e.g. "
                                               "'{adamw: {weight_decay: 0.05}}'.", metavar="YAML")
    lr: float = _opt(1e-3, "Peak learning rate.")
    lr_schedule: object = _opt("cosine", "cosine (linear warm-up over --warmup steps, then cosine decay to "
                                         "--min-lr), constant (--lr after the warm-up), or mlx-lm's lr_schedule "
                                         "mapping: '{name: cosine_decay, warmup: 100, arguments: [1e-5, 1000]}' "
                                         "(an mlx.optimizers schedule and its arguments).",
                               metavar="cosine|constant|YAML")
    warmup: int = _opt(50, "Linear warm-up steps from 0 to --lr.")
    min_lr: float = _opt(1e-4, "Learning rate at the end of the cosine decay.")
    weight_decay: float | None = _opt(0.1, "Decoupled weight decay (adamw, sgd); none: the optimizer's own.")
    beta1: float | None = _opt(0.9, "Adam's and AdamW's beta1; none: the optimizer's own.")
    beta2: float | None = _opt(0.95, "Adam's and AdamW's beta2; none: the optimizer's own.")
    bias_correction: str | None = _opt("on", "Adam's and AdamW's bias correction; none: the optimizer's own (off in "
                                             "MLX, so early steps are larger than --lr says, as in mlx-lm).",
                                       choices=("on", "off"))
    max_norm: float = _opt(1.0, "Clip the global gradient norm to this (0 turns clipping off).")
    grad_checkpoint: str = _opt("off", "on: keep only each block's input for the backward pass and compute the block "
                                       "again there (less memory, about a third more compute; mlx-lm's "
                                       "--grad-checkpoint).", choices=("on", "off"), switch=True)
    clear_cache_threshold: int = _opt(0, "Free MLX's buffer cache after a step when it holds more than this many "
                                         "bytes (0: never; mlx-lm's --clear-cache-threshold).", metavar="BYTES")
    balance: str = _opt("auto", "Shares of the global batch: auto (in proportion to each rank's measured speed, "
                                "even while every rank's speed is within 10%% of the ranks' mean), off (even), or fixed "
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
    eval_batches: int = _opt(4, "Batches for each held-out loss: the bundled model's, per rank; with --model, "
                                "global batches of --batch-size records (-1: every held-out record; mlx-lm's "
                                "--val-batches).", metavar="N")
    train: str | None = _opt(None, "With --model: on trains (the default, unless --test is given alone: then the "
                                   "adapters of --adapter-path or --resume-adapter-file are only scored, as mlx-lm "
                                   "does).", choices=("on", "off"), switch=True)
    test: str = _opt("auto", "With --model: score the test set (test.jsonl beside train.jsonl) at the end: auto "
                             "(when there is one), on (it must be there), off.", choices=("auto", "on", "off"),
                     switch=True)
    test_batches: int = _opt(500, "With --model: global batches of the test set scored (-1: all; mlx-lm's "
                                  "--test-batches).", metavar="N")
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
    config: str | None = _opt(None, "A YAML file of these settings, by these names or mlx-lm's (mlx_lm.lora's "
                                    "lora_config.yaml works as it is; flags still win).", metavar="FILE")

    def __post_init__(self):
        for name in ("n_layers", "dim", "n_heads", "mlp_dim", "block_size", "steps", "batch_size", "accum",
                     "report_every", "max_seq_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{flag(name)} must be at least 1, not {getattr(self, name)}")
        for name in ("eval_batches", "test_batches"):
            if getattr(self, name) < 1 and getattr(self, name) != -1:
                raise ConfigError(f"--{flag(name)} must be at least 1, or -1 for all, not {getattr(self, name)}")
        if self.eval_batches == -1 and not self.model:
            raise ConfigError("--eval-batches -1 (every held-out record) is for fine-tunes (--model); the bundled "
                              "model's held-out loss reads a number of batches")
        for name in ("block_size", "max_seq_length"):
            if getattr(self, name) > MAX_BLOCK_SIZE:
                raise ConfigError(f"--{flag(name)} must be at most {MAX_BLOCK_SIZE}, not {getattr(self, name)}")
        for name in ("warmup", "eval_every", "ckpt_every", "keep", "check_sync", "clear_cache_threshold"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag(name)} must not be negative")
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ConfigError(f"--dim {self.dim} must split into --n-heads {self.n_heads} heads of even size")
        for f in fields(self):          # a --config file or a checkpoint is not checked by argparse
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices and not (
                    getattr(self, f.name) is None and "None" in str(f.type)):
                raise ConfigError(f"--{flag(f.name)} must be one of {', '.join(choices)}, not {getattr(self, f.name)!r}")
        if not 0 <= self.dropout < 1:
            raise ConfigError("--dropout must be in [0, 1)")
        if self.lr <= 0 or self.min_lr < 0 or (self.lr_schedule == "cosine" and self.min_lr > self.lr):
            raise ConfigError("need 0 <= --min-lr <= --lr and --lr > 0")
        if self.max_norm < 0:
            raise ConfigError("--max-norm must not be negative")
        check_schedule(self.lr_schedule)
        check_optimizer(self)
        if self.model and self.preset is not None:
            raise ConfigError(f"--preset {self.preset} sizes the bundled model; a fine-tune (--model) takes mlx-lm's "
                              "defaults instead (docs/finetune.md#settings): drop --preset")
        if not self.ckpt_minutes >= 0:
            raise ConfigError("--ckpt-minutes must not be negative")
        from .rowshares import parse_balance
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
                              "directory, quantized or not, or under clusterctl run a Hugging Face id; "
                              "docs/finetune.md#lora-and-dora)")
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
        # argparse takes any whole number and "inf"; MLX counts in 32 bits (after the settings' own bounds: they say more)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_WHOLE:
                raise ConfigError(f"--{flag(f.name)} must be at most {MAX_WHOLE}, not {_short(value)}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{flag(f.name)} must be a finite number, not {value}")
        if self.seed < 0:
            raise ConfigError(f"--seed must be from 0 to {MAX_WHOLE}, not {self.seed}")

    def training_dict(self) -> dict:
        """The settings that define the run (saved in checkpoints), without the per-invocation options."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in RUN_OPTIONS}


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 20 else f"{text[:12]}... ({len(text)} digits)"


def flag(name: str) -> str:
    return name.replace("_", "-")


def check_schedule(value) -> None:
    """--lr-schedule: cosine, constant, or mlx-lm's mapping (name, arguments, warmup, warmup_init)."""
    if isinstance(value, str):
        if value not in SCHEDULES:
            raise ConfigError(f"--lr-schedule must be cosine, constant or a mapping such as '{{name: cosine_decay, "
                              f"arguments: [1e-5, 1000]}}', not {value!r}")
        return
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(
            value.get("arguments"), list) or not value["arguments"]:
        raise ConfigError("--lr-schedule as a mapping needs name (an mlx.optimizers schedule, e.g. cosine_decay) and "
                          f"arguments (a list, the first being the initial rate), as mlx-lm's lr_schedule; got {value!r}")
    extra = set(value) - {"name", "arguments", "warmup", "warmup_init"}
    if extra:
        raise ConfigError(f"--lr-schedule: {', '.join(sorted(extra))} is not one of name, arguments, warmup, "
                          "warmup_init")


def check_optimizer(config: "TrainConfig") -> None:
    """The optimizer's settings: optimizer_config maps names to argument mappings (mlx-lm's shape)."""
    oc = config.optimizer_config
    if oc is not None:
        if not isinstance(oc, dict) or any(k not in OPTIMIZERS or not isinstance(v, (dict, type(None)))
                                           for k, v in oc.items()):
            raise ConfigError(f"--optimizer-config must map optimizer names ({', '.join(OPTIMIZERS)}) to mappings of "
                              f"their arguments, as mlx-lm's optimizer_config; got {oc!r}")
    if config.weight_decay is not None and config.optimizer == "adam":
        raise ConfigError(f"--weight-decay {config.weight_decay:g}: MLX's Adam has no weight decay; use --optimizer "
                          "adamw (decoupled weight decay), or give --weight-decay none")


def _none_or(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "null") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def yaml_load(stream):
    """YAML as mlx-lm reads its config files: PyYAML follows YAML 1.1, where `1e-5` (no dot) is a string, so
    exponents without a dot are taken as floats too (what a learning rate is written as)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                 list("-+0123456789"))
    return yaml.load(stream, Loader=Loader)  # noqa: S506 - a SafeLoader, with one more float spelling


def _yaml_value(text: str):
    """A flag's YAML text (a mapping for --optimizer-config or --lr-schedule), or the word as it is."""
    if not text.lstrip().startswith("{"):
        return text
    import yaml
    try:
        return yaml_load(text)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"not a YAML mapping ({str(e).splitlines()[0]})") from None


# mlx-lm's flag names (vocabulary.py), each beside ours: a name that counts iterations keeps its own
# destination, converted to optimizer steps when the settings are merged
ALIASES = {"lr": ["--learning-rate"], "lora_layers": ["--num-layers"],
           "accum": ["--grad-accumulation-steps"], "eval_batches": ["--val-batches"], "config": ["-c"]}
# the flags only mlx-lm's vocabulary has: a command line using one gets mlx-lm's defaults for what it leaves out
MLX_LM_FLAGS = ("--iters", "--learning-rate", "--num-layers", "--grad-accumulation-steps", "--val-batches",
                "--steps-per-report", "--steps-per-eval", "--save-every", "--fine-tune-type")
ITERATION_FLAGS = {"iters": "steps", "steps_per_report": "report_every", "steps_per_eval": "eval_every",
                   "save_every": "ckpt_every"}


def build_parser() -> argparse.ArgumentParser:
    """One flag per field (and mlx-lm's names for them). Defaults are SUPPRESSed so we can tell a flag given from
    one left out."""
    parser = argparse.ArgumentParser(
        prog="python -m clusterctl.train", argument_default=argparse.SUPPRESS,
        description="Train a small Llama-style language model with MLX, on one or many ranks, or fine-tune an mlx-lm "
                    "model (--model).",
        epilog="Precedence: flags > --config > a resumed checkpoint's settings > the preset (a fine-tune: mlx-lm's "
               "defaults) > the defaults shown. mlx-lm's flag names are taken too (--iters, --learning-rate, "
               "--num-layers, --fine-tune-type, ...: docs/from-mlx-lm.md). Launch on 2 ranks: mlx.launch -n 2 "
               "--backend ring -- python -m clusterctl.train ... | mpirun -np 2 python -m clusterctl.train ... | "
               "clusterctl run (see docs/trainer.md).")
    for f in fields(TrainConfig):
        kind = _base_type(f.type)
        metavar = f.metadata.get("metavar") or {int: "N", float: "X"}.get(kind)
        names = [f"--{flag(f.name)}"] + ALIASES.get(f.name, [])
        extra = {}
        if f.metadata.get("switch"):           # mlx-lm's bare --mask-prompt, --grad-checkpoint, --train, --test
            extra = {"nargs": "?", "const": "on"}
        convert = {float: _none_or(float), int: int}.get(kind, _yaml_value if kind is dict or f.type == "object"
                                                         else str)
        if kind is float and "None" not in str(f.type):
            convert = float
        parser.add_argument(*names, dest=f.name, type=convert, choices=f.metadata.get("choices"), metavar=metavar,
                            help=f.metadata["help"] + _default_help(f.name, f.default), **extra)
    for name, ours in ITERATION_FLAGS.items():
        parser.add_argument(f"--{flag(name)}", dest=name, type=int, metavar="N",
                            help=f"mlx-lm's name: --{flag(ours)} counted in iterations (micro-batches), divided by "
                                 "--accum")
    parser.add_argument("--fine-tune-type", dest="fine_tune_type", choices=("lora", "dora", "full"),
                        help="mlx-lm's name: lora or dora (--adapter), full (every weight: no --adapter)")
    for name in ("report_to", "project_name"):
        parser.add_argument(f"--{flag(name)}", dest=name, metavar="NAME",
                            help="mlx-lm's; refused: " + UNSUPPORTED[name])
    return parser


def _default_help(name: str, default) -> str:
    if name == "preset":
        return ""                                 # its help states the device rule itself
    fine = presets.FINETUNE.get(name, default)
    with_model = f"; with --model: {'none' if fine is None else fine}" if fine != default else ""
    if name in presets.PRESET_FIELDS:
        return " (default: the preset's: " + ", ".join(f"{p.name} {p.settings[name]:g}"
                                                       for p in presets.PRESETS.values()) + with_model + ")"
    return f" (default: {'none' if default is None else default}{with_model})"


def _base_type(annotation) -> type:
    text = annotation if isinstance(annotation, str) else annotation.__name__
    return {"int": int, "float": float, "dict": dict}.get(text.split("|")[0].strip(), str)


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
        if known[name].type == "object":          # --lr-schedule: a word or a mapping
            out[name] = value
            continue
        if known[name].metadata.get("switch") and isinstance(value, bool):
            value = "on" if value else "off"
        if kind is dict and not isinstance(value, dict) or kind is str and not isinstance(value, str) or (
                kind is int and (isinstance(value, bool) or not isinstance(value, int))):
            raise ConfigError(f"{where}: {key} must be {kind.__name__}, not {value!r}")
        try:
            out[name] = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {key} must be {kind.__name__}, not {value!r}") from None
    return out


def load_yaml(path: str) -> tuple[dict, set[str], bool]:
    """A --config file's settings, by our names or mlx-lm's: (the mapping, the fields given in iterations, whether
    it uses mlx-lm's names)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            values = yaml_load(f) or {}
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    named = {str(k).replace("-", "_"): v for k, v in values.items()}
    ours, counted = translate(named, path)
    return from_mapping(ours, path), counted, speaks_mlx_lm(named)


def file_settings(path: str) -> dict:
    """A settings file's values by the trainer's names (mlx-lm's translated): what `clusterctl run` reads of a -c FILE
    on the controller (the model to push, the data to copy). One line (ConfigError) for a file the trainer would
    refuse."""
    return load_yaml(path)[0]


@dataclass(frozen=True)
class Resolved:
    config: "TrainConfig"
    how: str                       # how the preset was chosen ("given", "chosen for cpu", ...; a fine-tune's: "")
    sources: dict                  # field -> where its value came from: "flag", "config FILE", "checkpoint", ...


def resolve_settings(argv: list[str] | None, checkpoint_config: dict | None = None,
                     device: str = "cpu") -> Resolved:
    """The settings and where each came from: flags > --config file > checkpoint config > the preset (given, the
    checkpoint's, else the one for `device`, MLX's default device type: 'gpu' or 'cpu'; a fine-tune: mlx-lm's
    defaults, presets.FINETUNE) > TrainConfig's defaults. mlx-lm's names are translated (vocabulary.py), and a
    value it counts in iterations is divided by the merged --accum."""
    given = vars(build_parser().parse_args(argv))
    for name in ("report_to", "project_name"):
        if given.get(name):
            raise ConfigError(f"--{flag(name)}: {UNSUPPORTED[name]} (docs/from-mlx-lm.md)")
    flags, flags_counted = translate(given, "the flags")
    file_name = given.get("config")
    flags["config"] = file_name
    from_file, file_counted, file_speaks = load_yaml(file_name) if file_name else ({}, set(), False)
    from_checkpoint = {k: v for k, v in from_mapping(checkpoint_config or {}, "checkpoint").items()
                       if k not in RUN_OPTIONS}
    model = next((layer["model"] for layer in (flags, from_file, from_checkpoint) if layer.get("model")), None)
    layers = [("default", {})]
    how = ""
    if model:
        for layer, where in ((flags, "--"), (from_file, f"{file_name}: ")):
            if layer.get("preset"):
                raise ConfigError(f"{where}preset {layer['preset']} sizes the bundled model; a fine-tune (--model) "
                                  "takes mlx-lm's defaults instead (docs/finetune.md#settings)")
            given_here = [k for k in BUNDLED_ONLY if layer.get(k) is not None and k != "balance"]
            if given_here:
                name = flag(given_here[0])
                why = ("packs whole records into rows, and --max-seq-length cuts a longer record"
                       if given_here[0] == "block_size" else "has the model's own shape and data")
                raise ConfigError(f"{where}{name} is the bundled model's: a fine-tune (--model) {why} "
                                  "(docs/finetune.md#settings)")
        if file_speaks or any(word.split("=", 1)[0] in MLX_LM_FLAGS for word in argv or []):
            layers.append(("mlx-lm's default (the settings use mlx-lm's names)", dict(presets.MLX_LM_DEFAULTS)))
        else:
            layers.append(("fine-tune default", dict(presets.FINETUNE)))
        preset = None
    else:
        preset, how = presets.choose(flags.get("preset"), from_file.get("preset"), from_checkpoint.get("preset"),
                                     device)
        layers.append((f"preset {preset}", dict(presets.get(preset).settings)))
    layers += [("checkpoint", from_checkpoint), (f"config {file_name}", from_file), ("flag", flags)]
    merged, sources = {}, {}
    for where, layer in layers:
        for k, v in layer.items():
            merged[k], sources[k] = v, where
    merged["preset"] = preset
    counted = {k for k in flags_counted if sources.get(k) == "flag"} | {
        k for k in file_counted if sources.get(k) == f"config {file_name}"}
    accum = int(merged.get("accum", 1) or 1)
    for k in counted:
        if merged[k] and accum > 1:
            merged[k] = max(merged[k] // accum, 1)
            sources[k] += f", {'iterations' if k == 'steps' else 'every N iterations'} / --accum {accum}"
    for k in ITERATION_FLAGS:
        merged.pop(k, None)
    return Resolved(TrainConfig(**merged), how, sources)


def resolve(argv: list[str] | None, checkpoint_config: dict | None = None,
            device: str = "cpu") -> tuple[TrainConfig, str]:
    """(config, how its preset was chosen): see resolve_settings."""
    r = resolve_settings(argv, checkpoint_config, device)
    return r.config, r.how


def parse_args(argv: list[str] | None, checkpoint_config: dict | None = None,
               device: str = "cpu") -> TrainConfig:
    """flags > --config file > checkpoint config > preset > defaults (see resolve)."""
    return resolve(argv, checkpoint_config, device)[0]


# what a fine-tune's settings block leaves out: the bundled model's own settings
BUNDLED_ONLY = ("preset", "n_layers", "dim", "n_heads", "mlp_dim", "block_size", "rope_theta", "source", "tokenizer",
                "balance")


def settings_block(config: TrainConfig, sources: dict) -> str:
    """Every setting of a fine-tune and where it came from, one per line, as rank 0 prints it at the start."""
    lines = ["settings (each: its value, and where it came from):"]
    for f in fields(TrainConfig):
        if f.name in BUNDLED_ONLY:
            continue
        value = getattr(config, f.name)
        shown = "none" if value is None else value if not isinstance(value, float) else f"{value:g}"
        lines.append(f"  {flag(f.name):<22} {shown}  ({sources.get(f.name, 'default')})")
    return "\n".join(lines)


def default_out_dir(when: time.struct_time) -> str:
    return os.path.join(RUNS_DIR, "train-" + time.strftime("%Y%m%d-%H%M%S", when))
