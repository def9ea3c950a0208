"""One rank of the balanced-DP equivalence runs in tests/train/test_train_multiprocess.py.

    python balanced_worker.py OUT_FILE BALANCE

The trainer's balanced step (clusterctl.train.balanced.BalancedSteps) with the shares BALANCE (e.g. 3,1) for
STEPS steps on the same global batches as dp_worker.py: per step, ACCUM micro-batches of GLOBAL_ROWS rows
drawn with mx.random.key(step). Shard k holds, for each micro-batch, the rows k*B .. (k+1)*B - 1 of it (B =
GLOBAL_ROWS / world: what rank k reads under the even split), served through a loader with BatchLoader's
interface; a rank whose share is larger takes rows of other shards over. Rank 0 writes the final parameters
to OUT_FILE and the losses / grad norms beside it, as dp_worker.py does.
"""
import sys

import mlx.core as mx

from clusterctl.train.balanced import BalancedSteps
from clusterctl.train.config import TrainConfig
from clusterctl.train.model import ModelArgs, Transformer
from clusterctl.train.step import make_optimizer
from clusterctl.train.trainer import init_world
from dp_worker import ACCUM, GLOBAL_ROWS, STEPS, VOCAB, global_batch, save


class Rows:
    """A 'token file' whose window(start, n) is one row of a global batch: start = micro * GLOBAL_ROWS + row."""

    def __init__(self, block_size):
        self.block_size = block_size

    def window(self, start, length):
        micro, row = divmod(start, GLOBAL_ROWS)
        step, i = divmod(micro, ACCUM)
        assert length == self.block_size + 1
        return global_batch(step, self.block_size)[i, row]


class ShardLoader:
    def __init__(self, shard, rows_per_shard, block_size):
        self.shard, self.rows, self.tokens = shard, rows_per_shard, Rows(block_size)

    def starts(self, micro):
        return [micro * GLOBAL_ROWS + self.shard * self.rows + p for p in range(self.rows)]


def main(out_file: str, shares: str) -> None:
    group = init_world()
    rank, world = group.rank(), group.size()
    rows = GLOBAL_ROWS // world
    config = TrainConfig(n_layers=2, dim=32, n_heads=2, mlp_dim=64, block_size=16, steps=STEPS, warmup=2,
                         batch_size=rows, accum=ACCUM, lr=1e-2, max_norm=0.3, balance=shares)
    mx.random.seed(0)
    model = Transformer(ModelArgs.from_config(config, VOCAB))
    optimizer = make_optimizer(config)
    loaders = {k: ShardLoader(k, rows, config.block_size) for k in range(world)}
    steps = BalancedSteps(model, optimizer, config, group, loaders.__getitem__)
    losses, norms = [], []
    for s in range(STEPS):
        loss, norm = steps(s)
        mx.eval(loss, norm, model.state, optimizer.state)
        losses.append(loss.item())
        norms.append(norm.item())
    if rank == 0:
        save(out_file, model, world=world, rows=steps.rows, losses=losses, norms=norms)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
