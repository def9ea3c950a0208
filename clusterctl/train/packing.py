"""Per-record attention in packed rows, for a model the user has (--model): several records share a row
(data/records.py packs them), and each attends only to itself.

    logits = forward(model, tokens, segments)      # segments: (B, L) record numbers within each row, -1 padding
    packs_exactly(model)                           # whether this model computes a record the same packed or alone
    output_layer(model)(hidden(model, tokens, segments))   # the same, in two halves (splits_exactly checks it)

The mask is block-diagonal and causal: position i sees position j when both belong to the same record and j <= i
(padding sees padding, so no softmax row is empty). It reaches the model the way a KV cache's mask does: mlx-lm's
models ask their cache for the attention mask (`create_attention_mask(h, cache)` calls `cache.make_mask`), so
each layer is given a cache that holds nothing, starts at position 0 and returns this mask. Positions are the
row's, not the record's: under rotary embeddings (every architecture mlx-lm trains: llama, qwen, mistral, gemma,
phi, ...) attention depends only on the distance between two positions, so a record computes the same wherever
it sits in its row. A model for which that does not hold (learned absolute positions, recurrent state carried
along the row, a cache it uses otherwise) is found by `packs_exactly`, one small forward pass before training,
and is then given one record per row (docs/finetune.md#packed-rows).
"""
from __future__ import annotations

import mlx.core as mx


def block_mask(segments: mx.array, window: int | None = None) -> mx.array:
    """(B, 1, L, L) booleans: i attends to j when they share a segment and j <= i (and i - j < window)."""
    L = segments.shape[-1]
    pos = mx.arange(L)
    causal = pos[:, None] >= pos[None, :]
    if window:
        causal = causal & (pos[:, None] - pos[None, :] < window)
    same = segments[:, :, None] == segments[:, None, :]
    return (same & causal)[:, None]


class SegmentCache:
    """A stand-in for one layer's KV cache: nothing kept, position 0, and the per-record mask as its mask."""

    offset = 0

    def __init__(self, segments: mx.array):
        self.segments = segments
        self._masks: dict = {}

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        if window_size not in self._masks:
            self._masks[window_size] = block_mask(self.segments, window_size)
        return self._masks[window_size]

    def update_and_fetch(self, keys, values):
        return keys, values

    @property
    def state(self):
        return []

    def empty(self) -> bool:
        return True


def forward(model, tokens: mx.array, segments: mx.array | None) -> mx.array:
    """The model's logits for packed rows (segments None: one record per row, the model's own causal mask)."""
    if segments is None:
        return model(tokens)
    shared = SegmentCache(segments)         # one mask, built once, for every layer
    return model(tokens, cache=[shared] * len(model.layers))


def hidden(model, tokens: mx.array, segments: mx.array) -> mx.array:
    """An mlx-lm model's last hidden states for packed rows, before its output layer (model.model: every mlx-lm
    model keeps its body there and its head apart: `lm_head`, or the embedding matrix when tied)."""
    shared = SegmentCache(segments)
    return model.model(tokens, cache=[shared] * len(model.layers))


def output_layer(model):
    """The model's head: hidden states -> logits (lm_head, or the tied embedding matrix)."""
    head = getattr(model, "lm_head", None)
    return head if head is not None else model.model.embed_tokens.as_linear


def splits_exactly(model, vocab: int, tolerance: float = 1e-3) -> bool:
    """Whether output_layer(hidden(x)) is the model's own output (a model that scales or caps its logits, or keeps
    its body elsewhere, is not: its loss then takes every position's logits)."""
    tokens = mx.random.randint(0, vocab, (1, 12), key=mx.random.key(11))
    segments = mx.array([[0] * 5 + [1] * 7])
    try:
        split = output_layer(model)(hidden(model, tokens, segments))
        whole = forward(model, tokens, segments)
        diff = mx.abs(split.astype(mx.float32) - whole.astype(mx.float32)).max()
        scale = mx.abs(whole.astype(mx.float32)).max()
        mx.eval(diff, scale)
    except Exception:  # noqa: BLE001 - a model that does not split so computes every position's logits
        return False
    return bool(diff.item() <= tolerance * max(scale.item(), 1.0))


def attention_share(model) -> float:
    """A position's attention work per position of its row's width, over the rest of its work in the blocks (what
    records.row_width weighs a wider row by): per layer, attention takes 2 x the queries' width a key (scores, then
    the weighted values), about 3 times that with its backward pass; the projections and the MLP take their weights'
    size, twice with the backward pass (an adapter run's frozen weights pass gradients through, no more). 0 for a
    model whose attention width is not found (a q_proj, or a fused qkv_proj / c_attn, in its blocks)."""
    import mlx.nn as nn

    weights = queries = 0
    for layer in model.layers:
        for name, m in layer.named_modules():
            if isinstance(m, nn.QuantizedLinear):
                size = m.weight.shape[0] * m.weight.shape[1] * 32 // m.bits
            elif isinstance(m, nn.Linear):
                size = m.weight.size
            else:
                continue
            weights += size
            last = name.rsplit(".", 1)[-1]
            if last == "q_proj" or name.endswith("q_proj.linear"):
                queries += m.weight.shape[0]
            elif last in ("qkv_proj", "c_attn") or name.endswith(("qkv_proj.linear", "c_attn.linear")):
                queries += m.weight.shape[0] // 3
    return 3.0 * queries / weights if weights and queries else 0.0


def packs_exactly(model, vocab: int, tolerance: float = 1e-3) -> bool:
    """Whether two records packed in one row give each the logits it has alone (a forward pass of a few dozen
    tokens: the model's own check of what `forward` assumes)."""
    rng = mx.random.key(7)
    a = mx.random.randint(0, vocab, (1, 11), key=rng)
    b = mx.random.randint(0, vocab, (1, 13), key=mx.random.split(rng)[0])
    together = mx.concatenate([a, b], axis=1)
    segments = mx.array([[0] * 11 + [1] * 13])
    try:
        packed = forward(model, together, segments)
        alone = mx.concatenate([model(a), model(b)], axis=1)
        diff = mx.abs(packed.astype(mx.float32) - alone.astype(mx.float32)).max()
        scale = mx.abs(alone.astype(mx.float32)).max()
        mx.eval(diff, scale)
    except Exception:  # noqa: BLE001 - any model code that cannot take the stand-in cache packs one record a row
        return False
    return bool(diff.item() <= tolerance * max(scale.item(), 1.0))
