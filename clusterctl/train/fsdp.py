"""Fully sharded data parallel optimizer step: `fsdp_apply_gradients`, on every MLX backend.

The semantics are those of `mlx.nn.fsdp_apply_gradients` (MLX 0.31.1-0.32.0; removed in 0.32.4 in favour
of `nn.fully_shard`, which needs sum_scatter and so does not run on ring or mpi; see
docs/facts/mlx-distributed.md#fsdp-apply-gradients-removed): reduce-scatter the gradients so each rank holds 1/N
of them, optionally clip by the global norm, step the optimizer on the local slice only, all-gather the
updated parameters. Differences from MLX's version:

* the reduce-scatter works on ring and mpi too (`collectives.reduce_scatter`;
  docs/facts/mlx-distributed.md#sum-scatter-missing-on-ring-and-mpi);
* a parameter of any shape works: each one is flattened and zero-padded to a multiple of N, so a first
  dimension not divisible by N (or a scalar) is fine;
* buckets are per dtype, so float32 and bfloat16 parameters can mix;
* the optimizer sees one flat slice per parameter (MLX's saw one slice per bucket).

Optimizer state layout (what a per-rank checkpoint holds): `optimizer.state` has the same tree as the
gradients; for a parameter with `size` elements every state array (Adam's m and v, ...) is 1-D of length
`chunk = ceil(size / S)` (S = fsdp group size) and holds elements [r*chunk, (r+1)*chunk) of the
parameter's row-major flattening, zero-padded at the end, for this rank's position r in the fsdp group.
Padding stays zero under elementwise optimizers (zero gradient, zero weight). Elementwise optimizers
(SGD, Adam, AdamW, Lion, RMSprop, ...) therefore give the same updates as data parallel; shape-aware ones
(Adafactor's factored moments, Muon) see 1-D slices, as they did in MLX's version. With N == 1 the
optimizer steps the full parameters (as MLX's did), so its state then has the parameters' shapes.

If a future MLX brings `mlx.nn.fsdp_apply_gradients` back and the call is one it handles (native
sum_scatter on the group, every first dimension divisible by S, one dtype), it is used instead; its
optimizer state is then keyed by bucket index, MLX's layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn
from mlx.utils import tree_flatten, tree_map, tree_reduce, tree_unflatten

from clusterctl.train.collectives import reduce_scatter, reduce_scatter_method, world_group
from clusterctl.train.step import accumulated_grads, mean_over_ranks

DEFAULT_COMMUNICATION_SIZE = 32 * 1024**2


@dataclass(frozen=True)
class Bucket:
    """Arrays (by index into the flat list) sent in one collective; all share `dtype`."""
    dtype: mx.Dtype
    indices: tuple[int, ...]


def chunk_size(size: int, shards: int) -> int:
    """Elements per rank of an array of `size` elements split over `shards` ranks (padded up)."""
    return -(-size // shards)


def plan_buckets(sizes, dtypes, shards: int, communication_size: int) -> list[Bucket]:
    """Group arrays of one dtype, in order, into buckets of at least `communication_size` bytes of
    padded data (the last bucket of a dtype may be smaller); communication_size <= 0 puts each array
    in a bucket of its own. MLX closes a bucket the same way: once it reaches the size."""
    buckets = []
    for dtype in dict.fromkeys(dtypes):         # dtypes in order of first appearance
        current, nbytes = [], 0
        for i, (size, dt) in enumerate(zip(sizes, dtypes)):
            if dt != dtype:
                continue
            current.append(i)
            nbytes += chunk_size(size, shards) * shards * dtype.size
            if communication_size <= 0 or nbytes >= communication_size:
                buckets.append(Bucket(dtype, tuple(current)))
                current, nbytes = [], 0
        if current:
            buckets.append(Bucket(dtype, tuple(current)))
    return buckets


def pack_rows(arrays, shards: int) -> mx.array:
    """(shards, sum of chunks) matrix whose row r is rank r's chunk of every array, in order."""
    rows = []
    for a in arrays:
        chunk = chunk_size(a.size, shards)
        flat = a.reshape(-1)
        pad = chunk * shards - a.size
        if pad:
            flat = mx.concatenate([flat, mx.zeros((pad,), dtype=a.dtype)])
        rows.append(flat.reshape(shards, chunk))
    return rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=1)    # one array: no copy


