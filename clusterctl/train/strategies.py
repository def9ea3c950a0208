"""The training strategies, one registry entry each: how a rank holds the model and steps it under dp, fsdp and
zero3. Everything the trainer does differently under a strategy is an attribute or a method of its entry; the
rest of train/ asks the registry (`get(name)`, `names()`, `choose(...)`) and never compares strategy names
(tests/unit/test_architecture.py checks it), as launch/backends/ is for MLX's backends.

    entry = get(config.strategy)
    model = entry.wrap(model, group, config, model_type)     # zero3: each rank keeps 1/N of every weight
    step = entry.make_step(model, optimizer, config, group)  # (x, y[, segments]) -> (mean loss over ranks, norm)
    apply = entry.update(model, optimizer, config, group)    # (loss, grads) -> the same: balanced.py's steps
    entry.estimate(shape, world)                             # memory.Estimate, before anything is allocated
    entry.write(tmp, model, optimizer, group, writer, adapter)   # a checkpoint's arrays (checkpoint.save)
    entry.read(ckpt, model, optimizer, rank, world)              # and back (trainer.restore)
    entry.full_parameters(ckpt)                                  # every weight, in one process (export, generate)
    entry.count(model)                                           # the model's parameters, as mlx-lm counts them
    entry.replicated, entry.fixed_world, entry.shards_weights, entry.resize_refusal(written, world)

Each entry's checkpoint format is its own: dp and fsdp write the model whole (checkpoint.py's shared writers),
zero3 writes each rank's slices and a manifest (zero3_checkpoint.py); nothing outside an entry tells the formats
apart. Only the replicated entries (every rank holds the whole model) have `update`, the step's second half that
balanced.py's weighted rows need: `--balance` takes a replicated strategy (config.py checks it).

An entry knows the model it wraps, not how it was made: an adapter run (--adapter) is a model whose base is
frozen, which each entry steps as it steps any model (only the trainable parameters have gradients and optimizer
state), estimates from the shape's adapter_params and base_bytes, and checkpoints as mlx-lm's adapter files
(the adapters whole: what `mlx_lm.generate --adapter-path` reads) rather than as every weight.

REGISTRY's order is `--strategy auto`'s: the least communication first. Adding a strategy is adding an entry
(CONTRIBUTING.md#adding-a-training-strategy). No MLX import here: `clusterctl run` plans on the controller with
`choose` and the estimates; the entries import what they run (step.py, fsdp.py, zero3.py, checkpoint.py) when
they run it.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError, ConfigError
from ..trainer_contract import DEFAULT_STRATEGY
from . import memory
from .memory import (ADAPTER_ACT, BYTES, DP_PARAM, FSDP_ACT, FSDP_FULL, FSDP_ONE, FSDP_SHARD,
                     ZERO3_ACT_BLOCKS, ZERO3_ADAPTER_UNITS, ZERO3_SHARD, ZERO3_UNITS, Estimate, MemoryRefused, Shape)

AUTO = "auto"           # --strategy auto: not an entry, the planner's choice among them (choose)
OPTIMIZER_FILE = "optimizer.safetensors"


class Strategy:
    """What every entry is. The defaults are data parallelism's: every rank holds the whole model and the whole
    optimizer state, and averages the gradients."""

    name: str
    summary: str             # --strategy's help: what each rank holds
    # every rank holds the whole model: its rows may be split by each host's speed (balanced.py, --balance) and
    # the replicas compared (--check-sync); such an entry is a Replicated one, with `update`
    replicated = False
    # why its checkpoints cannot continue on another world size (None: they can; zero3 re-shards on load)
    fixed_world: str | None = None
    shards_weights = False   # each rank keeps 1/N of the weights: what fits when nothing else does

    # -- the model and its step ---------------------------------------------------------------------------
    def wrap(self, model, group, config, model_type: str | None = None):
        """The model as this strategy trains it (`model_type`: an mlx-lm model's, None for the bundled one)."""
        import mlx.core as mx

        mx.eval(model.parameters())
        return model

    def make_step(self, model, optimizer, config, group):
        from .step import make_dp_step
        return make_dp_step(model, optimizer, config, group)

    def loss(self, model, *batch):
        """The mean loss of one batch (x, y[, segments]), nothing updated (held-out and test scores)."""
        from .model import loss_fn
        return loss_fn(model, *batch)

    def trained(self, model):
        """The model object that holds the trained parameters whole (what adapters.save and an export read)."""
        return model

    def count(self, model) -> int:
        """The model's parameter count: the bundled model's own, an mlx-lm model's as mlx-lm counts it (a quantized
        weight as the values it packs)."""
        if hasattr(model, "embedding"):           # the bundled Transformer (model.py)
            from .model import count_parameters
            return count_parameters(model)
        from .lm import total_parameters
        return total_parameters(model)

    # -- memory --------------------------------------------------------------------------------------------
    def estimate(self, shape: Shape, world: int) -> Estimate:
        if shape.adapter_params:
            state, act = self._adapters(shape, world)
        else:
            state, act = self._full(shape, world)
        return Estimate(self.name, world, int(state), int(act))

    def _full(self, shape: Shape, world: int) -> tuple[float, float]:
        p4 = shape.params * BYTES
        per_block, logits = memory.activations(shape)
        return DP_PARAM * p4 + (shape.accum > 1) * p4, memory.blocks_kept(shape, per_block) + logits

    ACTIVATIONS = 1.0        # an adapter run's activations against dp's formula (ADAPTER_ACT aside)

    def _adapters(self, shape: Shape, world: int) -> tuple[float, float]:
        """The frozen base once (no gradient, no optimizer state), the adapters with their gradients and AdamW
        state as dp's parameters are, and the activations of every block, which the adapters' gradients need."""
        per_block, logits = memory.activations(shape)
        return (shape.base_bytes + memory.adapter_state(shape),
                ADAPTER_ACT * self.ACTIVATIONS * (memory.blocks_kept(shape, per_block) + logits))

    # -- checkpoints ---------------------------------------------------------------------------------------
    def optimizer_file(self, rank: int) -> str:
        return OPTIMIZER_FILE

    def write(self, tmp: Path, model, optimizer, group, writer: bool, adapter: dict | None) -> None:
        """This rank's part of a checkpoint into `tmp` (one `writer` per disk writes what every rank holds)."""
        from .checkpoint import save_tree, write_model

        if writer:
            write_model(tmp, self.trained(model), adapter)
            save_tree(tmp / self.optimizer_file(group.rank()), optimizer.state)

    def read(self, ckpt: Path, model, optimizer, rank: int, world: int) -> None:
        from .checkpoint import load_model, load_optimizer

        load_model(ckpt, self.trained(model))
        load_optimizer(ckpt / self.optimizer_file(rank), optimizer)

    def full_parameters(self, ckpt: Path) -> dict:
        """Every parameter a checkpoint of a full (not adapter) run holds, by name (one process: export, generate)."""
        import mlx.core as mx
        return dict(mx.load(str(ckpt / "model.safetensors")))

    def resize_refusal(self, written: int, world: int) -> str | None:
        """Why a checkpoint written by `written` ranks cannot continue on `world` (None: it can)."""
        if written == world or self.fixed_world is None:
            return None
        return f"{self.fixed_world} ({written} ranks), so it cannot resume on {world} (use the same world size)"


class Replicated(Strategy):
    """An entry whose every rank holds the whole model (dp, fsdp)."""

    replicated = True

    def update(self, model, optimizer, config, group):
        """(loss, grads) -> (mean loss over the ranks, the norm): the step's second half, for steps that compute
        their gradients themselves (balanced.py's weighted rows)."""
        from .step import dp_apply
        return dp_apply(model, optimizer, config, group)


class DataParallel(Replicated):
    name = "dp"
    summary = "replicated model, averaged gradients"


class FullySharded(Replicated):
    """The optimizer state sharded over the ranks (fsdp.py); the parameters whole on every rank."""

    name = "fsdp"
    summary = "optimizer state and gradients sharded over the ranks"
    fixed_world = "FSDP's optimizer state is sharded over the ranks that wrote it"
    ACTIVATIONS = FSDP_ACT

    def make_step(self, model, optimizer, config, group):
        from .fsdp import make_fsdp_step
        return make_fsdp_step(model, optimizer, config, group)

    def update(self, model, optimizer, config, group):
        from .fsdp import fsdp_apply
        return fsdp_apply(model, optimizer, config, group)

    def _full(self, shape: Shape, world: int) -> tuple[float, float]:
        p4 = shape.params * BYTES
        per_block, logits = memory.activations(shape)
        state = (FSDP_ONE if world == 1 else FSDP_FULL + FSDP_SHARD / world) * p4 + (shape.accum > 1) * p4
        return state, FSDP_ACT * (memory.blocks_kept(shape, per_block) + logits)

    def optimizer_file(self, rank: int) -> str:
        return f"optimizer-rank-{rank}.safetensors"

    def write(self, tmp: Path, model, optimizer, group, writer: bool, adapter: dict | None) -> None:
        from .checkpoint import save_tree, write_model

        save_tree(tmp / self.optimizer_file(group.rank()), optimizer.state)    # every rank its own slices
        if writer:
            write_model(tmp, model, adapter)


class ZeRO3(Strategy):
    """Parameters (or, for an adapter run, the frozen base), gradients and optimizer state sharded over the
    ranks, each block gathered as it computes (zero3.py). An adapter run's adapters stay whole on every rank,
    stepped and checkpointed as dp's."""

    name = "zero3"
    summary = "the parameters too, each block's weights gathered only while it computes (docs/trainer.md#zero3)"
    shards_weights = True

    def wrap(self, model, group, config, model_type: str | None = None):
        from . import lm
        from .zero3 import ShardedModel

        if model_type is not None and not lm.zero3_units_known(model_type):
            raise ConfigError(f"--strategy zero3 knows how to shard {', '.join(lm.ZERO3_TYPES)} models, not "
                              f"{model_type!r}: use --strategy fsdp or dp (docs/finetune.md#strategies)")
        return ShardedModel(model, group, config.zero3_gather,
                            dropout=config.lora_dropout > 0 if config.adapter else None)

    def make_step(self, model, optimizer, config, group):
        from .zero3 import make_zero3_step
        return make_zero3_step(model, optimizer, config)

    def loss(self, model, *batch):
        return model.loss(*batch)

    def trained(self, model):
        return model.model

    def count(self, model) -> int:
        return model.num_parameters()

    def _full(self, shape: Shape, world: int) -> tuple[float, float]:
        p4, u4 = shape.params * BYTES, shape.largest_unit * BYTES
        per_block, logits = memory.activations(shape)
        state = ZERO3_SHARD * p4 / world + ZERO3_UNITS * u4 + (shape.accum > 1) * p4 / world
        tokens = shape.batch_size * shape.block_size
        return state, shape.n_layers * BYTES * tokens * shape.dim + ZERO3_ACT_BLOCKS * per_block + logits

    def _adapters(self, shape: Shape, world: int) -> tuple[float, float]:
        """1/N of the base, a few spans of the base whole while they compute, zero3's activations."""
        per_block, logits = memory.activations(shape)
        unit = shape.base_bytes * shape.largest_unit / shape.params
        span = min(shape.base_bytes, max(unit, memory.zero3_span(shape.base_bytes)))   # units up to that, or one
        state = shape.base_bytes / world + ZERO3_ADAPTER_UNITS * span + memory.adapter_state(shape)
        act = ADAPTER_ACT * (shape.n_layers * BYTES * shape.batch_size * shape.block_size * shape.dim
                             + ZERO3_ACT_BLOCKS * per_block + logits)
        return state, act

    def write(self, tmp: Path, model, optimizer, group, writer: bool, adapter: dict | None) -> None:
        if model.frozen:            # an adapter run: the adapters and their state whole on every rank, as dp's
            return super().write(tmp, model, optimizer, group, writer, adapter)
        from . import zero3_checkpoint
        zero3_checkpoint.save(tmp, model, optimizer, group, writer)

    def read(self, ckpt: Path, model, optimizer, rank: int, world: int) -> None:
        if model.frozen:
            super().read(ckpt, model, optimizer, rank, world)
            model.adopt_trained()
            return
        from . import zero3_checkpoint
        zero3_checkpoint.load(ckpt, model, optimizer, rank, world)     # re-sharded from the checkpoint's world size

    def full_parameters(self, ckpt: Path) -> dict:
        from . import zero3_checkpoint
        return zero3_checkpoint.full_parameters(ckpt)


REGISTRY: dict[str, Strategy] = {s.name: s for s in (DataParallel(), FullySharded(), ZeRO3())}
assert DEFAULT_STRATEGY in REGISTRY


def names() -> tuple[str, ...]:
    """Every strategy, in `--strategy auto`'s order."""
    return tuple(REGISTRY)


def get(name: str) -> Strategy:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"--strategy {name!r}: one of {', '.join(REGISTRY)} or {AUTO}") from None


