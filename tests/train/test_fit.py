"""trainer.fit called directly, in one process: what its callbacks hear and when, that it learns, and that
a fit resumed from the default Checkpointing callback's checkpoint continues the same curve."""
import math
import os
import signal
import time
from contextlib import contextmanager

import mlx.core as mx
import pytest

from clusterctl.data.loader import BatchLoader
from clusterctl.train import stepdirs
from clusterctl.train.callbacks import Callback, Callbacks, Checkpointing
from clusterctl.train.config import TrainConfig
from clusterctl.train.model import ModelArgs, Transformer
from clusterctl.train.step import lr_schedule, make_optimizer
from clusterctl.train.stopping import STOP_FLOOR_S, Stopped
from clusterctl.train.trainer import TrainData, fit, open_data, rank_seed, restore

SMALL = dict(n_layers=2, dim=32, n_heads=2, mlp_dim=64, block_size=32, batch_size=8, lr=3e-3, warmup=5,
             eval_batches=2)


class Recorder(Callback):
    """Every hook as an event ("step", N) ... in the order fit called them; "pause" / "resume" bracket
    paused(). The values go beside, by step."""

    def __init__(self):
        self.events, self.losses, self.norms, self.lrs, self.val_losses = [], {}, {}, {}, {}

    def on_step(self, step, loss, grad_norm):
        self.events.append(("step", step))
        self.losses[step], self.norms[step] = loss.item(), grad_norm.item()

    def on_report(self, step, lr):
        self.events.append(("report", step))
        self.lrs[step] = lr

    def on_eval(self, step, val_loss):
        self.events.append(("eval", step))
        self.val_losses[step] = val_loss

    def on_checkpoint(self, step):
        self.events.append(("checkpoint", step))

    @contextmanager
    def paused(self):
        self.events.append(("pause",))
        yield
        self.events.append(("resume",))


def setup(config, seed=None):
    """What train() does before fit, for one rank on the embedded corpus."""
    _, vocab_size, train_tokens, val_tokens = open_data(config, 0, 1)
    mx.random.seed(config.seed if seed is None else seed)
    model = Transformer(ModelArgs.from_config(config, vocab_size))
    optimizer = make_optimizer(config)
    mx.random.seed(rank_seed(config.seed, 0))
    data = TrainData(train=BatchLoader(train_tokens, config.batch_size, config.block_size, config.seed, 0),
                     val=BatchLoader(val_tokens, config.batch_size, config.block_size, config.seed + 1, 0),
                     group=mx.distributed.init(backend="ring"))
    return model, optimizer, data, vocab_size


def expected_events(steps, start, report_every, eval_every, ckpt_every):
    events = []
    for n in range(start + 1, steps + 1):
        events.append(("step", n))
        if n % report_every == 0 or n == steps or n == start + 1:
            events.append(("report", n))
        events.append(("pause",))
        if (eval_every and n % eval_every == 0) or n == steps:
            events.append(("eval", n))
        if n % ckpt_every == 0 or n == steps:
            events.append(("checkpoint", n))
        events.append(("resume",))
    return events


def test_fit_tells_the_callbacks_every_step_in_order_and_the_loss_falls():
    config = TrainConfig(**SMALL, steps=30, report_every=10, eval_every=15, ckpt_every=10)
    model, optimizer, data, vocab_size = setup(config)
    seen = Recorder()
    fit(model, optimizer, data, config, seen)

    assert seen.events == expected_events(30, 0, report_every=10, eval_every=15, ckpt_every=10)
    assert [e[1] for e in seen.events if e[0] == "checkpoint"] == [10, 20, 30]
    schedule = lr_schedule(config)
    for n, lr in seen.lrs.items():       # the lr the step just taken used
        assert lr == pytest.approx(schedule(n - 1).item(), rel=1e-6), n
    first, last = seen.losses[1], sum(seen.losses[n] for n in range(26, 31)) / 5
    assert first == pytest.approx(math.log(vocab_size), abs=0.1)      # an untrained model guesses uniformly
    assert last <= 0.75 * first, (first, last)
    assert seen.val_losses[30] < seen.val_losses[15] < first
    assert optimizer.state["step"].item() == 30


def test_fit_resumed_from_its_checkpoint_continues_the_same_curve(tmp_path):
    """The default Checkpointing callback at step 10 of 20, then a fresh model restored from it and fit from
    step 10: steps 11..20 give exactly the losses of the run that went on (dropout and accumulation on,
    so the random state and the data position must both come back)."""
    config = TrainConfig(**SMALL, steps=20, report_every=5, eval_every=0, ckpt_every=10, keep=0, dropout=0.1,
                         accum=2)
    model, optimizer, data, vocab_size = setup(config)
    whole = Recorder()
    saving = Checkpointing(str(tmp_path), model, optimizer, config, data.group, {"type": "byte"}, vocab_size)
    fit(model, optimizer, data, config, Callbacks(whole, saving))
    assert stepdirs.resolve(str(tmp_path), None).name == "step-000020"

    model, optimizer, data, _ = setup(config, seed=99)       # other weights: the checkpoint must replace them
    ckpt = tmp_path / "checkpoints" / "step-000010"
    start = restore(ckpt, stepdirs.read_state(ckpt), model, optimizer, config, 0, 1)
    assert start == 10
    resumed = Recorder()
    fit(model, optimizer, TrainData(data.train, data.val, data.group, start=start), config, resumed)

    assert resumed.events == expected_events(20, 10, report_every=5, eval_every=0, ckpt_every=10)
    assert min(resumed.losses) == 11 and resumed.events[1] == ("report", 11)   # the first step is reported
    assert resumed.losses == {n: whole.losses[n] for n in range(11, 21)}
    assert resumed.norms == {n: whole.norms[n] for n in range(11, 21)}