def split_row(row: mx.array, sizes, shards: int) -> list[mx.array]:
    """Split one packed row (1-D) back into each array's flat chunk."""
    bounds, at = [], 0
    for size in sizes[:-1]:
        at += chunk_size(size, shards)
        bounds.append(at)
    return mx.split(row, bounds) if bounds else [row]


def unpack_rows(matrix: mx.array, shapes, shards: int) -> list[mx.array]:
    """Inverse of `pack_rows`: full arrays from the (shards, sum of chunks) matrix, padding dropped."""
    sizes = [_numel(s) for s in shapes]
    bounds, at = [], 0
    for size in sizes[:-1]:
        at += chunk_size(size, shards)
        bounds.append(at)
    parts = mx.split(matrix, bounds, axis=1) if bounds else [matrix]
    return [p.reshape(-1)[:size].reshape(shape) for p, size, shape in zip(parts, sizes, shapes)]


def clip_by_global_norm(grad_slices, max_norm: float, group):
    """Scale sharded gradients so their global norm (over `group`) is at most max_norm.
    Returns (gradients, norm before clipping). Squares are summed in float32."""
    local = tree_reduce(lambda acc, g: acc + g.astype(mx.float32).square().sum(), grad_slices, mx.array(0.0))
    norm = mx.sqrt(mx.distributed.all_sum(local, group=group))
    scale = mx.minimum(max_norm / (norm + 1e-6), 1.0)
    return tree_map(lambda g: (g * scale).astype(g.dtype), grad_slices), norm


def fsdp_apply_gradients(gradients, parameters, optimizer, fsdp_group=None, dp_group=None,
                         communication_size=DEFAULT_COMMUNICATION_SIZE, communication_stream=None,
                         max_norm=None):
    """One sharded optimizer step; returns the updated full parameters.

    Args:
        gradients: tree of this rank's (not yet averaged) gradients.
        parameters: tree of the full parameters, identical on every rank; must contain every key of
            `gradients` (extra keys, e.g. frozen parameters, are ignored).
        optimizer: an `mlx.optimizers.Optimizer`; it only ever sees this rank's 1/S slices.
        fsdp_group: group the parameters are sharded over (default: the world).
        dp_group: group of replicas of the same shard (hybrid: shard within fsdp_group, replicate across
            dp_group); gradients are averaged over fsdp_group.size() * dp_group.size() ranks.
        communication_size: bucket size in bytes (<= 0: one collective per array).
        communication_stream: stream for the MLX collectives.
        max_norm: if given, clip the averaged gradients to this global norm first.

    Returns:
        Without max_norm, the tree of updated parameters (the gradients' tree structure: the same as
        `parameters` when every parameter is trained). With max_norm, a tuple
        `(updated_parameters, grad_norm)`, grad_norm being the global norm of the averaged gradients
        before clipping (a scalar mx.array). This is MLX's convention.
    """
    fsdp_group = fsdp_group if fsdp_group is not None else world_group()
    shards = fsdp_group.size()
    world = shards * (dp_group.size() if dp_group is not None else 1)
    flat_grads = tree_flatten(gradients)
    params_by_key = dict(tree_flatten(parameters))
    missing = [k for k, _ in flat_grads if k not in params_by_key]
    if missing:
        raise ValueError(f"fsdp_apply_gradients: no parameter for gradient(s) {', '.join(missing[:5])}")
    flat_params = [(k, params_by_key[k]) for k, _ in flat_grads]

    if world == 1:
        gradients = tree_unflatten(flat_grads)       # the same tree as the parameters (no empty modules)
        grads_norm = None
        if max_norm is not None:
            gradients, grads_norm = clip_by_global_norm(gradients, max_norm, fsdp_group)
        updated = optimizer.apply_gradients(gradients, tree_unflatten(flat_params))
        return updated if max_norm is None else (updated, grads_norm)

    builtin = _mlx_builtin(flat_grads, fsdp_group)
    if builtin is not None:
        return builtin(gradients, tree_unflatten(flat_params), optimizer, fsdp_group=fsdp_group,
                       dp_group=dp_group, communication_size=communication_size,
                       communication_stream=communication_stream, max_norm=max_norm)

    keys = [k for k, _ in flat_grads]
    grads = [g for _, g in flat_grads]
    params = [p for _, p in flat_params]
    rank = fsdp_group.rank()

    grad_slices = [None] * len(keys)
    for bucket in plan_buckets([g.size for g in grads], [g.dtype for g in grads], shards, communication_size):
        packed = pack_rows([grads[i] for i in bucket.indices], shards)
        row = reduce_scatter(packed, fsdp_group, stream=communication_stream).reshape(-1) / world
        if dp_group is not None and dp_group.size() > 1:
            row = mx.distributed.all_sum(row, group=dp_group, stream=communication_stream)
        for i, part in zip(bucket.indices, split_row(row, [grads[i].size for i in bucket.indices], shards)):
            grad_slices[i] = part.astype(grads[i].dtype)
    param_slices = [local_chunk(p, shards, rank) for p in params]

    grad_tree = tree_unflatten(list(zip(keys, grad_slices)))
    grad_norm = None
    if max_norm is not None:
        grad_tree, grad_norm = clip_by_global_norm(grad_tree, max_norm, fsdp_group)
    updated = dict(tree_flatten(optimizer.apply_gradients(grad_tree, tree_unflatten(list(zip(keys, param_slices))))))

    new_flat = [None] * len(keys)
    for bucket in plan_buckets([p.size for p in params], [p.dtype for p in params], shards, communication_size):
        row = mx.concatenate([updated[keys[i]].astype(bucket.dtype) for i in bucket.indices])
        gathered = mx.distributed.all_gather(row[None], group=fsdp_group, stream=communication_stream)
        shapes = [params[i].shape for i in bucket.indices]
        for i, full in zip(bucket.indices, unpack_rows(gathered, shapes, shards)):
            new_flat[i] = (keys[i], full)
    result = tree_unflatten(new_flat)
    return result if max_norm is None else (result, grad_norm)


