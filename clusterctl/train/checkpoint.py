"""Checkpoints: <out>/checkpoints/step-000123/{model.safetensors, optimizer.safetensors, state.json}.

An adapter run (--adapter) writes adapters.safetensors and adapter_config.json (mlx-lm's adapter layout:
adapters.py) in place of model.safetensors: the frozen base is the --model directory's, and a step directory
is then an adapter path mlx-lm takes as it is.

What each rank writes into the directory is its strategy's (strategies.py: each registry entry's `write` and
`read`; `save` is handed the entry): dp writes model.safetensors and optimizer.safetensors, fsdp an
optimizer-rank-K.safetensors per rank (each rank holds only its slices of the optimizer state), zero3 no full
model but each rank's slices and a manifest (zero3_checkpoint.py). This module holds what every format shares:
the directory's making, the arrays of a whole model and an optimizer, space. Finding checkpoints on disk
(`resolve`, the newest step, state.json) is stepdirs.py's.

A checkpoint is assembled in a hidden temporary directory and renamed
into place, then `checkpoints/latest` (a one-line file naming it) is replaced atomically, so a run killed
at any moment leaves only whole checkpoints behind.

Ranks that do not share rank 0's filesystem (separate hosts without a shared disk) each write a full copy
on their own disk: in DP every rank holds the whole state, and in FSDP every rank holds the full
parameters and its own optimizer shard, so every host can resume from its local copy. In ZeRO-3 no rank
holds the whole state, so after every rank has written its file the files a writer's disk lacks are sent
to it through the collectives (zero3_checkpoint.py): every host still ends with
a complete checkpoint, for restarts on fewer hosts and for `run`'s fetch from the first host.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..atomic import fsync_tree, write_text
from ..errors import CheckpointError, NoSpace
from ..trainer_contract import CHECKPOINT_TMP_GLOB, CHECKPOINTS, step_dir_name
from .stepdirs import FORMAT, newest_step, steps_in


def barrier(group) -> None:
    if group.size() > 1:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))


def int_from_rank0(value: int, group) -> int:
    """Rank 0's `value` on every rank (a non-negative int below 2**31)."""
    if group.size() == 1:
        return value
    mine = mx.array(value if group.rank() == 0 else 0, dtype=mx.int32)
    return int(mx.distributed.all_sum(mine, group=group, stream=mx.cpu).item())


def save(out_dir: str, step: int, model, optimizer, state: dict, group, entry, keep: int = 0) -> Path:
    """Every rank calls this at the same step. `state` is the JSON part (config, rng, data position...); `entry`
    the strategy's registry entry (strategies.get), whose `write` puts this rank's arrays into the directory."""
    rank = group.rank()
    root = Path(out_dir) / "checkpoints"
    final = root / step_dir_name(step)
    nonce = int_from_rank0(int.from_bytes(os.urandom(3), "little"), group)
    tmp = root / f".{final.name}.tmp-{nonce:06x}"
    writer = False           # this rank made tmp (rank 0, and the first rank on each disk rank 0 does not share)
    try:
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            writer = True
        barrier(group)
        if rank != 0:
            root.mkdir(parents=True, exist_ok=True)
            try:                        # succeeds only for the first rank on a disk rank 0 does not share
                tmp.mkdir()
                writer = True
            except FileExistsError:
                pass
        barrier(group)
        entry.write(tmp, model, optimizer, group, writer, state.get("adapter"))
        barrier(group)                 # every shard is on disk before the directory becomes visible
        if writer:
            write_text(str(tmp / "state.json"), json.dumps({"format": FORMAT, "step": step, **state}, indent=1))
            fsync_tree(str(tmp))        # on disk before its name is: a power loss never leaves `latest` on a hollow one
            if final.exists():          # left by an earlier run that got further before it was stopped
                shutil.rmtree(final)
            os.replace(tmp, final)
            write_text(str(root / "latest"), final.name + "\n", durable=True)
            _prune(root, keep, final.name)
        barrier(group)
    except BaseException as e:
        # this rank's own failure, or a peer's (its collective lost the connection): either way nothing half
        # written stays behind on this host (a killed writer's is removed at the next start: remove_stale)
        used = _size(tmp) if tmp.is_dir() else 0
        shutil.rmtree(tmp, ignore_errors=True)       # the save fails on every rank: no rank of it needs it
        if isinstance(e, (OSError, RuntimeError)) and _no_space(root, e):
            raise NoSpace(f"checkpoint at step {step} not written: no space left on device in {root} "
                          f"({mib(shutil.disk_usage(root).free)} free after removing its partial copy; a checkpoint "
                          f"takes {mib(_checkpoint_size(root) or used)}, --keep {keep or 'all'}): free space there "
                          "or lower --keep, then --resume latest") from None
        raise
    return final


