"""A small Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU MLP, tied input/output embedding.

`Transformer(args)(tokens)` returns logits; with a `cache` (a list of KVCache, one per layer) it attends
over the cached keys and values too, which is what generation uses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    n_layers: int = 4
    dim: int = 256
    n_heads: int = 4
    mlp_dim: int = 512
    block_size: int = 256
    rope_theta: float = 10000.0
    dropout: float = 0.0
    norm_eps: float = 1e-5

    @classmethod
    def from_config(cls, config, vocab_size: int) -> "ModelArgs":
        return cls(vocab_size=vocab_size, n_layers=config.n_layers, dim=config.dim, n_heads=config.n_heads,
                   mlp_dim=config.mlp_dim, block_size=config.block_size, rope_theta=config.rope_theta,
                   dropout=config.dropout)


class KVCache:
    """Keys and values seen so far, (B, heads, T, head_dim); `offset` is the next position for RoPE."""

    def __init__(self):
        self.keys = self.values = None
        self.offset = 0

    def update(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is not None:
            keys = mx.concatenate([self.keys, keys], axis=2)
            values = mx.concatenate([self.values, values], axis=2)
        self.keys, self.values = keys, values
        self.offset = keys.shape[2]
        return keys, values


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)
        self.rope = nn.RoPE(self.head_dim, traditional=False, base=args.rope_theta)

    def __call__(self, x: mx.array, cache: KVCache | None = None) -> mx.array:
        B, L, D = x.shape

        def heads(t):
            return t.reshape(B, L, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        offset = cache.offset if cache is not None else 0
        q, k = self.rope(q, offset=offset), self.rope(k, offset=offset)
        if cache is not None:
            k, v = cache.update(k, v)
        # A single new token attends to everything cached; a prompt (L > 1) needs the causal mask.
        mask = "causal" if L > 1 else None
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(B, L, D))


class SwiGLU(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate = nn.Linear(args.dim, args.mlp_dim, bias=False)
        self.up = nn.Linear(args.dim, args.mlp_dim, bias=False)
        self.down = nn.Linear(args.mlp_dim, args.dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down(nn.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.mlp_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.mlp = SwiGLU(args)
        self.dropout = nn.Dropout(args.dropout)

    def __call__(self, x: mx.array, cache: KVCache | None = None) -> mx.array:
        x = x + self.dropout(self.attention(self.attention_norm(x), cache))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embedding = nn.Embedding(args.vocab_size, args.dim)
        self.layers = [Block(args) for _ in range(args.n_layers)]
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self._init_weights()

    def _init_weights(self):
        # GPT-2 style: N(0, 0.02) everywhere, output projections scaled down by depth so the residual
        # stream does not grow with the number of layers. Uses the global MLX random state (seeded).
        std = 0.02
        out_std = std / math.sqrt(2 * self.args.n_layers)
        self.embedding.weight = mx.random.normal(self.embedding.weight.shape) * std
        for layer in self.layers:
            for linear in (layer.attention.wq, layer.attention.wk, layer.attention.wv, layer.mlp.gate,
                           layer.mlp.up):
                linear.weight = mx.random.normal(linear.weight.shape) * std
            for linear in (layer.attention.wo, layer.mlp.down):
                linear.weight = mx.random.normal(linear.weight.shape) * out_std

    def __call__(self, tokens: mx.array, cache: list[KVCache] | None = None) -> mx.array:
        x = self.embedding(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, cache[i] if cache is not None else None)
        return self.embedding.as_linear(self.norm(x))   # tied: the output matrix is the embedding

    def new_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]


def loss_fn(model, x: mx.array, y: mx.array, segments: mx.array | None = None,
            picks: mx.array | None = None) -> mx.array:
    """Mean next-token cross-entropy over the trained targets (fine-tuning labels a prompt's targets -1:
    data/records.py; the bundled corpus trains on every position). Any model whose call returns logits;
    `segments`: packed records, each attending only to itself (packing.py); `picks`: the flat indices of the
    trained positions (-1: none), so the head computes logits there alone (packing.hidden and output_layer, for a
    model packing.splits_exactly has checked) - the same loss, without the head's work at prompts and padding."""
    if segments is None:
        return masked_cross_entropy(model(x), y)
    from .packing import forward, hidden, output_layer
    if picks is None:
        return masked_cross_entropy(forward(model, x, segments), y)
    h, y = at_picks(hidden(model, x, segments), y, picks)
    return masked_cross_entropy(output_layer(model)(h), y)


def at_picks(h: mx.array, y: mx.array, picks: mx.array) -> tuple[mx.array, mx.array]:
    """The hidden states (rows, width, dim) and targets (rows, width) at the flat positions `picks` (-1: padding of
    the list, its target then -1): what the head and the loss need where only those positions are trained."""
    at = mx.maximum(picks, 0)
    return h.reshape(-1, h.shape[-1])[at], mx.where(picks >= 0, y.reshape(-1)[at], -1)


def masked_cross_entropy(logits: mx.array, y: mx.array) -> mx.array:
    """Cross-entropy in float32 (bfloat16 logits lose the loss's precision), averaged over targets >= 0."""
    trained = y >= 0
    ce = nn.losses.cross_entropy(logits.astype(mx.float32), mx.maximum(y, 0)) * trained
    return ce.sum() / mx.maximum(trained.sum(), 1).astype(mx.float32)


def count_parameters(model: nn.Module) -> int:
    from mlx.utils import tree_flatten
    return sum(v.size for _, v in tree_flatten(model.parameters()))
