"""A model the user already has: a local mlx-lm model directory (`--model DIR`), loaded with mlx-lm's own code.

    check_model_dir(path)        # config, weights, tokenizer, an architecture mlx-lm has: one line if not
    model, tokenizer, cfg = load(path)

mlx-lm is optional (`pip install mlx-lm`); nothing here imports it until a model is asked for, and
its absence is one line naming the install command. Nothing is ever downloaded: the directory must hold
`config.json`, `model*.safetensors` and the tokenizer's files (docs/finetune.md).

The weights are trained in float32 whatever dtype the directory stores (AdamW's updates on bfloat16 weights
lose most of their bits), and written back in the directory's own dtype by export.py.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shlex

from ..errors import ConfigError, MissingExtra

INSTALL = "pip install mlx-lm"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "tiktoken.model")
# What zero3 knows how to cut into units (zero3.lm_units): an embedding, blocks called (h, mask), a final norm,
# a tied or separate output matrix, nothing else in the forward pass
ZERO3_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def require_mlx_lm(what: str = "--model") -> None:
    if importlib.util.find_spec("mlx_lm") is None:
        raise MissingExtra(f"{what} needs mlx-lm, which is not installed in {_python()}: {INSTALL}")


def _python() -> str:
    import sys
    return sys.executable


def read_config(path: str) -> dict:
    """The model directory's config.json, or one line saying why it is not an mlx-lm model directory."""
    if not os.path.isdir(path):
        raise ConfigError(f"--model {path}: no such directory")
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ConfigError(f"--model {path}: not an mlx-lm model directory (no config.json); give the directory that "
                          "holds config.json, model.safetensors and the tokenizer")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{cfg_path}: not readable JSON ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ConfigError(f"{cfg_path}: no model_type: not an mlx-lm / Hugging Face model config")
    return config


def check_model_dir(path: str, adapter: str | None = None, scored_only: bool = False) -> dict:
    """Everything that can be told before loading: config, weights, tokenizer, and (with mlx-lm installed)
    that mlx-lm has the architecture. A quantized model is for adapters only (`adapter`: --adapter's value), or
    for scoring (`scored_only`: --test alone). Returns the config."""
    config = read_config(path)
    if not glob.glob(os.path.join(path, "model*.safetensors")):
        raise ConfigError(f"--model {path}: no model*.safetensors weights (mlx-lm reads only safetensors; convert "
                          "with mlx_lm.convert)")
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ConfigError(f"--model {path}: no tokenizer (tokenizer.json or tokenizer.model); copy the model's "
                          "tokenizer files into the directory")
    if quantization(config) and not adapter and not scored_only:
        # full fine-tuning updates every weight, which quantized weights cannot take; adapters leave them frozen
        copy = path.rstrip("/") + "-dequantized"
        raise ConfigError(f"--model {path}: the weights are quantized ({quantization(config)}), and full fine-tuning "
                          "updates every weight: train adapters on it with --adapter lora (or dora), which leave "
                          "the base frozen (docs/finetune.md#lora-and-dora); or fine-tune every weight of an "
                          f"unquantized copy made with `mlx_lm.convert --hf-path {shlex.quote(path)} --mlx-path "
                          f"{shlex.quote(copy)} -d`")
    require_mlx_lm()
    architecture(config, path)
    return config


def quantization(config: dict) -> str | None:
    """How the model directory's weights are quantized, in words ("4-bit affine, groups of 64"), or None."""
    q = config.get("quantization") or config.get("quantization_config")
    if not q:
        return None
    if not isinstance(q, dict):
        return "quantized"
    if q.get("quant_method") and "bits" not in q:
        return str(q["quant_method"])
    mode = q.get("mode", "affine")
    bits, group = q.get("bits"), q.get("group_size")
    return f"{bits}-bit {mode}" + (f", groups of {group}" if group else "")


def architecture(config: dict, path: str) -> str:
    """The mlx-lm module name for the config's model_type, or one line saying mlx-lm lacks it."""
    from mlx_lm import __version__
    from mlx_lm.utils import _get_classes

    try:
        model_class, _ = _get_classes(config)
    except ValueError:
        raise ConfigError(f"--model {path}: mlx-lm {__version__} has no architecture {config['model_type']!r} "
                          "(a newer mlx-lm may: pip install -U mlx-lm)") from None
    return model_class.__module__.rsplit(".", 1)[-1]


def load(path: str, dtype=None, adapter: str | None = None, tokenizer=None, scored_only: bool = False):
    """(model, tokenizer, config): mlx-lm's loader, the floating-point weights cast to `dtype` (float32 by default;
    --precision; a quantized model's packed weights stay as they are), lazily (zero3 slices a group at a time; dp
    evaluates them when it starts). `adapter`: --adapter's value (a quantized model is refused without it);
    `tokenizer`: one load_tokenizer already read; `scored_only`: nothing will be trained (--test alone)."""
    import mlx.core as mx
    from mlx_lm.utils import load_model
    from pathlib import Path

    from .step import cast_model

    check_model_dir(path, adapter, scored_only)
    try:
        model, config = load_model(Path(path), lazy=True)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--model {path}: mlx-lm cannot build this model: {str(e).splitlines()[0]}") from None
    cast_model(model, str(dtype or mx.float32).removeprefix("mlx.core."))
    return model, tokenizer or load_tokenizer(path), config


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """The model directory's tokenizer as mlx-lm loads it (its chat template, its end-of-sequence tokens)."""
    require_mlx_lm()
    from mlx_lm.utils import load_tokenizer as mlx_lm_tokenizer
    from pathlib import Path

    config = read_config(path)
    extra = {"trust_remote_code": True} if trust_remote_code else None
    return mlx_lm_tokenizer(Path(path), tokenizer_config_extra=extra, eos_token_ids=config.get("eos_token_id"))


def checkpoint_blocks(model) -> None:
    """--grad-checkpoint: each block keeps only its input for the backward pass and is computed again there
    (mx.checkpoint around the block's call, on its class, as mlx-lm's --grad-checkpoint does)."""
    import mlx.core as mx

    cls = type(model.layers[0])
    if getattr(cls, "_clusterctl_checkpointed", False):
        return
    call = cls.__call__

    def checkpointed(self, *args, **kwargs):
        def inner(params, *args, **kwargs):
            self.update(params)
            return call(self, *args, **kwargs)
        return mx.checkpoint(inner)(self.trainable_parameters(), *args, **kwargs)

    cls.__call__ = checkpointed
    cls._clusterctl_checkpointed = True


def total_parameters(model) -> int:
    """The model's parameter count, a quantized weight counted as the values it packs (mlx-lm's count)."""
    from mlx_lm.utils import get_total_parameters
    return get_total_parameters(model)


def weights_dtype(path: str) -> str:
    """The dtype the directory stores its floating-point weights in ('float32', 'bfloat16', 'float16'),
    read from the safetensors headers (no weights loaded)."""
    for file in sorted(glob.glob(os.path.join(path, "model*.safetensors"))):
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__" and entry.get("dtype") in ("F32", "BF16", "F16"):
                return {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[entry["dtype"]]
    return "float32"


def vocab_size(config: dict) -> int:
    value = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if not isinstance(value, int):
        raise ConfigError("the model's config.json has no vocab_size")
    return value


def zero3_units_known(model_type: str) -> bool:
    from mlx_lm.utils import MODEL_REMAPPING
    return MODEL_REMAPPING.get(model_type, model_type) in ZERO3_TYPES