def local_chunk(param: mx.array, shards: int, rank: int) -> mx.array:
    """Rank `rank`'s 1-D slice of `param` (row-major, zero-padded to shards x chunk)."""
    chunk = chunk_size(param.size, shards)
    flat = param.reshape(-1)[rank * chunk:(rank + 1) * chunk]
    short = chunk - flat.size
    return mx.concatenate([flat, mx.zeros((short,), dtype=param.dtype)]) if short else flat


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _mlx_builtin(flat_grads, fsdp_group):
    """MLX's own fsdp_apply_gradients when this MLX has it and the call is one it can do, else None."""
    builtin = getattr(mlx.nn, "fsdp_apply_gradients", None)
    if builtin is None:
        return None
    shards = fsdp_group.size()
    dtypes = {g.dtype for _, g in flat_grads}
    divisible = all(g.ndim > 0 and g.shape[0] % shards == 0 for _, g in flat_grads)
    if len(dtypes) != 1 or not divisible or reduce_scatter_method(fsdp_group) != "native":
        return None
    return builtin


# ---- fsdp's step: what the strategies' registry entry for fsdp makes (strategies.FullySharded) ----------

def fsdp_apply(model, optimizer, config, group):
    """fsdp's update alone: fsdp_apply_gradients reduce-scatters the gradients, updates this rank's slices and
    gathers the parameters back. It stays outside mx.compile because on mpi its reduce-scatter goes through
    mpi4py, which evaluates eagerly."""
    def apply(loss, grads):
        parameters, norm = fsdp_apply_gradients(grads, model.trainable_parameters(), optimizer,
                                                fsdp_group=group, max_norm=config.max_norm or math.inf)
        model.update(parameters)
        return mean_over_ranks(loss, group), norm

    return apply


def make_fsdp_step(model, optimizer, config, group):
    """Sharded optimizer state: the gradient computation is compiled, the update is fsdp_apply's."""
    state = [model.state, mx.random.state]
    grads_of = mx.compile(partial(accumulated_grads, model), inputs=state, outputs=state)
    apply = fsdp_apply(model, optimizer, config, group)

    def step(*batch):
        return apply(*grads_of(*batch))

    return step
