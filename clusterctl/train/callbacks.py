"""What the training loop (`trainer.fit`) tells the rest of the run, and the two listeners every run has.

fit calls, for each optimizer step N it takes (1-based, the numbering of the printed lines, metrics.jsonl
and the checkpoints):

    on_shares(N, info)              balancing on: before the first step and after each exchange of speeds
                                    (balanced.BalancedSteps.info(): rows per rank, speeds, changes)
    on_step(N, loss, grad_norm)     every step, once the step's loss and gradient norm are evaluated
    on_out_of_sync(N, ranks, msg)  check-sync found replicas that differ; fit raises OutOfSync next
    on_report(N, lr)                at the run's first step, every --report-every steps and at the last
    with paused():                  every step; time spent inside is not training time
        on_quiet(N, what)           before an evaluation or a checkpoint: a phase without steps begins
        on_eval(N, val_loss)        every --eval-every steps and at the last
        on_checkpoint(N)            every --ckpt-every steps, every --ckpt-minutes, at the last, and on a stop
    on_stoppable(N, seconds)        after the first step, and whenever the time a stop may take grew by a tenth
                                    (stopping.py); 0 when the loop ends: the offer is withdrawn
    on_stopped(N, signum)           a stop asked for by SIGINT / SIGTERM: the checkpoint of step N is written
                                    on every rank; fit raises stopping.Stopped next

Every rank gets every call at the same steps, so a hook may be a collective (a report's peak memory and a
checkpoint are). The trainer's listeners are `Reporting` (metrics.Reporter: rank 0's lines and
metrics.jsonl), `Checkpointing` (checkpoint.save), `Stoppable` (the stop's lines) and, under `clusterctl run`,
`Progress` (every rank's steps and quiet phases for the stall watchdog), joined by `Callbacks`.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from contextlib import ExitStack, contextmanager

import mlx.core as mx

from ..atomic import write_text
from ..progress import report
from ..trainer_contract import CHECKPOINTS, TRAINER_SUMMARY
from . import checkpoint, randomstate, strategies
from .metrics import Reporter
from .model import ModelArgs


class Callback:
    """The hooks fit calls, each doing nothing here: a listener overrides the ones it needs."""

    def on_shares(self, step: int, info: dict) -> None:
        pass

    def on_step(self, step: int, loss: mx.array, grad_norm: mx.array) -> None:
        pass

    def on_out_of_sync(self, step: int, ranks: list[int], message: str) -> None:
        pass

    def on_report(self, step: int, lr: float) -> None:
        pass

    def on_eval(self, step: int, val_loss: float) -> None:
        pass

    def on_checkpoint(self, step: int) -> None:
        pass

    def on_quiet(self, step: int, what: str) -> None:
        pass

    def on_stoppable(self, step: int, within_s: float) -> None:
        pass

    def on_stopped(self, step: int, signum: int) -> None:
        pass

    @contextmanager
    def paused(self):
        yield


class Callbacks(Callback):
    """Several listeners as one: each hook goes to every listener, in the order given."""

    def __init__(self, *listeners: Callback):
        self.listeners = listeners

    def on_shares(self, step, info):
        self._each("on_shares", step, info)

    def on_step(self, step, loss, grad_norm):
        self._each("on_step", step, loss, grad_norm)

    def on_out_of_sync(self, step, ranks, message):
        self._each("on_out_of_sync", step, ranks, message)

    def on_report(self, step, lr):
        self._each("on_report", step, lr)

    def on_eval(self, step, val_loss):
        self._each("on_eval", step, val_loss)

    def on_checkpoint(self, step):
        self._each("on_checkpoint", step)

    def on_quiet(self, step, what):
        self._each("on_quiet", step, what)

    def on_stoppable(self, step, within_s):
        self._each("on_stoppable", step, within_s)

    def on_stopped(self, step, signum):
        self._each("on_stopped", step, signum)

    @contextmanager
    def paused(self):
        with ExitStack() as stack:
            for listener in self.listeners:
                stack.enter_context(listener.paused())
            yield

    def _each(self, hook: str, *args) -> None:
        for listener in self.listeners:
            getattr(listener, hook)(*args)


class Reporting(Callback):
    """Rank 0's metrics lines and metrics.jsonl: the mean loss and grad norm since the last report, the
    held-out loss, and throughput that leaves out the time spent paused (evaluation, checkpoints)."""

    def __init__(self, reporter: Reporter, total_steps: int):
        self.reporter, self.total_steps = reporter, total_steps

    def on_shares(self, step, info):
        self.reporter.shares = info["rows"]

    def on_step(self, step, loss, grad_norm):
        self.reporter.add(loss, grad_norm)

    def on_report(self, step, lr):
        self.reporter.report(step, self.total_steps, lr)

    def on_eval(self, step, val_loss):
        self.reporter.evaluation(step, val_loss)

    def paused(self):
        return self.reporter.paused()


class Checkpointing(Callback):
    """checkpoint.save of the model, the optimizer and every rank's random state, with what a resumed run
    or `clusterctl generate` needs to rebuild them (config, tokenizer, model shape); rank 0 says where."""

    def __init__(self, out_dir: str, model, optimizer, config, group, tokenizer_spec: dict, vocab_size: int):
        self.out_dir, self.model, self.optimizer, self.config, self.group = out_dir, model, optimizer, config, group
        self.tokenizer_spec, self.vocab_size = tokenizer_spec, vocab_size
        self.rows: list[int] | None = None
        # before any rank of this run writes one (a checkpoint needs every rank): a killed writer's leftovers
        for name in checkpoint.remove_stale(out_dir):
            print(f"checkpoint: removed {name}, a temporary copy left by a writer that was stopped", flush=True)
        self.short = False                 # this rank's disk had no room for the next checkpoint at the last report
        self.last_size = checkpoint.newest_size(out_dir)      # a resumed run's newest; then each one written

    def on_report(self, step, lr):
        """Each report, this rank's free disk space against the newest checkpoint's size: said once when the next
        would not fit (a disk filling up is named before a checkpoint fails on it), and once when it would again."""
        if not self.last_size:
            return
        where = os.path.join(os.path.abspath(self.out_dir), CHECKPOINTS)
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            return
        if free < self.last_size and not self.short:
            print(f"warning: no space left on device for the next checkpoint in {where}: {checkpoint.mib(free)} free, "
                  f"the last took {checkpoint.mib(self.last_size)}: free space there, or that checkpoint fails the run",
                  file=sys.stderr, flush=True)
        elif free >= self.last_size and self.short:
            print(f"checkpoint: room again in {where} ({checkpoint.mib(free)} free)", flush=True)
        self.short = free < self.last_size

    def on_shares(self, step, info):
        self.rows = info["rows"]           # a resumed run starts from these shares

    def on_checkpoint(self, step):
        config, group = self.config, self.group
        state = {"config": config.training_dict(), "world_size": group.size(), "strategy": config.strategy,
                 "rng": randomstate.random_states(group),
                 "data_position": {"step": step, "micro_batch": step * config.accum},
                 "tokenizer": self.tokenizer_spec, "vocab_size": self.vocab_size,
                 "model": ({"mlx_lm": config.model} if config.model
                           else ModelArgs.from_config(config, self.vocab_size).__dict__)}
        if self.rows is not None:
            state["balance"] = {"rows": self.rows}
        if config.adapter:
            from .adapters import described
            state["adapter"] = described(config, self.model)
        path = checkpoint.save(self.out_dir, step, self.model, self.optimizer, state, group,
                               strategies.get(config.strategy), keep=config.keep)
        self.last_size = checkpoint.newest_size(self.out_dir)
        if group.rank() == 0:
            print(f"step {step} | checkpoint {path}", flush=True)


class Stoppable(Callback):
    """A stop with the work kept (stopping.py), told: under `clusterctl run` every rank says in a metrics line
    that it stops so (`stop_s`: the seconds it may need; 0: no longer) and that it did (`stopped`: the step whose
    checkpoint every rank has written), which is how run knows to ask and how long to wait
    (docs/run.md#ctrl-c-and-sigterm); rank 0 also tells the user."""

    def __init__(self, group, total_steps: int):
        self.main, self.total_steps = group.rank() == 0, total_steps

    def on_stoppable(self, step, within_s):
        if under_run():
            report(stop_s=round(within_s, 1))

    def on_stopped(self, step, signum):
        if self.main:
            print(f"stopped at step {step}/{self.total_steps} by {signal.Signals(signum).name}, its checkpoint written: "
                  "--resume continues from it", flush=True)
        if under_run():
            report(stopped=step)


class TrainerSummary(Callback):
    """Rank 0 keeps <out>/trainer.json current (trainer_contract.TRAINER_SUMMARY), which `clusterctl run` puts
    into summary.json under "trainer": the strategy it trains with (its choice under --strategy auto, a --config
    file's, a resumed checkpoint's: the run's record takes it), the shares and their changes, the replicas'
    sync checks and, when they differed, which ranks and when. Written first before the first step."""

    def __init__(self, out_dir: str, group, config):
        self.path = os.path.join(out_dir, TRAINER_SUMMARY)
        self.main = group.rank() == 0
        balanced = group.size() > 1 and strategies.get(config.strategy).replicated
        self.doc = {"strategy": config.strategy,
                    "balance": {"mode": config.balance if balanced else "off"},
                    "check_sync": {"every": config.check_sync, "last_checked_step": None, "out_of_sync": None}}
        self.every = config.check_sync
        self.pending: int | None = None       # a step whose check comes after on_step; passed if fit goes on
        self._write()

    def on_shares(self, step, info):
        self.doc["balance"] = {**info, "mode": self.doc["balance"]["mode"]}
        self._write()

    def on_step(self, step, loss, grad_norm):
        self._passed()
        if self.every and step % self.every == 0:
            self.pending = step

    def on_out_of_sync(self, step, ranks, message):
        self.pending = None
        self.doc["check_sync"]["out_of_sync"] = {"step": step, "ranks": ranks, "message": message}
        self._write()

    def on_checkpoint(self, step):
        self._passed()
        self._write()

    def _passed(self):
        if self.pending is not None:
            self.doc["check_sync"]["last_checked_step"] = self.pending
            self.pending = None

    def _write(self):
        if self.main:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            write_text(self.path, json.dumps(self.doc, indent=2) + "\n")


# How long a phase without steps may last before the stall watchdog may call it a stall (launch/stall.py):
# loading, restoring and the first step's compile (on a Linux CPU host MLX compiles its kernels then:
# docs/run.md#a-slow-first-step-on-linux), an evaluation, a checkpoint. A hang there is caught this late.
QUIET_S = 600.0
# Once an evaluation or a checkpoint has been timed, the next of its kind announces QUIET_TIMES its longest so far,
# at least QUIET_MIN_S (never more than QUIET_S): a hang there (a link between the hosts dropped mid-checkpoint)
# is then a stall within a minute or so, not ten.
QUIET_TIMES, QUIET_MIN_S = 10.0, 60.0
BEAT_S = 1.0          # at most one progress line a second from each rank


def announce_quiet(seconds: float = QUIET_S) -> None:
    """Tell `clusterctl run` that no step will come for up to `seconds` (a metrics line; nothing outside a run)."""
    if watched():
        report(quiet_s=seconds)


def under_run() -> bool:
    return bool(os.environ.get("CLUSTERCTL_RUN_ID"))


def watched() -> bool:
    """Under `clusterctl run` with its stall watchdog on (`--stall-timeout 0` exports CLUSTERCTL_STALL=off)."""
    return under_run() and os.environ.get("CLUSTERCTL_STALL") != "off"


class Progress(Callback):
    """Every rank's progress for `clusterctl run`'s stall watchdog: a metrics line with the step at most every
    BEAT_S seconds, and a quiet phase announced before the first step, each evaluation and each checkpoint
    (ended by the next step's line)."""

    def __init__(self, total_steps: int):
        self.total_steps = total_steps
        self.last_beat = 0.0
        self.quiet = True
        self.phase: tuple[str, float] | None = None     # the quiet phase under way: (what, since)
        self.longest: dict[str, float] = {}             # each kind's longest quiet phase so far, in seconds
        announce_quiet()          # the first step: graph building and, on a Linux CPU, kernel compiles

    def on_step(self, step, loss, grad_norm):
        now = time.monotonic()
        if self.phase is not None:
            what, since = self.phase
            self.longest[what] = max(self.longest.get(what, 0.0), now - since)
            self.phase = None
        if self.quiet or now - self.last_beat >= BEAT_S or step == self.total_steps:
            report(step=step, total_steps=self.total_steps)
            self.last_beat, self.quiet = now, False

    def on_quiet(self, step, what):
        if self.phase is None:         # an evaluation and a checkpoint at one step: one phase, the first's kind
            self.phase = (what, time.monotonic())
        announce_quiet(quiet_for(self.longest.get(what)))
        self.quiet = True


def quiet_for(longest: float | None) -> float:
    """The quiet phase to announce for a kind of phase whose longest so far took `longest` seconds (None: never
    timed yet): QUIET_S, else QUIET_TIMES that, within [QUIET_MIN_S, QUIET_S]."""
    if longest is None:
        return QUIET_S
    return min(QUIET_S, max(QUIET_MIN_S, QUIET_TIMES * longest))
