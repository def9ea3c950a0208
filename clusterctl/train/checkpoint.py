"""Checkpoints: <out>/checkpoints/step-000123/{model.safetensors, optimizer.safetensors, state.json}.

An adapter run (--adapter) writes adapters.safetensors and adapter_config.json (mlx-lm's adapter layout:
adapters.py) in place of model.safetensors: the frozen base is the --model directory's, and a step directory
is then an adapter path mlx-lm takes as it is.

FSDP writes optimizer-rank-K.safetensors per rank instead of optimizer.safetensors (each rank holds only
its slices of the optimizer state). ZeRO-3 writes no full model: each rank writes
zero3-rank-K.safetensors (its slices of the parameters' flat groups and of the optimizer state) and
zero3.json (the manifest: world size, each group's name, dtype and parameters with their shapes, in
order); loading re-shards them for any world size (`load_zero3`) or assembles the full parameters for
one process (`load_model`, which `clusterctl generate` uses).

A checkpoint is assembled in a hidden temporary directory and renamed
into place, then `checkpoints/latest` (a one-line file naming it) is replaced atomically, so a run killed
at any moment leaves only whole checkpoints behind.

Ranks that do not share rank 0's filesystem (separate hosts without a shared disk) each write a full copy
on their own disk: in DP every rank holds the whole state, and in FSDP every rank holds the full
parameters and its own optimizer shard, so every host can resume from its local copy. In ZeRO-3 no rank
holds the whole state, so after every rank has written its file the files a writer's disk lacks are sent
to it through the collectives (`_share_files`, one file and 64 MiB at a time): every host still ends with
a complete checkpoint, for restarts on fewer hosts and for `run`'s fetch from the first host.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..atomic import fsync_tree, write_text
from ..errors import CheckpointError, NoSpace
from ..trainer_contract import CHECKPOINT_TMP_GLOB, CHECKPOINTS, STEP_GLOB, checkpoint_step, step_dir_name
from .fsdp import chunk_size
from .strategies import get

FORMAT = 1


def barrier(group) -> None:
    if group.size() > 1:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))


def int_from_rank0(value: int, group) -> int:
    """Rank 0's `value` on every rank (a non-negative int below 2**31)."""
    if group.size() == 1:
        return value
    mine = mx.array(value if group.rank() == 0 else 0, dtype=mx.int32)
    return int(mx.distributed.all_sum(mine, group=group, stream=mx.cpu).item())


def save(out_dir: str, step: int, model, optimizer, state: dict, group, keep: int = 0) -> Path:
    """Every rank calls this at the same step. `state` is the JSON part (config, rng, data position...)."""
    rank, strategy = group.rank(), state["strategy"]     # what each strategy writes: its entry's `write`
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
        get(strategy).write(tmp, model, optimizer, group, writer, state.get("adapter"))
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


def steps_in(root) -> list[Path]:
    """The whole checkpoints in a checkpoints/ directory, oldest first."""
    root = Path(root)
    return sorted(p for p in root.iterdir() if checkpoint_step(p.name) is not None) if root.is_dir() else []


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


ZERO3_MANIFEST = "zero3.json"
SHARE_CHUNK = 64 * 2**20


def zero3_file(rank: int) -> str:
    return f"zero3-rank-{rank}.safetensors"


def save_zero3(tmp: Path, sharded, optimizer, group, writer: bool) -> None:
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
        write_text(str(tmp / ZERO3_MANIFEST), json.dumps(manifest, indent=1) + "\n")


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


def read_zero3_manifest(ckpt: Path) -> dict:
    try:
        manifest = json.loads((ckpt / ZERO3_MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: cannot read {ZERO3_MANIFEST} ({e})") from None
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


def load_zero3(ckpt: Path, sharded, optimizer, rank: int, world: int) -> None:
    """This rank's slices of the parameters (flat groups) and of the optimizer state, re-sharded from the
    checkpoint's world size to this one (any sizes)."""
    manifest = read_zero3_manifest(ckpt)
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


def _zero3_full(ckpt: Path) -> dict[str, mx.array]:
    """Every parameter, assembled from the ranks' slices (one process: generate, tests)."""
    manifest = read_zero3_manifest(ckpt)
    files = [mx.load(str(ckpt / zero3_file(k))) for k in range(manifest["world"])]
    out = {}
    for g in manifest["groups"]:
        flat, at = mx.concatenate([f[f"param:{g['name']}"] for f in files]), 0
        for key, shape in g["params"]:
            out[key] = flat[at:at + math.prod(shape)].reshape(shape)
            at += math.prod(shape)
    return out


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


def resolve(resume: str, out_dir: str | None) -> Path:
    """'latest' (in out_dir), a run directory, its checkpoints/ directory, or a step directory."""
    if resume == "latest":
        if not out_dir:
            raise CheckpointError("--resume latest needs --out DIR (or $CLUSTERCTL_RUN_DIR)")
        path = Path(out_dir)
    else:
        path = Path(resume)
    if (path / "state.json").is_file():
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    pointer = root / "latest"
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if (named / "state.json").is_file():
            return named
    complete = sorted(p for p in root.glob(STEP_GLOB) if checkpoint_step(p.name) is not None and (p / "state.json").is_file())
    if not complete:
        raise CheckpointError(f"no checkpoint in {path}")
    return complete[-1]


def newest_step(out_dir: str) -> int:
    """The step of the newest complete checkpoint in out_dir/checkpoints (0: none)."""
    root = Path(out_dir) / "checkpoints"
    steps = [step for p in root.glob(STEP_GLOB)
             if (step := checkpoint_step(p.name)) is not None and (p / "state.json").is_file()] if root.is_dir() else []
    return max(steps, default=0)


def newest_step_everywhere(out_dir: str, group) -> int:
    """The newest complete checkpoint any rank holds in its own out_dir (0: none). A restart continues from
    it: every rank of the new world must hold it (each host keeps a full copy, module docstring)."""
    mine = newest_step(out_dir)
    if group.size() == 1:
        return mine
    return int(mx.distributed.all_max(mx.array(mine, dtype=mx.int32), group=group, stream=mx.cpu).item())


def read_state(ckpt: Path) -> dict:
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: cannot read state.json ({e})") from None
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt}: checkpoint format {state.get('format')!r}, expected {FORMAT}")
    return state


def load_model(ckpt: Path, model) -> None:
    """The full parameters into `model` (one process: generation, DP and FSDP resume)."""
    if (ckpt / ZERO3_MANIFEST).is_file():
        model.update(tree_unflatten(list(_zero3_full(ckpt).items())))
        return
    from .adapters import ADAPTER_FILE, load as load_adapters
    if (ckpt / ADAPTER_FILE).is_file():          # an adapter run's: into a model wrapped as it was (adapters.apply)
        load_adapters(ckpt, model)
        return
    model.load_weights(str(ckpt / "model.safetensors"))


def load_optimizer(path: Path, optimizer) -> None:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    optimizer.state = tree_unflatten(list(mx.load(str(path)).items()))