LOW_SPACE = 4 * 2**20      # a write that failed with less free than this in its filesystem failed for want of space


def _no_space(root: Path, e: BaseException) -> bool:
    """Whether a failed write failed for want of space: ENOSPC / EDQUOT, or MLX's "[write] Unable to write" (its
    message carries no errno) on a filesystem with almost nothing free."""
    import errno

    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return "Unable to write" in str(e) and shutil.disk_usage(root).free < LOW_SPACE
    except OSError:
        return False


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _checkpoint_size(root: Path) -> int:
    """The newest whole checkpoint's size on this disk (0: none yet)."""
    steps = steps_in(root)
    return _size(steps[-1]) if steps else 0


def newest_size(out_dir: str) -> int:
    """The newest whole checkpoint's size in <out>/checkpoints on this rank's disk (0: none yet)."""
    return _checkpoint_size(Path(out_dir) / CHECKPOINTS)


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def remove_stale(out_dir: str) -> list[str]:
    """The temporary directories a killed writer left in <out>/checkpoints (never a whole checkpoint): removed at
    a run's start, before any rank of it writes one. Their names."""
    root = Path(out_dir) / CHECKPOINTS
    stale = list(root.glob(CHECKPOINT_TMP_GLOB)) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in stale]


def save_tree(path: Path, tree) -> None:
    mx.save_safetensors(str(path), dict(tree_flatten(tree)))


def write_model(tmp: Path, model, adapter: dict | None) -> None:
    """The trained parameters whole: an adapter run's adapters in mlx-lm's layout (`adapter`: their
    adapter_config.json's settings; the base is --model's), else every parameter."""
    if adapter:
        from .adapters import save as save_adapters
        save_adapters(tmp, model, adapter)
    else:
        mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(model.parameters())))


def _prune(root: Path, keep: int, newest: str) -> None:
    steps = steps_in(root)
    old = steps[:-keep] if keep else []
    stale_tmp = list(root.glob(CHECKPOINT_TMP_GLOB))
    for path in old + stale_tmp:
        if path.name != newest:
            shutil.rmtree(path, ignore_errors=True)


def newest_step_everywhere(out_dir: str, group) -> int:
    """The newest complete checkpoint any rank holds in its own out_dir (0: none). A restart continues from
    it: every rank of the new world must hold it (each host keeps a full copy, module docstring)."""
    mine = newest_step(out_dir)
    if group.size() == 1:
        return mine
    return int(mx.distributed.all_max(mx.array(mine, dtype=mx.int32), group=group, stream=mx.cpu).item())


def load_model(ckpt: Path, model) -> None:
    """The parameters a dp or fsdp checkpoint holds whole into `model` (its resume; generation asks the strategy's
    entry, which knows its own format: strategies.Strategy.load_whole)."""
    from .adapters import ADAPTER_FILE, load as load_adapters
    if (ckpt / ADAPTER_FILE).is_file():          # an adapter run's: into a model wrapped as it was (adapters.apply)
        load_adapters(ckpt, model)
        return
    model.load_weights(str(ckpt / "model.safetensors"))


def load_optimizer(path: Path, optimizer) -> None:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    optimizer.state = tree_unflatten(list(mx.load(str(path)).items()))
