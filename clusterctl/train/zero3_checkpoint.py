"""ZeRO-3's checkpoint format (docs/trainer.md#zero3): no rank holds the whole model, so each writes its slices.

    zero3-rank-K.safetensors   rank K's slices of the parameters' flat groups ("param:NAME") and of the optimizer
                               state ("opt:KEY")
    zero3.json                 the manifest: world size, each group's name, dtype and parameters with their shapes

`save` writes a rank's file and, on a writer (one per disk), the manifest, after `_share_files` has sent every
writer the files its disk lacks (through the collectives, one file and 64 MiB at a time), so every host holds a
whole checkpoint. `load` re-shards them for any world size; `full_parameters` assembles every parameter for one
process (generate, export). The strategies' registry entry for zero3 (strategies.ZeRO3) is the only caller.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..atomic import write_text
from ..errors import CheckpointError
from .checkpoint import barrier
from .fsdp import chunk_size

MANIFEST = "zero3.json"
SHARE_CHUNK = 64 * 2**20


def zero3_file(rank: int) -> str:
    return f"zero3-rank-{rank}.safetensors"


def save(tmp: Path, sharded, optimizer, group, writer: bool) -> None:
    rank, world = group.rank(), group.size()
    arrays = {f"param:{k}": v for k, v in sharded.shards.items()}
    arrays.update({f"opt:{k}": v for k, v in tree_flatten(optimizer.state)})
    part = tmp / f".part-{zero3_file(rank)}"        # mx.save_safetensors wants the .safetensors suffix
    mx.save_safetensors(str(part), arrays)
    os.replace(part, tmp / zero3_file(rank))
    del arrays
    barrier(group)
    _share_files(tmp, group, writer)
    if writer:
        manifest = {"world": world, "groups": [{"name": g.name, "dtype": str(g.dtype).removeprefix("mlx.core."),
                                                "params": [[k, list(shape)] for k, shape in zip(g.keys, g.shapes)]}
                                               for g in sharded.groups]}
        write_text(str(tmp / MANIFEST), json.dumps(manifest, indent=1) + "\n")


def _share_files(tmp: Path, group, writer: bool) -> None:
    """Every rank wrote its zero3 file into the temporary directory on its own disk; a writer (one per disk)
    that lacks rank k's file gets it from rank k through all_sum (rank k sends the bytes, the others zeros)."""
    world, rank = group.size(), group.rank()
    if world == 1:
        return
    lacking = [int(writer and not (tmp / zero3_file(k)).is_file()) for k in range(world)]
    need = mx.distributed.all_sum(mx.array(lacking, dtype=mx.int32), group=group, stream=mx.cpu).tolist()
    for k in range(world):
        if not need[k]:
            continue
        mine = (tmp / zero3_file(k)).stat().st_size if rank == k else 0
        size = int(mx.distributed.all_sum(mx.array(mine, dtype=mx.int64), group=group, stream=mx.cpu).item())
        source = open(tmp / zero3_file(k), "rb") if rank == k else None
        target = open(tmp / (zero3_file(k) + ".part"), "wb") if lacking[k] else None
        try:
            for at in range(0, size, SHARE_CHUNK):
                n = min(SHARE_CHUNK, size - at)
                piece = (mx.array(memoryview(source.read(n)).cast("B"), dtype=mx.uint8) if source is not None
                         else mx.zeros((n,), dtype=mx.uint8))
                got = mx.distributed.all_sum(piece, group=group, stream=mx.cpu)
                mx.eval(got)
                if target is not None:
                    target.write(memoryview(got))
        finally:
            if source is not None:
                source.close()
            if target is not None:
                target.close()
        if target is not None:
            os.replace(tmp / (zero3_file(k) + ".part"), tmp / zero3_file(k))


def read_manifest(ckpt: Path) -> dict:
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: cannot read {MANIFEST} ({e})") from None
    missing = [zero3_file(k) for k in range(manifest["world"]) if not (ckpt / zero3_file(k)).is_file()]
    if missing:
        raise CheckpointError(f"{ckpt} lacks {', '.join(missing)} of its {manifest['world']} ZeRO-3 shards "
                              "(copy them from the hosts that wrote them)")
    return manifest


def _slice_of(files: list[dict], name: str, size: int, old: int, new: int, rank: int) -> mx.array:
    """Rank `rank` of `new`'s slice of an array flattened and split over `old` ranks' files (padded)."""
    old_chunk, new_chunk = chunk_size(size, old), chunk_size(size, new)
    lo, hi = rank * new_chunk, (rank + 1) * new_chunk
    pieces = []
    for k in range(lo // old_chunk, min(old, -(-hi // old_chunk))):
        a, b = max(lo, k * old_chunk), min(hi, (k + 1) * old_chunk)
        if a < b:
            pieces.append(files[k][name][a - k * old_chunk:b - k * old_chunk])
    have = sum(p.size for p in pieces)
    if have < new_chunk:
        pieces.append(mx.zeros((new_chunk - have,), dtype=pieces[0].dtype if pieces else mx.float32))
    out = mx.concatenate(pieces) if len(pieces) > 1 else mx.contiguous(pieces[0])   # not a view of the file's array
    mx.eval(out)
    return out


def _group_sizes(manifest: dict) -> dict[str, int]:
    return {g["name"]: sum(math.prod(shape) for _, shape in g["params"]) for g in manifest["groups"]}


def load(ckpt: Path, sharded, optimizer, rank: int, world: int) -> None:
    """This rank's slices of the parameters (flat groups) and of the optimizer state, re-sharded from the
    checkpoint's world size to this one (any sizes)."""
    manifest = read_manifest(ckpt)
    old = manifest["world"]
    layout = [(g["name"], [(k, tuple(shape)) for k, shape in g["params"]]) for g in manifest["groups"]]
    if layout != [(g.name, list(zip(g.keys, g.shapes))) for g in sharded.groups]:
        raise CheckpointError(f"{ckpt}: its parameters do not match this model's (another model shape?)")
    files = [mx.load(str(ckpt / zero3_file(k))) for k in range(old)]
    sizes = _group_sizes(manifest)
    for name, size in sizes.items():
        sharded.shards[name] = _slice_of(files, f"param:{name}", size, old, world, rank)
    state = []
    for name in files[0]:
        if not name.startswith("opt:"):
            continue
        key = name[4:]
        owner = key.rsplit(".", 1)[0]
        if owner in sizes and files[0][name].ndim == 1 and files[0][name].size == chunk_size(sizes[owner], old):
            state.append((key, _slice_of(files, name, sizes[owner], old, world, rank)))
        else:
            state.append((key, files[0][name]))
    optimizer.state = tree_unflatten(state)


def full_parameters(ckpt: Path) -> dict[str, mx.array]:
    """Every parameter, assembled from the ranks' slices (one process: generate, tests)."""
    manifest = read_manifest(ckpt)
    files = [mx.load(str(ckpt / zero3_file(k))) for k in range(manifest["world"])]
    out = {}
    for g in manifest["groups"]:
        flat, at = mx.concatenate([f[f"param:{g['name']}"] for f in files]), 0
        for key, shape in g["params"]:
            out[key] = flat[at:at + math.prod(shape)].reshape(shape)
            at += math.prod(shape)
    return out
