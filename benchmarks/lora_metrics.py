"""`python -m mlx_lm lora ...` with a training callback that prints, on every rank, one JSON line per report:
the rank, the iteration, mlx-lm's own tokens/s (real tokens of every rank, padding left out) and this rank's
`mx.get_peak_memory()` (mlx-lm prints only rank 0's, in GB). bench_finetune.py runs it through `clusterctl run`
beside the bundled trainer. Arguments are mlx-lm lora's."""
import json
import sys

import mlx.core as mx
from mlx_lm import lora
from mlx_lm.tuner.callbacks import TrainingCallback


class Metrics(TrainingCallback):
    def on_train_loss_report(self, info):
        rank = mx.distributed.init().rank()
        print("LORA_METRICS " + json.dumps({"rank": rank, "iteration": info["iteration"],
                                             "loss": info["train_loss"], "tokens_per_s": info["tokens_per_second"],
                                             "trained_tokens": info["trained_tokens"],
                                             "peak_mb": mx.get_peak_memory() / 2**20}), flush=True)


if __name__ == "__main__":
    # lora.run replaces its callback with --report-to's (None by default): ours goes in one call further down
    train_model = lora.train_model
    lora.train_model = lambda args, model, train_set, valid_set, training_callback=None: train_model(
        args, model, train_set, valid_set, Metrics())
    sys.argv = ["mlx_lm.lora", *sys.argv[1:]]
    lora.main()
