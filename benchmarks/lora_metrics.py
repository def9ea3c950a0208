"""`python -m mlx_lm lora ...` with a training callback that prints, on every rank, one JSON line per report:
the rank, the iteration, mlx-lm's own tokens/s (the targets its loss counts, of every rank: under --mask-prompt the
answers alone), the records' real tokens a second (every rank's records, whole, padding left out: what clusterctl's
trainer counts, so the two trainers' figures compare under any setting) and this rank's `mx.get_peak_memory()`
(mlx-lm prints only rank 0's, in GB). bench_finetune.py and bench_lora_speed.py run it through `clusterctl run`
beside the bundled trainer. Arguments are mlx-lm lora's."""
import functools
import json
import sys

import mlx.core as mx
from mlx_lm import lora
from mlx_lm.tuner import trainer
from mlx_lm.tuner.callbacks import TrainingCallback

REAL = {"since_report": 0}        # this rank's records' tokens since the last report


def counting_batches(*args, **kwargs):
    """mlx-lm's own iterate_batches, counting each record's length (its second column: the record's tokens)."""
    for batch, lengths in trainer.iterate_batches(*args, **kwargs):
        REAL["since_report"] += int(lengths[:, 1].sum().item())
        yield batch, lengths


class Metrics(TrainingCallback):
    def on_train_loss_report(self, info):
        group = mx.distributed.init()
        real = mx.distributed.all_sum(mx.array(REAL["since_report"]), stream=mx.cpu).item()
        REAL["since_report"] = 0
        # mlx-lm's iterations a second are steps_per_report over the time of those iterations' steps
        seconds = info["tokens_per_second"] and (info["trained_tokens"] - Metrics.trained) / info["tokens_per_second"]
        Metrics.trained = info["trained_tokens"]
        print("LORA_METRICS " + json.dumps({"rank": group.rank(), "iteration": info["iteration"],
                                             "loss": info["train_loss"], "tokens_per_s": info["tokens_per_second"],
                                             "real_tokens_per_s": real / seconds if seconds else 0.0,
                                             "trained_tokens": info["trained_tokens"],
                                             "peak_mb": mx.get_peak_memory() / 2**20}), flush=True)

    trained = 0


if __name__ == "__main__":
    # lora.run replaces its callback with --report-to's (None by default): ours goes in one call further down
    train_model = lora.train_model
    lora.train_model = lambda args, model, train_set, valid_set, training_callback=None: train_model(
        args, model, train_set, valid_set, Metrics())
    lora.train = functools.partial(lora.train, iterate_batches=counting_batches)
    sys.argv = ["mlx_lm.lora", *sys.argv[1:]]
    lora.main()
