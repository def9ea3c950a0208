"""Low-rank adapters on an mlx-lm model (`--adapter lora|dora` with `--model DIR`), made of mlx-lm's own layers
(mlx_lm.tuner: LoRALinear and DoRALinear wrap a Linear or a QuantizedLinear as it is), so the base stays what
mlx-lm loaded — quantized or not — and frozen; only the adapters have gradients and optimizer state.

    adapter_config = apply(model, config)      # freeze, wrap the chosen projections of the top blocks
    save(directory, model, adapter_config)     # mlx-lm's adapter layout: adapters.safetensors, adapter_config.json
    load(directory, model)                     # the adapters' weights back into a model apply() wrapped

What is written is what `mlx_lm.generate --model BASE --adapter-path DIR` and `mlx_lm.fuse` read: the adapters'
weights under mlx-lm's names (`model.layers.N.self_attn.q_proj.lora_a`, ...) and a config holding
fine_tune_type, num_layers and lora_parameters (rank, scale, dropout, keys). Every checkpoint of an adapter run
is such a directory, and so is <run>/adapters at its end.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..atomic import replace_dir, write_text
from ..trainer_contract import ADAPTER_BASE_KEYS, ADAPTER_CONFIG, ADAPTER_FILE
from ..errors import ConfigError
from .adaptercount import blocks_adapted, lora_parameters


def adapter_config(config, num_layers: int) -> dict:
    """adapter_config.json as mlx-lm writes it (the keys its load_adapters and fuse read), for `num_layers` blocks."""
    return {"fine_tune_type": config.adapter, "num_layers": num_layers, "lora_parameters": lora_parameters(config),
            "model": config.model}


def described(config, model) -> dict:
    """The adapter_config.json of the adapters apply() put on `model` with `config`, with what the base is
    ("base": its config.json's model_type and shape; mlx-lm ignores the key), which `serve --adapter` compares
    with the model it is given."""
    args = getattr(model, "args", None)
    base = {k: getattr(args, k, None) for k in ADAPTER_BASE_KEYS}
    return {**adapter_config(config, blocks_adapted(config, len(model.layers))),
            "base": {k: v for k, v in base.items() if v is not None}}


def apply(model, config) -> dict:
    """Freeze `model` and wrap the projections --lora-keys names (default: every linear layer, as mlx-lm does) of
    its top --lora-layers blocks (-1: all) in LoRA or DoRA layers, seeded by the caller (every rank the same).
    Returns the adapter_config.json to write with the weights. One line (ConfigError) for a count of blocks the
    model lacks or a key no block has."""
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    num_layers = blocks_adapted(config, len(model.layers))
    params = lora_parameters(config)
    if "keys" in params:
        present = {name for name, _ in model.layers[-1].named_modules()}
        missing = [k for k in params["keys"] if k not in present]
        if missing:
            linears = sorted(name for name, m in model.layers[-1].named_modules()
                             if type(m).__name__ in ("Linear", "QuantizedLinear"))
            raise ConfigError(f"--lora-keys: the model's blocks have no {', '.join(missing)}; their linear layers are "
                              f"{', '.join(linears)}")
    model.freeze()
    try:
        linear_to_lora_layers(model, num_layers, params, use_dora=config.adapter == "dora")
    except ValueError as e:           # a layer mlx-lm cannot wrap (DoRA on a mixture of experts)
        raise ConfigError(f"--adapter {config.adapter}: {e}") from None
    if not tree_flatten(model.trainable_parameters()):
        raise ConfigError(f"--adapter {config.adapter}: nothing in the top {num_layers} blocks to adapt")
    return adapter_config(config, num_layers)


def trainable(model) -> dict:
    from mlx.utils import tree_flatten
    return dict(tree_flatten(model.trainable_parameters()))


def count_trainable(model) -> int:
    return sum(v.size for v in trainable(model).values())


def publish(out_dir: str, also: str | None = None) -> Path:
    """The run's newest checkpoint's adapters as <out_dir>/adapters (mlx-lm's layout, what `run` brings home), and
    into `also` (--adapter-path) when given, each replacing an earlier one whole: written beside it, then renamed
    into place. Returns where they are (`also` when given)."""
    import shutil

    from .stepdirs import resolve

    ckpt = resolve("latest", out_dir)
    if not (ckpt / ADAPTER_FILE).is_file():
        raise ConfigError(f"{ckpt} holds no adapters ({ADAPTER_FILE}): not a checkpoint of an --adapter run")
    places = [Path(out_dir) / "adapters"] + ([Path(also)] if also else [])
    for final in places:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name in (ADAPTER_FILE, ADAPTER_CONFIG):
            shutil.copyfile(ckpt / name, tmp / name)
        if final.exists() and not (final / ADAPTER_CONFIG).is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            raise ConfigError(f"--adapter-path {final} exists and holds no {ADAPTER_CONFIG}: not adapters this "
                              "could replace; give a new directory")
        replace_dir(str(tmp), str(final))
    return places[-1]


def save(directory, model, config: dict) -> None:
    """The adapters' weights and their config into `directory` (which exists), mlx-lm's layout."""
    import mlx.core as mx

    directory = Path(directory)
    mx.save_safetensors(str(directory / ADAPTER_FILE), trainable(model), metadata={"format": "mlx"})
    write_text(str(directory / ADAPTER_CONFIG), json.dumps(config, indent=1) + "\n")


def load(directory, model) -> None:
    """The adapters' weights from `directory` into a model apply() wrapped the same way."""
    model.load_weights(str(Path(directory) / ADAPTER_FILE), strict=False)
