"""The optimizer, its learning-rate schedule, and the training steps the strategies make (strategies.py).

A step takes the micro-batches of one optimizer step stacked as (accum, B, L) token arrays, sums their
gradients, combines them across ranks (DP: `nn.average_gradients`, bucketed all_sum; FSDP: the sharded
reduce-scatter update in fsdp.py), clips the global norm and applies AdamW. It returns (loss, grad_norm),
the loss being the mean over every rank's micro-batches.
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
    """Linear warm-up to `lr` over `warmup` steps (step 0 already trains), then cosine decay to `min_lr`
    at the last step. `step` is the optimizer's count of steps taken so far."""
    warmup, peak, floor = config.warmup, config.lr, config.min_lr
    decay_steps = max(config.steps - warmup - 1, 1)

    def schedule(step):
        step = mx.array(step).astype(mx.float32)
        warm = peak * (step + 1) / max(warmup, 1)
        progress = mx.clip((step - warmup) / decay_steps, 0.0, 1.0)
        cosine = floor + 0.5 * (1.0 + mx.cos(math.pi * progress)) * (peak - floor)
        return mx.where(step < warmup, warm, cosine)

    return schedule


class MixedAdamW(optim.AdamW):
    """AdamW for low-precision weights (--precision bfloat16): the moments are float32 whatever the weight's dtype,
    the update is computed in float32 from the float32 weight, and only the result is rounded to the weight's
    dtype. (mlx's own AdamW keeps the moments in the weight's dtype, where bfloat16's 8 bits lose them.)"""

    def init_single(self, parameter: mx.array, state: dict):
        state["m"] = mx.zeros(parameter.shape, dtype=mx.float32)
        state["v"] = mx.zeros(parameter.shape, dtype=mx.float32)

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict):
        updated = super().apply_single(gradient.astype(mx.float32), parameter.astype(mx.float32), state)
        return updated.astype(parameter.dtype)


def make_optimizer(config) -> optim.AdamW:
    kind = MixedAdamW if getattr(config, "precision", "float32") != "float32" else optim.AdamW
    return kind(learning_rate=lr_schedule(config), betas=[config.beta1, config.beta2],
                weight_decay=config.weight_decay, bias_correction=True)


def cast_model(model, precision: str) -> None:
    """The model's floating-point parameters in `precision` (float32 or bfloat16)."""
    dtype = getattr(mx, precision)
    model.update(tree_map(lambda p: p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p,
                          model.parameters()))


def global_norm(grads) -> mx.array:
    return mx.sqrt(tree_reduce(lambda acc, g: acc + g.astype(mx.float32).square().sum(), grads, 0.0))


def accumulated_grads(model, x: mx.array, y: mx.array):
    """Mean loss and gradients over the micro-batches x[i], y[i] (one forward/backward each)."""
    value_and_grad = nn.value_and_grad(model, loss_fn)
    accum = x.shape[0]
    loss, grads = value_and_grad(model, x[0], y[0])
    for i in range(1, accum):
        more_loss, more_grads = value_and_grad(model, x[i], y[i])
        loss = loss + more_loss
        grads = tree_map(mx.add, grads, more_grads)
    if accum > 1:
        loss = loss / accum
        grads = tree_map(lambda g: g / accum, grads)
    return loss, grads


def _mean_over_ranks(value: mx.array, group) -> mx.array:
    if group.size() == 1:
        return value
    return mx.distributed.all_sum(value, group=group) / group.size()


def make_dp_step(model, optimizer, config, group):
    """Replicated data parallelism, compiled as one function over model, optimizer and random state."""
    optimizer.init(model.trainable_parameters())
    state = [model.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y):
        loss, grads = accumulated_grads(model, x, y)
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
    return _mean_over_ranks(loss, group), norm


def dp_apply(model, optimizer, config, group):
    """dp's update alone, (loss, grads) -> (mean loss over the ranks, the norm), compiled over the model's and the
    optimizer's state: for steps that compute their gradients themselves (balanced.BalancedSteps)."""
    optimizer.init(model.trainable_parameters())
    applied = [model.state, optimizer.state]
    return mx.compile(partial(dp_update, model, optimizer, config, group), inputs=applied, outputs=applied)


def fsdp_apply(model, optimizer, config, group):
    """fsdp's update alone: fsdp_apply_gradients reduce-scatters the gradients, updates this rank's slices and
    gathers the parameters back. It stays outside mx.compile because on mpi its reduce-scatter goes through
    mpi4py, which evaluates eagerly."""
    from .fsdp import fsdp_apply_gradients

    def apply(loss, grads):
        parameters, norm = fsdp_apply_gradients(grads, model.trainable_parameters(), optimizer,
                                                fsdp_group=group, max_norm=config.max_norm or math.inf)
        model.update(parameters)
        return _mean_over_ranks(loss, group), norm

    return apply


def make_fsdp_step(model, optimizer, config, group):
    """Sharded optimizer state: the gradient computation is compiled, the update is fsdp_apply's."""
    state = [model.state, mx.random.state]
    grads_of = mx.compile(partial(accumulated_grads, model), inputs=state, outputs=state)
    apply = fsdp_apply(model, optimizer, config, group)

    def step(x, y):
        return apply(*grads_of(x, y))

    return step
