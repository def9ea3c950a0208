"""One rank of the FSDP equivalence runs in tests/train/test_fsdp.py (launched by mpirun or mlx.launch).

    python fsdp_worker.py BACKEND OUT_DIR [--hybrid]

Trains a tiny model (two Linear layers and a (5, 3) parameter whose first dimension no world size here
divides) for 10 AdamW steps with data parallel (nn.average_gradients + optimizer.update) and with
fsdp_apply_gradients from the same initial weights and data, with and without max_norm and with one or
several buckets, and writes what the test compares to OUT_DIR/rank-R.json. With --hybrid (4 ranks, mpi):
fsdp groups {0,1} {2,3}, dp groups {0,2} {1,3}, against data parallel over all 4.
"""
import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten

from clusterctl.train.collectives import init_world, reduce_scatter, reduce_scatter_method, split_group
from clusterctl.train.fsdp import fsdp_apply_gradients

STEPS = 10
MAX_NORM = 0.1


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(6, 10)
        self.l2 = nn.Linear(10, 3)
        self.odd = mx.random.normal((5, 3)) * 0.1

    def __call__(self, x):
        return self.l2(nn.relu(self.l1(x))) + x[:, :5] @ self.odd


def batch(step, rank):
    key = mx.random.key(1000 * step + rank)
    kx, ky = mx.random.split(key)
    return mx.random.normal((8, 6), key=kx), mx.random.normal((8, 3), key=ky)


def state_bytes(optimizer):
    return sum(v.nbytes for _, v in tree_flatten(optimizer.state) if v.ndim > 0)


def train(rank, fsdp=None, max_norm=None, dp_group=None, fsdp_group=None, dp_world=None):
    mx.random.seed(0)
    model = Tiny()
    optimizer = optim.AdamW(learning_rate=0.05, weight_decay=0.01)
    loss_grad = nn.value_and_grad(model, lambda x, y: nn.losses.mse_loss(model(x), y))
    norms = []
    for step in range(STEPS):
        _, grads = loss_grad(*batch(step, rank))
        if fsdp is None:
            grads = nn.average_gradients(grads, group=dp_world)
            if max_norm is not None:
                grads, norm = optim.clip_grad_norm(grads, max_norm)
                norms.append(norm.item())
            optimizer.update(model, grads)
        else:
            out = fsdp_apply_gradients(grads, model.parameters(), optimizer, fsdp_group=fsdp_group,
                                       dp_group=dp_group, communication_size=fsdp, max_norm=max_norm)
            if max_norm is not None:
                out, norm = out
                norms.append(norm.item())
            model.update(out)
        mx.eval(model.parameters(), optimizer.state)
    return dict(tree_flatten(model.parameters())), norms, state_bytes(optimizer)


def compare(reference, other):
    worst_abs = worst_rel = 0.0
    for key, ref in reference.items():
        diff = mx.abs(other[key] - ref)
        worst_abs = max(worst_abs, diff.max().item())
        worst_rel = max(worst_rel, (diff / (mx.abs(ref) + 1e-6)).max().item())
    return worst_abs, worst_rel


def check_reduce_scatter(group):
    """reduce_scatter against all_sum + slice for each dtype, on a (2N, 3) array."""
    n, r = group.size(), group.rank()
    results = {}
    for dtype in (mx.float32, mx.float16, mx.bfloat16, mx.int32):
        x = (mx.arange(2 * n * 3).reshape(2 * n, 3) * (r + 1)).astype(dtype)
        got = reduce_scatter(x, group)
        want = mx.distributed.all_sum(x, group=group)[2 * r:2 * r + 2]
        results[str(dtype)] = bool(got.dtype == dtype and got.shape == want.shape and mx.array_equal(got, want).item())
    return results


def main():
    backend, out_dir = sys.argv[1], sys.argv[2]
    hybrid = "--hybrid" in sys.argv
    world = init_world(backend)
    rank = world.rank()
    report = {"rank": rank, "world": world.size(), "method": reduce_scatter_method(world),
              "reduce_scatter": check_reduce_scatter(world)}
    fsdp_group = dp_group = None
    if hybrid:
        fsdp_group = split_group(world, rank // 2)
        dp_group = split_group(world, rank % 2)
        report["fsdp_group"] = [fsdp_group.rank(), fsdp_group.size(), reduce_scatter_method(fsdp_group)]
        report["dp_group"] = [dp_group.rank(), dp_group.size()]
    runs = {}
    for max_norm in (None, MAX_NORM):
        dp_params, dp_norms, dp_state = train(rank, max_norm=max_norm, dp_world=world)
        for size in (32 * 1024**2, 256):     # one bucket; several buckets
            params, norms, state = train(rank, fsdp=size, max_norm=max_norm, fsdp_group=fsdp_group,
                                         dp_group=dp_group)
            worst_abs, worst_rel = compare(dp_params, params)
            runs[f"max_norm={max_norm} communication_size={size}"] = {
                "max_abs": worst_abs, "max_rel": worst_rel, "dp_norms": dp_norms, "fsdp_norms": norms,
                "dp_state_bytes": dp_state, "fsdp_state_bytes": state}
    report["runs"] = runs
    report["param_checksum"] = sum(v.sum().item() for v in dp_params.values())
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(report, f)
    del fsdp_group, dp_group


if __name__ == "__main__":
    main()
