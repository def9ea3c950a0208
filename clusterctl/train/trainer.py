"""The bundled trainer, in MLX: a small Llama-style LM of its own or a model the user has (--model, lm.py), trained
data-parallel (dp; --balance: shares by speed), fully sharded (fsdp) or ZeRO-3 (zero3), --strategy auto by memory.

Launch (every rank runs this same program; rank 0 reports; mlx.launch needs the explicit `python`, see
docs/facts/launchers.md#mlx-launch-does-not-prepend-python):

    python -m clusterctl.train                                                # one process, preset by device
    python -m clusterctl.train --preset small --steps 300                     # a named size, fewer steps
    mlx.launch -n 2 --backend ring -- python -m clusterctl.train --steps 300  # 2 ranks, ring (TCP)
    mpirun -np 2 python -m clusterctl.train --strategy fsdp                   # 2 ranks, MPI
    clusterctl run --hosts inventory.yaml -- --data shards/ --steps 2000      # a cluster (see docs/run.md)

Ctrl-C (SIGINT) or SIGTERM stops every rank after the step it is in, with a checkpoint (exit 130 / 143; a second
one stops at once), and a checkpoint is also written every --ckpt-minutes of training (stopping.py).
Resume after a crash or kill with `--resume latest --out DIR` (or `--resume DIR`); the continued run's loss
at each step equals what the uninterrupted run's would have been: the data position is the step (batches
are a pure function of seed, rank and step), and the checkpoint holds the parameters, the AdamW state and
step count, and every rank's random state.

`train(argv)` sets a run up from its flags (world, run directory, resume, data, model, optimizer) and hands
it to `fit(model, optimizer, data, config, callbacks)`, the loop, which reports, evaluates and checkpoints
only through its callbacks (callbacks.py).
"""
from __future__ import annotations

import dataclasses
import errno
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import mlx.core as mx

from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, ClusterctlError, DataError
from ..trainer_contract import CHECKPOINTS, STEP_GLOB, step_dir_name
from . import adapters, checkpoint, collectives, memory, presets, randomstate, stepdirs, strategies, testset
from .testset import evaluate
from .balanced import BalancedSteps, OutOfSync, check_sync, perturb, perturbation, slowdown, step_floor
from .callbacks import (Callback, Callbacks, Checkpointing, Progress, Reporting, Stoppable, TrainerSummary,
                        announce_quiet, watched)
from .config import ConfigError, TrainConfig, default_out_dir, resolve, resolve_settings
from .finetune import model_source
from .metrics import Reporter
from .model import ModelArgs, Transformer
from .step import cast_model, make_optimizer
from .stopping import Stopped, Stopping, ignore_stop_signals

if TYPE_CHECKING:
    from ..data.loader import BatchLoader


def init_world():
    """The world group, failing loudly when it is not the size the launcher started (MLX can silently fall
    back to a world of one: docs/facts/mlx-distributed.md#world-of-one-fallback). The launcher's size is
    CLUSTERCTL_WORLD_SIZE (clusterctl run), else mpirun's. The backend is the one `clusterctl run` started
    the ranks for (CLUSTERCTL_BACKEND), else MLX's own choice."""
    expected = None
    if not os.environ.get("CLUSTERCTL_WORLD_SIZE") and os.environ.get("OMPI_COMM_WORLD_SIZE", "").isdigit():
        expected = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    return collectives.init_world(os.environ.get("CLUSTERCTL_BACKEND") or "any", expected=expected)


def device_kind(group) -> str:
    """Rank 0's MLX default device type, 'gpu' or 'cpu', on every rank: what picks the preset when none is
    given. Rank 0's for all, so that Macs (GPU) and Linux boxes (CPU) in one job still build one model."""
    return "gpu" if checkpoint.int_from_rank0(int(mx.default_device() == mx.gpu), group) else "cpu"