def test_every_strategy_trains_the_same_curve_on_one_rank():
    """fsdp and zero3 on a world of one (fsdp once failed there on the model's parameterless modules): the
    same losses as dp, step by step (float tolerance: the same sums in another order, measured < 1e-6).
    With dropout: zero3 draws each block's mask in the order the whole model does and restores each block's
    random key for its recomputation, so its masks, and so its gradients, are dp's."""
    from clusterctl.train.zero3 import ShardedModel

    curves = {}
    for strategy in ("dp", "fsdp", "zero3"):
        config = TrainConfig(**SMALL, steps=6, report_every=3, eval_every=0, ckpt_every=0, accum=2,
                             dropout=0.1, strategy=strategy)
        model, optimizer, data, _ = setup(config)
        if strategy == "zero3":
            model = ShardedModel(model, data.group)
        seen = Recorder()
        fit(model, optimizer, data, config, seen)
        curves[strategy] = [seen.losses[n] for n in range(1, 7)]
    assert curves["fsdp"] == pytest.approx(curves["dp"], rel=1e-5)
    assert curves["zero3"] == pytest.approx(curves["dp"], rel=1e-5)
    assert curves["dp"][-1] < curves["dp"][0]


class Stopper(Recorder):
    """A Recorder that, at one step, does what a user or `run` does to the process (signals); it also records the
    stop's own hooks."""

    def __init__(self, at, signals):
        super().__init__()
        self.at, self.signals = at, signals
        self.offers, self.stopped = [], []

    def on_step(self, step, loss, grad_norm):
        super().on_step(step, loss, grad_norm)
        if step == self.at:
            for signum in self.signals:
                os.kill(os.getpid(), signum)

    def on_stoppable(self, step, within_s):
        self.offers.append((step, within_s))

    def on_stopped(self, step, signum):
        self.stopped.append((step, signum))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_first_signal_finishes_the_step_writes_a_checkpoint_and_stops(signum):
    """The steps up to the next poll (short steps: half a second of them at most, stopping.POLL_S) are finished,
    the last reported and checkpointed (no evaluation), then Stopped says the step and the exit code; the
    handlers are put back as they were."""
    config = TrainConfig(**SMALL, steps=1000, report_every=100, eval_every=2, ckpt_every=0)
    model, optimizer, data, _ = setup(config)
    seen = Stopper(at=3, signals=[signum])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    with pytest.raises(Stopped) as stopped:
        fit(model, optimizer, data, config, seen)
    at = stopped.value.step
    assert 3 <= at < 1000 and (stopped.value.signum, stopped.value.exit_code) == (signum, 128 + signum)
    assert seen.events[-5:] == [("step", at), ("report", at), ("pause",), ("checkpoint", at), ("resume",)]
    assert [e for e in seen.events if e[0] == "checkpoint"] == [("checkpoint", at)]
    assert ("eval", 2) in seen.events and ("eval", at) not in seen.events
    assert seen.stopped == [(at, signum)] and optimizer.state["step"].item() == at
    assert seen.offers[0][0] == 1 and seen.offers[0][1] >= STOP_FLOOR_S      # offered to run after the first step
    assert {s: signal.getsignal(s) for s in before} == before
    assert time.monotonic() - started < 60


def test_a_second_signal_stops_at_once():
    config = TrainConfig(**SMALL, steps=1000, report_every=100, eval_every=0, ckpt_every=0)
    model, optimizer, data, _ = setup(config)
    seen = Stopper(at=2, signals=[signal.SIGINT, signal.SIGINT])
    with pytest.raises(KeyboardInterrupt):
        fit(model, optimizer, data, config, seen)
    assert ("checkpoint", 2) not in seen.events and seen.stopped == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    seen = Stopper(at=2, signals=[signal.SIGTERM, signal.SIGTERM])
    with pytest.raises(SystemExit) as e:
        fit(model, optimizer, data, config, seen)
    assert e.value.code == 143 and ("checkpoint", 2) not in seen.events


def test_the_clock_asks_for_a_checkpoint_at_a_poll_once_the_interval_has_passed():
    """--ckpt-minutes: the first step is always polled, so an interval already passed there checkpoints it (then
    at every later poll); the default ten minutes leave only the last step's."""
    for minutes, first in ((1e-9, [1]), (10.0, [])):
        config = TrainConfig(**SMALL, steps=8, report_every=100, eval_every=0, ckpt_every=0, ckpt_minutes=minutes)
        model, optimizer, data, _ = setup(config)
        seen = Recorder()
        fit(model, optimizer, data, config, seen)
        saved = [e[1] for e in seen.events if e[0] == "checkpoint"]
        assert saved[:len(first)] == first and saved[-1] == 8 and (len(saved) == 1) == (minutes == 10.0), saved