def help_text() -> str:
    return "; ".join(f"{e.name}: {e.summary}" for e in REGISTRY.values()) + (
        f"; {AUTO}: the first of {', '.join(REGISTRY)} whose memory estimate fits the hosts.")


def shrink_refusal(name: str | None) -> str | None:
    """Why an --elastic restart cannot continue a run of this strategy on fewer ranks (None: it can, or the name
    is not one: the trainer says so itself). `clusterctl run` asks it through trainer_program.BundledTrainer."""
    entry = REGISTRY.get(name or DEFAULT_STRATEGY)
    if entry is None or entry.fixed_world is None:
        return None
    others = " or ".join(n for n, e in REGISTRY.items() if e.fixed_world is None)
    return (f"--elastic with --strategy {entry.name}: {entry.fixed_world}, so it cannot continue on another world "
            f"size (use --strategy {others}, or drop --elastic: --max-restarts alone restarts on the same hosts)")


def check_resume(state: dict, strategy: str, world: int, ckpt: Path) -> None:
    """CheckpointError unless the checkpoint `state` (its state.json) continues under `strategy` on `world` ranks."""
    if state["strategy"] != strategy:
        raise CheckpointError(f"{ckpt} was written with --strategy {state['strategy']}; resume with the same")
    refusal = get(strategy).resize_refusal(state["world_size"], world)
    if refusal:
        raise CheckpointError(f"{ckpt}: {refusal}")