def resolve_run(config: TrainConfig, how: str, argv: list[str] | None, group, device: str):
    """(config, how its preset was chosen, run directory, checkpoint, its state). Resuming, the
    config is read again over the checkpoint's (flags still win, and its preset beats the device's); not
    resuming, a directory that holds checkpoints is refused."""
    if config.resume == "latest" and not config.out and not os.environ.get("CLUSTERCTL_RUN_DIR"):
        raise ConfigError("--resume latest needs --out DIR (the run to continue)")
    out_dir = out_dir_for(config, group)
    config = restart_resume(config, out_dir, group)
    if not config.resume:
        if list(Path(out_dir, "checkpoints").glob(STEP_GLOB)):
            raise ConfigError(f"{out_dir} already holds checkpoints: continue it with --resume latest --out "
                              f"{out_dir}, or train into another --out")
        return config, how, out_dir, None, None
    ckpt = stepdirs.resolve(config.resume, out_dir)
    resumed = stepdirs.read_state(ckpt)
    config, how = resolve(argv, resumed["config"], device)     # flags still win over the checkpoint
    if config.strategy == strategies.AUTO:                     # the strategy the checkpoint was written with
        config = dataclasses.replace(config, strategy=resumed["strategy"])
    strategies.check_resume(resumed, config.strategy, group.size(), ckpt)
    config = elastic_batch(config, resumed, group.size(), os.environ.get("CLUSTERCTL_ELASTIC_BATCH", "rank"))
    if not config.out and config.resume != "latest" and not os.environ.get("CLUSTERCTL_RUN_DIR"):
        out_dir = str(ckpt.parent.parent)                      # keep writing into the run that was resumed
    return config, how, out_dir, ckpt, resumed


def restart_resume(config: TrainConfig, out_dir: str, group) -> TrainConfig:
    """A restart by `clusterctl run --max-restarts` (CLUSTERCTL_RESTART >= 1) continues from the newest
    checkpoint of this run that any rank holds; with none yet, it starts as the first attempt did."""
    if not os.environ.get("CLUSTERCTL_RESTART", "0").strip("0"):
        return config
    step = checkpoint.newest_step_everywhere(out_dir, group)
    if not step:
        return config
    ckpt = Path(out_dir, "checkpoints", step_dir_name(step))
    if not (ckpt / "state.json").is_file():
        raise ConfigError(f"rank {group.rank()}: the restart continues from {ckpt}, which another rank wrote "
                          "but this host does not hold (was it away when it was written?)")
    return dataclasses.replace(config, resume=str(ckpt))


