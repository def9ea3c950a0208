"""How big an adapter run's adapters are, from the trainer's flags and a model's config.json alone: how many blocks
get adapters, mlx-lm's `lora_parameters`, how many parameters they add. Pure (no MLX import): the memory plan
(memory.py) runs on the controller before anything is loaded; adapters.py puts the adapters on a model.
"""
from __future__ import annotations

from ..errors import ConfigError


def lora_parameters(config) -> dict:
    """mlx-lm's `lora_parameters` for the trainer's flags."""
    params = {"rank": config.lora_rank, "scale": config.lora_scale, "dropout": config.lora_dropout}
    if config.lora_keys:
        params["keys"] = [k.strip() for k in config.lora_keys.split(",") if k.strip()]
    return params


DEFAULT_LAYERS = 16      # mlx-lm's --num-layers default


def blocks_adapted(config, blocks: int) -> int:
    """How many of the model's `blocks` get adapters: --lora-layers (-1: all), by default 16 or all of fewer."""
    wanted = config.lora_layers
    if wanted is None:
        return min(DEFAULT_LAYERS, blocks)
    if wanted > blocks:
        raise ConfigError(f"--lora-layers {wanted}: the model has {blocks} blocks (-1 adapts them all)")
    return blocks if wanted == -1 else wanted


def count(shape_config: dict, num_layers: int, rank: int, keys: list[str] | None) -> int:
    """How many adapter parameters LoRA adds to an mlx-lm llama-like model (config.json's shape): rank x (in + out)
    for each adapted projection of the top `num_layers` blocks (pure: for the memory plan)."""
    m = {**shape_config.get("text_config", {}), **shape_config}
    dim, heads = int(m["hidden_size"]), int(m["num_attention_heads"])
    head_dim = int(m.get("head_dim") or dim // heads)
    kv = int(m.get("num_key_value_heads") or heads) * head_dim
    q, mlp = heads * head_dim, int(m["intermediate_size"])
    shapes = {"self_attn.q_proj": (dim, q), "self_attn.k_proj": (dim, kv), "self_attn.v_proj": (dim, kv),
              "self_attn.o_proj": (q, dim), "mlp.gate_proj": (dim, mlp), "mlp.up_proj": (dim, mlp),
              "mlp.down_proj": (mlp, dim)}
    chosen = keys or list(shapes)
    per_block = sum(rank * sum(shapes[k]) for k in chosen if k in shapes)
    blocks = int(m["num_hidden_layers"])
    return per_block * (blocks if num_layers == -1 else min(num_layers, blocks))
