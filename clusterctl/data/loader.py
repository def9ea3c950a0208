"""What a rank trains on: its own shard, memory-mapped, and batches that are a pure function of the step.

    train, val = rank_tokens(rank, world, data_dir="data/")      # this rank's shard + val.bin
    loader = BatchLoader(train, batch_size=8, block_size=256, seed=0, rank=rank)
    x, y = loader.batch(step)                                     # (8, 256) int32 each; y is x shifted by one

A TokenFile maps one file and copies out only the windows a batch asks for, so a rank never reads the
whole dataset — nor, with prepared shards, any other rank's data. Without prepared shards, a rank
tokenizes only its own documents (k % world == rank) and keeps just those tokens in memory.
"""
from __future__ import annotations

import mmap
import os
import random
import sys
from array import array

import mlx.core as mx

from ..errors import ShardError, SourceError
from .corpus import is_val, open_source
from .shards import ITEMSIZE, dtype_for, read_manifest
from .stories import DEFAULT_STORIES
from .tokenizer import load_tokenizer

# Validation documents when reading a corpus directly (no shards): the same rule prepare uses, capped so
# that every rank holding the shared val set stays cheap on a large corpus.
VAL_FRACTION = 0.01
VAL_MAX_DOCUMENTS = 200
_CODES = {"uint16": "H", "uint32": "I" if array("I").itemsize == 4 else "L"}


class TokenFile:
    """A little-endian uint16 / uint32 token file, memory-mapped; `window` copies only its slice."""

    def __init__(self, path, dtype: str, expected_tokens: int | None = None):
        if dtype not in ITEMSIZE:
            raise ShardError(f"{path}: unknown token dtype {dtype!r} (uint16 or uint32)")
        if sys.byteorder != "little":
            raise ShardError("token files are little-endian; this machine is big-endian")
        self.path, self.dtype = os.fspath(path), dtype
        try:
            size = os.path.getsize(self.path)
        except OSError:
            raise ShardError(f"{self.path}: no such token file") from None
        itemsize = ITEMSIZE[dtype]
        if size % itemsize:
            raise ShardError(f"{self.path}: {size} bytes is not a whole number of {dtype} tokens: truncated or "
                             f"corrupted")
        if expected_tokens is not None and size // itemsize != expected_tokens:
            raise ShardError(f"{self.path}: {size // itemsize} tokens, the manifest says {expected_tokens}: "
                             f"truncated or corrupted")
        self._mmap = None
        self._tokens: memoryview = memoryview(array(_CODES[dtype]))
        if size:   # mmap cannot map an empty file
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._tokens = memoryview(self._mmap).cast(_CODES[dtype])

    def __len__(self) -> int:
        return len(self._tokens)

    def window(self, start: int, length: int) -> mx.array:
        return _window(self._tokens, start, length, self.path)

    def close(self) -> None:
        self._tokens.release()
        if self._mmap is not None:
            self._mmap.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TokenArray:
    """Tokens already in memory (a rank's slice of a corpus), with TokenFile's interface."""

    def __init__(self, tokens, dtype: str = "uint16"):
        self.path, self.dtype = "(memory)", dtype
        self._tokens = memoryview(tokens if isinstance(tokens, array) else array(_CODES[dtype], tokens))

    def __len__(self) -> int:
        return len(self._tokens)

    def window(self, start: int, length: int) -> mx.array:
        return _window(self._tokens, start, length, self.path)


def _window(tokens: memoryview, start: int, length: int, where: str) -> mx.array:
    if start < 0 or length < 0 or start + length > len(tokens):
        raise ShardError(f"{where}: window [{start}, {start + length}) is outside its {len(tokens)} tokens")
    return mx.array(tokens[start:start + length])