def elastic_batch(config: TrainConfig, resumed: dict, world: int, policy: str) -> TrainConfig:
    """After a DP world change (an elastic restart on fewer or more hosts): `rank` keeps each rank's batch
    (the global batch follows the world); `global` keeps the global batch by changing --accum, which needs
    the checkpoint's global micro-batch count (accum x world) to divide by the new world."""
    before = resumed["world_size"]
    if before == world or policy != "global":
        return config
    total = int(resumed["config"].get("accum", config.accum)) * before
    if total % world:
        raise ConfigError(f"--elastic-batch global: the global batch is {total} micro-batches per step (accum "
                          f"x {before} ranks), which {world} ranks cannot share equally; use --elastic-batch rank")
    return dataclasses.replace(config, accum=total // world)


def plan_memory(config: TrainConfig, vocab_size: int, group, model_config: dict | None = None,
                rows: tuple[int, int] | None = None, out_dir: str | None = None) -> TrainConfig:
    """The strategy to train with (`auto`: the cheapest whose estimate fits the smallest host), or
    MemoryRefused with the numbers (--memory-check off: a warning instead). Rank 0 says what it planned. With
    `out_dir` (a run that writes checkpoints), this rank's disk is checked for them too (plan_disk)."""
    if out_dir is not None:
        plan_disk(config, memory.Shape.of(config, vocab_size, model_config, rows), out_dir)
    mine = memory.host_memory()
    known = mine if mine is not None else -1
    units = memory.in_exchanged_units(known) if known >= 0 else -1
    smallest = int(mx.distributed.all_min(mx.array(units, dtype=mx.int32), group=group,
                                          stream=mx.cpu).item()) if group.size() > 1 else units
    host = smallest * memory.EXCHANGED if smallest >= 0 else None
    shape = memory.Shape.of(config, vocab_size, model_config, rows)
    try:
        strategy = strategies.choose(shape, config.strategy, group.size(), host)
    except memory.MemoryRefused as e:
        if config.memory_check == "on":
            raise
        strategy = strategies.choose(shape, config.strategy, group.size(), None)
        if group.rank() == 0:
            print(f"warning (--memory-check off): {e}", flush=True)
    if group.rank() == 0:
        est = strategies.estimate(shape, strategy, group.size())
        chose = f"{strategy} (chosen by --strategy auto)" if config.strategy == strategies.AUTO else strategy
        where = (f"; the smallest host has {memory.gb(host)}, {memory.gb(memory.usable(host))} usable"
                 if host is not None else "")
        others = ", ".join(f"{s} {memory.gb(strategies.estimate(shape, s, group.size()).total)}"
                           for s in strategies.names() if s != strategy)
        print(f"memory: about {memory.gb(est.total)} per rank under {chose} at world {group.size()} ({others}){where}",
              flush=True)
    return dataclasses.replace(config, strategy=strategy)


def plan_disk(config: TrainConfig, shape, out_dir: str) -> None:
    """Refuse (NoSpace, one line naming the directory) a run whose checkpoints cannot fit in the free space of
    this rank's disk: the most it holds at once (memory.checkpoints_held) less those already there (a resumed
    run's), each as memory.checkpoint_bytes says; under twice that, a warning. --memory-check off: a warning
    instead of the refusal. Every rank checks its own disk (docs/trainer.md#checkpoint-space)."""
    import shutil

    from ..errors import NoSpace

    root = os.path.join(out_dir, CHECKPOINTS)
    where = next(p for p in (root, out_dir, os.path.dirname(os.path.abspath(out_dir)), "/") if os.path.isdir(p))
    each = memory.checkpoint_bytes(shape, config.optimizer)
    held = memory.checkpoints_held(config.steps, config.ckpt_every, config.keep)
    need, free = max(held - len(stepdirs.steps_in(root)), 1) * each, shutil.disk_usage(where).free
    if free >= 2 * need:
        return
    mib = checkpoint.mib
    text = (f"not enough free space for this run's checkpoints in {os.path.abspath(root)}: {mib(free)} free, "
            f"they need about {mib(need)} ({held} at most at once, --keep {config.keep or 'all'} and one being "
            f"written, {mib(each)} each)")
    if free < need and config.memory_check == "on":
        raise NoSpace(f"{text}: free space there, or lower --keep or raise --ckpt-every (--memory-check off: try "
                      "anyway)")
    print(f"warning: {text.replace('not enough', 'little')}: a checkpoint may not fit later", flush=True)


def out_dir_for(config: TrainConfig, group) -> str:
    if config.out:
        return config.out
    if os.environ.get("CLUSTERCTL_RUN_DIR"):
        return os.environ["CLUSTERCTL_RUN_DIR"]
    # Every rank must pick the same ./runs/train-<timestamp>: use rank 0's clock.
    epoch = 1_600_000_000
    now = checkpoint.int_from_rank0(int(time.time()) - epoch, group) + epoch
    return default_out_dir(time.localtime(now))


def open_data(config: TrainConfig, rank: int, world: int):
    """(tokenizer, vocab_size, train tokens, val tokens) for this rank: its shard, or its share of a corpus."""
    from ..data.loader import rank_tokens
    from ..data.tokenizer import load_tokenizer

    if config.data:
        from ..data.shards import read_manifest

        manifest = read_manifest(config.data)
        tokenizer, vocab_size = load_tokenizer(manifest.tokenizer, base_dir=config.data), manifest.vocab_size
    else:
        tokenizer = load_tokenizer(config.tokenizer)
        vocab_size = tokenizer.vocab_size
    train, val = rank_tokens(rank, world, data_dir=config.data, source=config.source, tokenizer=tokenizer,
                             seed=config.seed)
    for name, tokens in (("training", train), ("held-out", val)):
        if len(tokens) <= config.block_size:
            raise DataError(f"rank {rank}: only {len(tokens)} {name} tokens, fewer than --block-size "
                            f"{config.block_size} + 1: give more data, or a smaller --block-size")
    return tokenizer, vocab_size, train, val


def portable_spec(tokenizer) -> dict:
    """The tokenizer spec with an absolute path, so `clusterctl generate` finds it from any directory."""
    spec = dict(tokenizer.spec())
    if spec.get("path"):
        spec["path"] = os.path.abspath(spec["path"])
    return spec


def rank_seed(seed: int, rank: int) -> int:
    """Each rank's own random stream (dropout) after the shared initialisation."""
    return (seed + 1) * 1_000_003 + rank


def restore(ckpt, resumed: dict, model, optimizer, config: TrainConfig, rank: int, world: int) -> int:
    """Load parameters, optimizer state and this rank's random key; returns the step to continue from."""
    strategies.get(config.strategy).read(ckpt, model, optimizer, rank, world)
    keys = resumed["rng"]
    if len(keys) == world:
        randomstate.restore_random_state(keys[rank])
    else:      # DP on another world size: the data split changes too, so the batches differ from here
        mx.random.seed(rank_seed(config.seed, rank))
        if rank == 0:
            print(f"note: {ckpt} was written by {len(keys)} rank(s), this run has {world}: it continues from "
                  f"the same parameters and optimizer state, not the same batches", flush=True)
    return resumed["step"]


@dataclass(frozen=True)
class TrainData:
    """What fit reads besides the model: this rank's batches, the ranks they are split over, and how many
    optimizer steps the run has already taken (the data position: batches are a function of the step).
    With balancing on (more than one rank, --balance not off) a rank may also train on rows of another rank's
    shard: `shards(k)` is shard k's loader, and `rows` the shares a resumed run continues with."""
    train: BatchLoader          # micro-batch i of this rank is train.batch(i)
    val: BatchLoader            # the held-out loss reads val.batch(0 .. eval_batches - 1)
    group: mx.distributed.Group
    start: int = 0
    shards: Callable[[int], BatchLoader] | None = None
    rows: list[int] | None = None


def fit(model, optimizer, data: TrainData, config: TrainConfig, callbacks: Callback | None = None) -> None:
    """Train optimizer steps data.start + 1 .. config.steps. Every rank calls this with the same config; the
    callbacks hear of every step, report, held-out loss and checkpoint (see callbacks.py for when). A first
    SIGINT or SIGTERM stops every rank after the step it is in, with a checkpoint: Stopped is raised
    (stopping.py)."""
    callbacks = Callback() if callbacks is None else callbacks
    mx.eval(model.parameters(), optimizer.state)
    group, rank = data.group, data.group.rank()
    drift = perturbation()                   # a test aid: (rank, step) or None
    balanced = None
    entry = strategies.get(config.strategy)
    slow, slow_from, slow_until = slowdown()
    floor = step_floor()                     # a test aid: every step lasts at least this many seconds
    # the test aid slows the bundled model's even split too (balancing measures it); a fine-tune's step, whose loader
    # the balanced steps cannot feed, sleeps after it instead (below)
    if entry.replicated and group.size() > 1 and not config.model and (config.balance != "off" or slow > 1):
        balanced = BalancedSteps(model, optimizer, config, group, data.shards or _own_shard(data), data.start,
                                 data.rows)
        callbacks.on_shares(data.start, balanced.info())
    else:
        step_fn = entry.make_step(model, optimizer, config, group)
    stopping = Stopping(config.ckpt_minutes * 60, group)
    with stopping.request:                   # SIGINT / SIGTERM: finish the step, checkpoint, stop (stopping.py)
        for step in range(data.start, config.steps):
            stopping.step_begins()
            began = time.perf_counter()
            if balanced is not None:
                loss, grad_norm = balanced(step)
                mx.eval(loss, grad_norm, model.state, optimizer.state)
            else:
                loss, grad_norm = step_fn(*data.train.step(step, config.accum))
                mx.eval(loss, grad_norm, model.state, optimizer.state)
                if slow > 1 and slow_from <= step + 1 < slow_until:      # the test aid: a machine `slow` times slower
                    time.sleep((slow - 1) * (time.perf_counter() - began))
            if floor:
                time.sleep(max(0.0, floor - (time.perf_counter() - began)))
            if config.clear_cache_threshold and mx.get_cache_memory() > config.clear_cache_threshold:
                mx.clear_cache()
            done = step + 1
            last = done == config.steps
            if drift == (rank, done) and entry.replicated:
                perturb(model)
            if balanced is not None and balanced.exchanged == done:
                callbacks.on_shares(done, balanced.info())
            callbacks.on_step(done, loss, grad_norm)
            stop, due = stopping.poll()      # every rank the same answer: one all_max
            if (within := stopping.offer()) is not None:
                callbacks.on_stoppable(done, within)
            if done % config.report_every == 0 or last or step == data.start or stop:   # the first step shows the start
                callbacks.on_report(done, optimizer.learning_rate.item())
            # before a checkpoint keeps a drift
            if config.check_sync and entry.replicated and (done % config.check_sync == 0 or last):
                try:
                    check_sync(model, group, done)
                except OutOfSync as e:
                    callbacks.on_out_of_sync(done, e.ranks, str(e))
                    raise
            with callbacks.paused():
                if (config.eval_every and done % config.eval_every == 0 and not stop) or last:
                    callbacks.on_quiet(done, "evaluation")
                    callbacks.on_eval(done, evaluate(model, data.val, config.eval_batches, data.group,
                                                              entry.loss))
                if (config.ckpt_every and done % config.ckpt_every == 0) or last or due or stop:
                    started = time.monotonic()
                    callbacks.on_quiet(done, "checkpoint")
                    callbacks.on_checkpoint(done)
                    stopping.checkpointed(started)
            if stop and not last:
                callbacks.on_stopped(done, stop)
                raise Stopped(stop, done)
        callbacks.on_stoppable(config.steps, 0)     # what follows the loop (an export) is not stopped so


def _own_shard(data: TrainData):
    """Without other shards at hand (fit called directly): every row is this rank's own."""
    def loader(k: int):
        if k != data.group.rank():
            raise ConfigError(f"rank {data.group.rank()} was given no loader for shard {k}, which balancing needs")
        return data.train
    return loader


def shard_loaders(config: TrainConfig, rank: int, world: int, own: BatchLoader, tokenizer):
    """Shard k's loader, opened the first time a rank trains on one of its rows (balancing: a faster rank
    takes rows over from slower ranks' shards). Prepared shards must then be on this host too."""
    from ..data.loader import BatchLoader, rank_tokens
    from ..errors import ShardError

    opened = {rank: own}

    def loader(k: int) -> BatchLoader:
        if k not in opened:
            try:
                train, _ = rank_tokens(k, world, data_dir=config.data, source=config.source,
                                       tokenizer=tokenizer, seed=config.seed)
            except ShardError as e:
                raise ShardError(f"rank {rank} takes over rows of rank {k}'s shard (--balance) and cannot read it: "
                                 f"{e}; send every shard to every host (clusterctl data push --all-shards) or "
                                 "pass --balance off") from None
            opened[k] = BatchLoader(train, config.batch_size, config.block_size, config.seed, k)
        return opened[k]

    def readable() -> bool:
        """Whether this rank can read every shard: always from a corpus (it tokenizes what it takes over);
        prepared shards only where every shard file is on this host (run --all-shards, data push --all-shards)."""
        if not config.data:
            return True
        from ..data.shards import read_manifest
        return all(os.path.isfile(os.path.join(config.data, s.file)) for s in read_manifest(config.data).shards)

    loader.readable = readable
    return loader


def train(argv: list[str] | None = None) -> None:
    """One rank's run: flags, world, run directory and resume, data, model and optimizer, then fit."""
    resolve(argv)                                              # bad flags fail before the world forms
    announce_quiet()                                           # loading, restoring: no step for a while
    group = init_world()
    rank, world = group.rank(), group.size()
    device = device_kind(group)
    config, how = resolve(argv, device=device)
    config, how, out_dir, ckpt, resumed = resolve_run(config, how, argv, group, device)
    if config.model:
        sources = resolve_settings(argv, resumed["config"] if resumed else None, device).sources
        return train_model(config, group, out_dir, ckpt, resumed, sources)
    tokenizer, vocab_size, train_tokens, val_tokens = open_data(config, rank, world)
    config = plan_memory(config, vocab_size, group, out_dir=out_dir)     # before anything is allocated

    mx.random.seed(config.seed)                                # identical initial parameters on every rank
    model = Transformer(ModelArgs.from_config(config, vocab_size))
    if config.precision != "float32":
        cast_model(model, config.precision)
    model = strategies.get(config.strategy).wrap(model, group, config)     # zero3: each rank keeps 1/N of it
    optimizer = make_optimizer(config)
    start = start_step(ckpt, resumed, model, optimizer, config, rank, world)

    from ..data.loader import BatchLoader

    own = BatchLoader(train_tokens, config.batch_size, config.block_size, config.seed, rank)
    data = TrainData(train=own,
                     val=BatchLoader(val_tokens, config.batch_size, config.block_size, config.seed + 1, rank),
                     group=group, start=start, shards=shard_loaders(config, rank, world, own, tokenizer),
                     rows=resumed.get("balance", {}).get("rows") if resumed else None)
    described = presets.describe(config.training_dict(), how, strategies.get(config.strategy).count(model))
    run_fit(model, optimizer, data, config, out_dir, (portable_spec(tokenizer), vocab_size), described,
            f"{len(train_tokens):,} training tokens on rank 0", ckpt)


def train_model(config: TrainConfig, group, out_dir: str, ckpt, resumed, sources: dict) -> None:
    """--model: fine-tune an mlx-lm model on jsonl records (finetune.py), then write it as an mlx-lm model directory,
    <run>/model (export.py), or its adapters as <run>/adapters, which `clusterctl run` fetches with the run
    (docs/finetune.md). With --test alone (mlx-lm's meaning) the adapters given are scored, nothing trained."""
    from . import finetune, lm
    from .config import settings_block
    from .export import export

    rank, world = group.rank(), group.size()
    if config.balance == "auto":        # the records of a step are split evenly: the global order (data/records.py)
        config = dataclasses.replace(config, balance="off")
    source = model_source(config, rank)
    model_config = lm.read_config(source)
    tokenizer = lm.load_tokenizer(source, config.trust_remote_code == "on")
    data = finetune.open_records(config, tokenizer, rank, world)     # before the plan: it needs the rows' width
    share = data.train.share
    training = config.train == "on" or (config.train is None and config.test != "on")
    planned = plan_memory(config, lm.vocab_size(model_config), group, model_config, rows=(share, data.width),
                          out_dir=out_dir if training else None)
    if planned.strategy != config.strategy:
        sources["strategy"] = f"{config.strategy}: the memory plan's choice"
    config = planned
    # mlx-lm's rule: --test given without --train only scores (the adapters of --adapter-path, if any)
    model, _, model_config = lm.load(source, getattr(mx, config.precision), config.adapter, tokenizer=tokenizer,
                                     scored_only=not training)
    entry = strategies.get(config.strategy)
    finetune.choose_packing(model, data, lm.vocab_size(model_config), entry.shards_weights, rank)
    if not training:
        finetune.scored_adapters(model, config, rank)
    elif config.adapter:            # the base frozen, the adapters made the same on every rank
        mx.random.seed(config.seed)
        adapters.apply(model, config)
        finetune.start_adapters(model, config, rank)
    if config.grad_checkpoint == "on":
        lm.checkpoint_blocks(model)
    model = entry.wrap(model, group, config, model_config["model_type"])
    if rank == 0:
        print(settings_block(config, sources), flush=True)
    if training:
        optimizer = make_optimizer(config)
        start = start_step(ckpt, resumed, model, optimizer, config, rank, world)
        spec = {"type": "mlx-lm", "path": os.path.abspath(source)}
        base = lm.quantization(model_config)
        trained = (f"{config.adapter} adapters of rank {config.lora_rank}, {adapters.count_trainable(model) / 1e6:.3f}M"
                   f" parameters trained, the base frozen{f' ({base})' if base else ''}" if config.adapter
                   else f"trained in {config.precision}")
        described = (f"model {config.model} ({model_config['model_type']}, {entry.count(model) / 1e6:.2f}M "
                     f"parameters, {trained}), {config.steps} steps at lr {config.lr:g}")
        run_fit(model, optimizer, TrainData(train=data.train, val=data.val, group=group, start=start), config, out_dir,
                (spec, lm.vocab_size(model_config)), described, data.summary, ckpt, data.train.step_tokens)
    if data.test is not None:
        tested = testset.score(model, data.test, config.test_batches, group, entry.loss)
        if rank == 0:
            testset.record(out_dir, config.steps if training else 0, tested)
    if rank == 0 and training and config.adapter:
        path = adapters.publish(out_dir, config.adapter_path)
        print(f"adapters: {path} (mlx-lm's adapter layout: mlx_lm.generate --model {shlex.quote(config.model)} "
              f"--adapter-path {shlex.quote(str(path))}; clusterctl export fuses them into a model)", flush=True)
    elif rank == 0 and training:
        path = export(out_dir, os.path.join(out_dir, "model"), search=[os.getcwd()], source=source)
        print(f"model: {path} (an mlx-lm model directory: mlx_lm.generate --model {shlex.quote(str(path))})", flush=True)


def start_step(ckpt, resumed, model, optimizer, config: TrainConfig, rank: int, world: int) -> int:
    """The step to continue from: a checkpoint's (restored into model and optimizer), else 0 with each rank's
    own random stream seeded (dropout)."""
    if resumed:
        start = restore(ckpt, resumed, model, optimizer, config, rank, world)
    else:
        start = 0
        mx.random.seed(rank_seed(config.seed, rank))           # each rank's own stream (dropout) from here
    if start >= config.steps:
        raise ConfigError(f"{ckpt} is at step {start} and --steps is {config.steps}: nothing to train "
                          f"(pass a larger --steps)")
    return start


def run_fit(model, optimizer, data: TrainData, config: TrainConfig, out_dir: str, tokenizer: tuple[dict, int],
            described: str, what: str, ckpt, tokens_of: Callable[[int], int] | None = None) -> None:
    """fit with the reporting, checkpointing and summary callbacks; rank 0 says what it trains first.
    `tokenizer`: (its spec, the vocabulary size), what checkpoints record; `tokens_of(step)`: a step's tokens, every
    rank's (records differ in length), else batch x block x accum x world."""
    group, world = data.group, data.group.size()
    tokens_per_step = tokens_of or config.batch_size * config.block_size * config.accum * world
    listeners = [Reporting(Reporter(out_dir, group, tokens_per_step, data.start), config.steps),
                 Checkpointing(out_dir, model, optimizer, config, group, *tokenizer),
                 TrainerSummary(out_dir, group, config), Stoppable(group, config.steps)]
    if watched():
        listeners.append(Progress(config.steps))
    if group.rank() == 0:
        print(described, flush=True)
        per_step = f"{tokens_per_step:,} tokens per step" if isinstance(tokens_per_step, int) else (
            f"{config.batch_size:,} records per step")
        print(f"{config.strategy} on {world} rank(s): {what}, {per_step}, steps "
              f"{data.start + 1}..{config.steps}, run directory {out_dir}" + (f", resumed from {ckpt}" if ckpt else ""),
              flush=True)
    fit(model, optimizer, data, config, Callbacks(*listeners))


def main(argv: list[str] | None = None) -> int:
    try:
        train(argv)
    except ClusterctlError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # a write of the run's (its metrics, its summary) into a disk that filled: one line, where
        where = os.environ.get("CLUSTERCTL_RUN_DIR") or os.getcwd()
        what = e.filename or where
        print(f"error: no space left on device writing {what} ({_free(where)} free in {where}): free space there "
              "or lower --keep, then --resume latest", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except Stopped as e:           # rank 0 has said so (callbacks.Stoppable)
        ignore_stop_signals()
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return 0


def _free(path: str) -> str:
    import shutil

    try:
        return checkpoint.mib(shutil.disk_usage(path).free)
    except OSError:
        return "unknown"
