"""The optimizer, its learning-rate schedule, dp's step and what every strategy's step is made of (fsdp's step is
fsdp.py's, zero3's zero3.py's: strategies.py's entries make them).

A step takes the micro-batches of one optimizer step stacked as (accum, B, L) arrays (tokens, targets and, for
packed records, segments: packing.py), sums their gradients, combines them across ranks (DP:
`nn.average_gradients`, bucketed all_sum; FSDP: the sharded reduce-scatter update in fsdp.py), clips the global
norm and applies the optimizer. It returns (loss, grad_norm), the loss being the mean over every rank's
micro-batches.

The optimizer is made as mlx-lm makes it (its `--optimizer` names MLX's classes, given `optimizer_config`'s
arguments over their own defaults), then the trainer's own flags where given: --beta1/--beta2 (Adam, AdamW),
--weight-decay (AdamW, SGD), --bias-correction (Adam, AdamW; MLX's default is off, mlx-lm keeps it).
"""
from __future__ import annotations

import math
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_map, tree_reduce

from .model import loss_fn


def lr_schedule(config):
    """The learning rate by optimizer step (the optimizer's count of steps taken so far): --lr-schedule cosine:
    linear warm-up to `lr` over `warmup` steps (step 0 already trains), then cosine decay to `min_lr` at the last
    step; constant: the warm-up, then `lr`; a mapping: mlx-lm's lr_schedule (an mlx.optimizers schedule made
    with its `arguments`, after a linear warm-up from `warmup_init` over `warmup` steps), as mlx-lm builds it."""
    if isinstance(config.lr_schedule, dict):
        return mlx_lm_schedule(config.lr_schedule)
    warmup, peak, floor = config.warmup, config.lr, config.min_lr
    decay_steps = max(config.steps - warmup - 1, 1)
    constant = config.lr_schedule == "constant"
    if constant and not warmup:
        return peak

    def schedule(step):
        step = mx.array(step).astype(mx.float32)
        warm = peak * (step + 1) / max(warmup, 1)
        if constant:
            return mx.where(step < warmup, warm, peak)
        progress = mx.clip((step - warmup) / decay_steps, 0.0, 1.0)
        cosine = floor + 0.5 * (1.0 + mx.cos(math.pi * progress)) * (peak - floor)
        return mx.where(step < warmup, warm, cosine)

    return schedule


def mlx_lm_schedule(spec: dict):
    """mlx-lm's lr_schedule: `name` from mlx.optimizers' schedules with `arguments`, after a linear warm-up of
    `warmup` steps from `warmup_init` to the first argument."""
    from ..errors import ConfigError

    make = getattr(optim.schedulers, spec["name"], None)
    if make is None or spec["name"].startswith("_"):
        known = ", ".join(n for n in dir(optim.schedulers) if n.endswith(("_decay", "_schedule")))
        raise ConfigError(f"--lr-schedule: mlx.optimizers has no schedule {spec['name']!r} ({known})")
    try:
        main = make(*spec["arguments"])
    except TypeError as e:
        raise ConfigError(f"--lr-schedule {spec['name']}: {e}") from None
    warmup = int(spec.get("warmup", 0) or 0)
    if not warmup:
        return main
    ramp = optim.schedulers.linear_schedule(float(spec.get("warmup_init", 0.0)), spec["arguments"][0], warmup)
    return optim.schedulers.join_schedules([ramp, main], [warmup + 1])


class Mixed:
    """For low-precision weights (--precision bfloat16): the moments are float32 whatever the weight's dtype, the
    update is computed in float32 from the float32 weight, and only the result is rounded to the weight's dtype.
    (MLX's own Adam and AdamW keep the moments in the weight's dtype, where bfloat16's 8 bits lose them.)"""

    def init_single(self, parameter: mx.array, state: dict):
        state["m"] = mx.zeros(parameter.shape, dtype=mx.float32)
        state["v"] = mx.zeros(parameter.shape, dtype=mx.float32)

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict):
        updated = super().apply_single(gradient.astype(mx.float32), parameter.astype(mx.float32), state)
        return updated.astype(parameter.dtype)


class MixedAdamW(Mixed, optim.AdamW):
    pass


class MixedAdam(Mixed, optim.Adam):
    pass


CLASSES = {"adam": "Adam", "adamw": "AdamW", "muon": "Muon", "sgd": "SGD", "adafactor": "Adafactor"}


