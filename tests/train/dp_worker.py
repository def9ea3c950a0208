"""One rank of the DP equivalence runs in tests/train/test_train_multiprocess.py.

    python dp_worker.py OUT_FILE

Trains the trainer's own model with its own compiled DP step (clusterctl.train.step.make_dp_step) for 10
steps on a fixed global batch of GLOBAL_ROWS sequences per micro-batch, 2 micro-batches per step: each of
the N ranks takes its GLOBAL_ROWS / N rows, so 1 rank x batch 2b and 2 ranks x batch b see the same data.
Rank 0 writes the final parameters to OUT_FILE (safetensors) and the per-step losses / grad norms beside it.
"""
import json
import sys

import mlx.core as mx
from mlx.utils import tree_flatten

from clusterctl.train.config import TrainConfig
from clusterctl.train.model import ModelArgs, Transformer
from clusterctl.train.step import make_dp_step, make_optimizer
from clusterctl.train.trainer import init_world

GLOBAL_ROWS, ACCUM, STEPS, VOCAB = 12, 2, 10, 61


def global_batch(step: int, block_size: int) -> mx.array:
    """Step `step`'s micro-batches of the whole world: (ACCUM, GLOBAL_ROWS, block_size + 1) tokens."""
    return mx.random.randint(0, VOCAB, (ACCUM, GLOBAL_ROWS, block_size + 1), key=mx.random.key(step))


def main(out_file: str) -> None:
    group = init_world()
    rank, world = group.rank(), group.size()
    rows = GLOBAL_ROWS // world
    config = TrainConfig(n_layers=2, dim=32, n_heads=2, mlp_dim=64, block_size=16, steps=STEPS, warmup=2,
                         batch_size=rows, accum=ACCUM, lr=1e-2, max_norm=0.3)
    mx.random.seed(0)
    model = Transformer(ModelArgs.from_config(config, VOCAB))
    optimizer = make_optimizer(config)
    step = make_dp_step(model, optimizer, config, group)
    losses, norms = [], []
    for s in range(STEPS):
        tokens = global_batch(s, config.block_size)
        mine = tokens[:, rank * rows:(rank + 1) * rows]
        loss, norm = step(mine[..., :-1], mine[..., 1:])
        mx.eval(loss, norm, model.state, optimizer.state)
        losses.append(loss.item())
        norms.append(norm.item())
    if rank == 0:
        save(out_file, model, world=world, losses=losses, norms=norms)


def save(out_file: str, model, **log) -> None:
    """Rank 0's results: the parameters (safetensors) and the log beside them (OUT_FILE.json)."""
    mx.save_safetensors(out_file, dict(tree_flatten(model.parameters())))
    with open(out_file + ".json", "w") as f:
        json.dump(log, f)


if __name__ == "__main__":
    main(sys.argv[1])