def rank_tokens(rank: int, world: int, data_dir: str | None = None, source: str = "embedded",
                tokenizer=None, seed: int = 0) -> tuple[TokenFile | TokenArray, TokenFile | TokenArray]:
    """(train, val) for this rank. With `data_dir`: the rank's prepared shard and val.bin, checked against
    manifest.json (world size, tokenizer, length). Without: documents k % world == rank of `source`
    (`embedded` generates only those; `seed` is the embedded corpus's seed), and as val the held-out
    documents (prepare's rule, at most VAL_MAX_DOCUMENTS) that every rank shares."""
    if not isinstance(world, int) or world < 1 or not 0 <= rank < world:
        raise ShardError(f"rank {rank} of world size {world}: need 0 <= rank < world")
    if data_dir is not None:
        manifest = read_manifest(data_dir)
        if manifest.world_size != world:
            raise ShardError(f"{data_dir}: shards were prepared for world size {manifest.world_size}, this run "
                             f"has {world} (re-run: clusterctl data prepare SOURCE --world {world} --out {data_dir})")
        if tokenizer is not None:
            given, recorded = load_tokenizer(tokenizer).spec(), manifest.tokenizer
            if (given["type"], given.get("sha256")) != (recorded.get("type"), recorded.get("sha256")):
                raise ShardError(f"{data_dir}: the shards were made with another tokenizer ({recorded['type']}"
                                 f"{', sha256 ' + recorded['sha256'][:12] if recorded.get('sha256') else ''})")
        shard, val = manifest.shards[rank], manifest.val
        return (TokenFile(os.path.join(data_dir, shard.file), manifest.dtype, shard.tokens),
                TokenFile(os.path.join(data_dir, val.file), manifest.dtype, val.tokens))
    tok = load_tokenizer(tokenizer)
    if source == "embedded" and seed:
        source = f"embedded:{DEFAULT_STORIES}:{seed}"
    dtype = dtype_for(tok.vocab_size)
    train, val = array(_CODES[dtype]), array(_CODES[dtype])

    def held_out(k):
        return is_val(k, VAL_FRACTION) and int((k + 1) * VAL_FRACTION) <= VAL_MAX_DOCUMENTS

    def want(k):    # every val document past the cap is skipped by all ranks, as prepare keeps it out of train
        return held_out(k) or (k % world == rank and not is_val(k, VAL_FRACTION))

    for k, text in open_source(source).documents(want):
        if not text:
            continue        # as prepare does: an empty document adds no EOS either
        out = val if held_out(k) else train
        out.extend(tok.encode(text))
        out.append(tok.eos_id)
    if not train:
        raise SourceError(f"{source}: no training documents for rank {rank} of {world}")
    return TokenArray(train, dtype), TokenArray(val, dtype)


class BatchLoader:
    """Random windows of block_size + 1 tokens; batch(step) depends only on (seed, rank, step), so a
    resumed run sees exactly the batches it would have, and every rank can run the same number of steps."""

    def __init__(self, tokens, batch_size: int, block_size: int, seed: int, rank: int):
        if batch_size < 1 or block_size < 1:
            raise ShardError(f"batch_size and block_size must be >= 1 (got {batch_size}, {block_size})")
        if len(tokens) < block_size + 1:
            raise ShardError(f"{tokens.path}: {len(tokens)} tokens cannot fill one window of block_size + 1 = "
                             f"{block_size + 1}")
        self.tokens, self.batch_size, self.block_size, self.seed, self.rank = tokens, batch_size, block_size, seed, rank

    def starts(self, step: int) -> list[int]:
        rng = random.Random(f"clusterctl-batch:{self.seed}:{self.rank}:{step}")
        last = len(self.tokens) - self.block_size - 1
        return [rng.randint(0, last) for _ in range(self.batch_size)]

    def batch(self, step: int) -> tuple[mx.array, mx.array]:
        rows = mx.stack([self.tokens.window(s, self.block_size + 1) for s in self.starts(step)]).astype(mx.int32)
        return rows[:, :-1], rows[:, 1:]

    def step(self, step: int, accum: int) -> tuple[mx.array, mx.array]:
        """The `accum` micro-batches of optimizer step `step`, stacked as (accum, B, L)."""
        pairs = [self.batch(step * accum + i) for i in range(accum)]
        return mx.stack([x for x, _ in pairs]), mx.stack([y for _, y in pairs])

    def held_out(self, batches: int):
        """The held-out loss's batches: the first `batches` (fixed by the seed)."""
        return (self.batch(i) for i in range(batches))
