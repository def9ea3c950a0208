"""Sample text from a checkpoint: `clusterctl generate --checkpoint DIR --prompt "Once upon a time"`.

DIR may be a step directory, a run directory or its checkpoints/ directory (the latest checkpoint is used).
Generation keeps a key/value cache; when the context reaches the model's block size it restarts from the
last half block, so any number of tokens can be produced without going past the trained context length.
"""
from __future__ import annotations

import shlex
from typing import Iterator

import mlx.core as mx

from ..errors import CheckpointError, UsageError
from . import stepdirs, strategies
from .model import ModelArgs, Transformer


def load(checkpoint_dir: str):
    """(model, tokenizer, state) from a checkpoint written by the trainer."""
    from ..data.tokenizer import load_tokenizer

    ckpt = stepdirs.resolve(checkpoint_dir, None)
    state = stepdirs.read_state(ckpt)
    if "mlx_lm" in state["model"]:
        run = ckpt.parent.parent
        raise CheckpointError(f"{ckpt} fine-tuned the mlx-lm model {state['model']['mlx_lm']}: generate with mlx-lm, "
                              f"mlx_lm.generate --model {shlex.quote(str(run / 'model'))} "
                              f"(`clusterctl export {shlex.quote(str(run))}` writes it if absent)")
    model = Transformer(ModelArgs(**state["model"]))
    model.load_weights(list(strategies.get(state["strategy"]).full_parameters(ckpt).items()))   # as its strategy wrote them
    model.eval()
    mx.eval(model.parameters())
    return model, load_tokenizer(state["tokenizer"]), state


def sample_tokens(model: Transformer, prompt: list[int], max_tokens: int, temperature: float,
                  seed: int, top_k: int = 0) -> Iterator[int]:
    """Yield `max_tokens` new token ids. temperature 0 is greedy; top_k > 0 keeps the k likeliest."""
    key = mx.random.key(seed)
    block = model.args.block_size
    context = list(prompt)[-block:]
    cache = model.new_cache()
    logits = model(mx.array(context)[None], cache)[:, -1]
    for _ in range(max_tokens):
        if temperature <= 0:
            token = mx.argmax(logits, axis=-1)
        else:
            logits = logits / temperature
            if top_k:
                kth = mx.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])]
                logits = mx.where(logits < kth[:, None], -mx.inf, logits)
            key, sub = mx.random.split(key)
            token = mx.random.categorical(logits, key=sub)
        token_id = token.item()
        yield token_id
        context.append(token_id)
        if cache[0].offset >= block:      # restart from the last half block: stay within trained positions
            context = context[-(block // 2):]
            cache = model.new_cache()
            logits = model(mx.array(context)[None], cache)[:, -1]
        else:
            logits = model(mx.array([[token_id]]), cache)[:, -1]


def generate_text(checkpoint_dir: str, prompt: str, max_tokens: int = 200, temperature: float = 0.8,
                  seed: int = 0, top_k: int = 0) -> Iterator[str]:
    """The continuation of `prompt`, piece by piece (whole characters only). Loads the checkpoint before
    returning, so a bad checkpoint fails here rather than part-way through the output."""
    if max_tokens < 0:
        raise UsageError(f"--max-tokens {max_tokens}: give 0 or more tokens to generate")
    model, tokenizer, _ = load(checkpoint_dir)
    prompt_ids = [tokenizer.eos_id] + (tokenizer.encode(prompt) if prompt else [])  # documents follow an EOS
    return _decoded(sample_tokens(model, prompt_ids, max_tokens, temperature, seed, top_k), tokenizer)


def _decoded(tokens: Iterator[int], tokenizer) -> Iterator[str]:
    new: list[int] = []
    shown = ""
    for token_id in tokens:
        if token_id == tokenizer.eos_id:
            break
        new.append(token_id)
        text = tokenizer.decode(new)
        if text.endswith("\ufffd"):           # an incomplete UTF-8 sequence: wait for its other bytes
            continue
        yield text[len(shown):]
        shown = text
    text = tokenizer.decode(new)
    if len(text) > len(shown):
        yield text[len(shown):]