def estimate(shape: Shape, strategy: str, world: int) -> Estimate:
    return get(strategy).estimate(shape, world)


def choose(shape: Shape, strategy: str, world: int, host_bytes: int | None) -> str:
    """The strategy to train with: `strategy` itself when it fits (or nothing is known of the hosts), the
    first in REGISTRY's order that fits for 'auto'; MemoryRefused, with the numbers and what would fit, otherwise."""
    asked = DEFAULT_STRATEGY if strategy == AUTO else strategy
    if host_bytes is None:
        return asked
    budget = memory.usable(host_bytes)
    fits = [s for s in names() if estimate(shape, s, world).total <= budget]
    if strategy != AUTO and strategy in fits:
        return strategy
    if strategy == AUTO and fits:
        return fits[0]
    need = estimate(shape, asked, world).total
    gb = memory.gb
    have = f"the smallest host has {gb(host_bytes)} ({gb(budget)} usable: {memory.BUDGET:.0%})"
    if fits:
        other = estimate(shape, fits[0], world).total
        hint = f"{fits[0]} at world {world} needs {gb(other)}: pass --strategy {fits[0]} (or --strategy {AUTO})"
    else:
        sharding = next(s for s in names() if REGISTRY[s].shards_weights)
        more = next((n for n in range(world + 1, 257) if estimate(shape, sharding, n).total <= budget), None)
        least = estimate(shape, sharding, world).total
        hint = (f"{sharding} at world {world} needs {gb(least)}; " +
                (f"{sharding} would fit on {more} such hosts" if more else "no number of such hosts fits it") +
                ", or make the model or --batch-size smaller")
    raise MemoryRefused(f"this run needs about {gb(need)} per rank under {asked} at world {world}; {have}; {hint} "
                        "(docs/trainer.md#memory-planning)")