def optimizer_arguments(config) -> dict:
    """What the optimizer is made with besides its rate: --optimizer-config's mapping for it, then the trainer's
    own flags where given (None: the optimizer's own default)."""
    args = dict((config.optimizer_config or {}).get(config.optimizer) or {})
    takes_betas = config.optimizer in ("adam", "adamw")
    if takes_betas and (config.beta1 is not None or config.beta2 is not None):
        default = args.get("betas", [0.9, 0.999])
        args["betas"] = [default[0] if config.beta1 is None else config.beta1,
                         default[1] if config.beta2 is None else config.beta2]
    if takes_betas and config.bias_correction is not None:
        args["bias_correction"] = config.bias_correction == "on"
    if config.optimizer in ("adamw", "sgd") and config.weight_decay is not None:
        args["weight_decay"] = config.weight_decay
    return args


def make_optimizer(config):
    """The optimizer --optimizer names, as mlx-lm makes it; AdamW and Adam with low-precision weights keep their
    moments in float32 (Mixed)."""
    from ..errors import ConfigError

    base = getattr(optim, CLASSES[config.optimizer])
    kind = base
    if getattr(config, "precision", "float32") != "float32" and config.optimizer in ("adam", "adamw"):
        kind = MixedAdamW if config.optimizer == "adamw" else MixedAdam
    try:
        return kind(learning_rate=lr_schedule(config), **optimizer_arguments(config))
    except TypeError as e:
        raise ConfigError(f"--optimizer {config.optimizer} with {optimizer_arguments(config)}: {e}") from None


def cast_model(model, precision: str) -> None:
    """The model's floating-point parameters in `precision` (float32 or bfloat16)."""
    dtype = getattr(mx, precision)
    model.update(tree_map(lambda p: p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p,
                          model.parameters()))


def global_norm(grads) -> mx.array:
    return mx.sqrt(tree_reduce(lambda acc, g: acc + g.astype(mx.float32).square().sum(), grads, 0.0))


def accumulated_grads(model, *batch: mx.array):
    """Mean loss and gradients over the micro-batches: batch = (x, y[, segments]), micro-batch i being
    x[i], y[i] (one forward/backward each)."""
    value_and_grad = nn.value_and_grad(model, loss_fn)
    accum = batch[0].shape[0]
    loss, grads = value_and_grad(model, *(b[0] for b in batch))
    for i in range(1, accum):
        more_loss, more_grads = value_and_grad(model, *(b[i] for b in batch))
        loss = loss + more_loss
        grads = tree_map(mx.add, grads, more_grads)
    if accum > 1:
        loss = loss / accum
        grads = tree_map(lambda g: g / accum, grads)
    return loss, grads


def mean_over_ranks(value: mx.array, group) -> mx.array:
    if group.size() == 1:
        return value
    return mx.distributed.all_sum(value, group=group) / group.size()


def make_dp_step(model, optimizer, config, group):
    """Replicated data parallelism, compiled as one function over model, optimizer and random state."""
    optimizer.init(model.trainable_parameters())
    state = [model.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(*batch):
        loss, grads = accumulated_grads(model, *batch)
        return dp_update(model, optimizer, config, group, loss, grads)

    return step


def dp_update(model, optimizer, config, group, loss, grads):
    """Average this rank's gradients over the ranks, clip their global norm, apply AdamW: (mean loss over the
    ranks, the norm). Traced inside a compiled step (make_dp_step, balanced.BalancedSteps)."""
    grads = nn.average_gradients(grads, group=group)  # see docs/facts/mlx-distributed.md#average-gradients-buckets
    if config.max_norm > 0:
        grads, norm = optim.clip_grad_norm(grads, config.max_norm)
    else:
        norm = global_norm(grads)
    optimizer.update(model, grads)
    return mean_over_ranks(loss, group), norm


def dp_apply(model, optimizer, config, group):
    """dp's update alone, (loss, grads) -> (mean loss over the ranks, the norm), compiled over the model's and the
    optimizer's state: for steps that compute their gradients themselves (balanced.BalancedSteps)."""
    optimizer.init(model.trainable_parameters())
    applied = [model.state, optimizer.state]
    return mx.compile(partial(dp_update, model, optimizer, config, group), inputs=applied, outputs=applied)
