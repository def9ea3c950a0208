"""Every rank's MLX random key, saved with a checkpoint and restored exactly (checkpoint.py's state, callbacks.py
writes it; trainer.py restores it at a resume, zero3.py around a recomputed forward pass)."""
from __future__ import annotations

import mlx.core as mx


def random_states(group) -> list[list[int]]:
    """Every rank's MLX random key, [hi, lo] per rank, in rank order."""
    key = mx.random.state[0].astype(mx.uint32)
    keys = mx.distributed.all_gather(key[None], group=group, stream=mx.cpu) if group.size() > 1 else key[None]
    return keys.tolist()


def restore_random_state(key: list[int]) -> None:
    # mx.random.seed(s) sets the key to [s >> 32, s & 0xffffffff], so this restores a saved key exactly.
    mx.random.seed((int(key[0]) << 32) | int(key[1]))
