"""fit's step with balancing on (rowshares.py has the rules): this rank's share of the global batch, its
compute timed, the shares exchanged and moved, and the replicas' parameters compared (check-sync).

    steps = BalancedSteps(model, optimizer, config, group, shard_loader, start=0, rows=None)
    loss, grad_norm = steps(step)           # one optimizer step (0-based), every rank together
    steps.info()                            # shares, speeds and changes, for metrics and trainer.json

Three test aids, read from the environment (docs/trainer.md#test-aids): CLUSTERCTL_TRAIN_SLOWDOWN=F makes this
rank's computation F times as long (it sleeps (F - 1) x the time its forward and backward passes took, each step;
the gradients' all_sum, the optimizer and the loop's Python are not slowed), F@A-B only from step A up to
step B (a Mac that heats up, then cools down; F@A- from step A on), CLUSTERCTL_TRAIN_PERTURB=
RANK@STEP adds 0.001 to one parameter of rank RANK after step STEP (a replica drifting: perturbation, perturb),
CLUSTERCTL_TRAIN_STEP_S=S makes every step of this rank last at least S seconds (step_floor: a run paced by the
clock, however fast the machine, for a test that must outlast a fault of fixed length).
"""
from __future__ import annotations

import math
import os
import time
from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from ..errors import ClusterctlError, ConfigError
from . import rowshares, strategies
from .callbacks import announce_quiet

SLOWDOWN = "CLUSTERCTL_TRAIN_SLOWDOWN"
PERTURB = "CLUSTERCTL_TRAIN_PERTURB"
STEP_FLOOR = "CLUSTERCTL_TRAIN_STEP_S"


class Diverged(ClusterctlError):
    """The parameters hold a nan or an inf (check_sync): training diverged; no restart mends that."""


class OutOfSync(ClusterctlError):
    """The ranks' parameters differ: a replica drifted. `ranks`: the ones that differ from the majority."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


def slowdown(text: str | None = None) -> tuple[float, int, float]:
    """The slowdown aid: (factor, first step, step it ends before) from CLUSTERCTL_TRAIN_SLOWDOWN's F, F@A-B or
    F@A- (steps 1-based, as the trainer reports them); (1, 0, inf) when unset."""
    text = (os.environ.get(SLOWDOWN, "") if text is None else text).strip()
    if not text:
        return 1.0, 0, math.inf
    factor_text, _, steps = text.partition("@")
    first, _, last = steps.partition("-")
    try:
        factor = float(factor_text)
        begin = int(first) if steps else 0
        end = (int(last) if last else math.inf) if steps else math.inf
    except ValueError:
        factor, begin, end = -1.0, 0, math.inf
    if not math.isfinite(factor) or factor < 1 or begin < 0 or end <= begin or (steps and not (first and "-" in steps)):
        raise ConfigError(f"{SLOWDOWN}={text!r}: a factor of 1 or more (2: this rank computes half as fast), "
                          "optionally @A-B (from step A up to step B) or @A- (from step A on)")
    return factor, begin, end


def weighted_loss(model, x, y, w):
    """sum over rows of (the row's mean next-token loss x its weight)."""
    per_token = nn.losses.cross_entropy(model(x), y, reduction="none")
    return (per_token.mean(axis=1) * w).sum()


def weighted_grads(model, x, y, w):
    """The weighted loss and its gradients summed over the micro-batches x[i] (one forward/backward each)."""
    value_and_grad = nn.value_and_grad(model, weighted_loss)
    loss, grads = value_and_grad(model, x[0], y[0], w[0])
    for i in range(1, x.shape[0]):
        more_loss, more_grads = value_and_grad(model, x[i], y[i], w[i])
        loss = loss + more_loss
        grads = tree_map(mx.add, grads, more_grads)
    return loss, grads


def initial_rows(config, world: int, saved: list[int] | None = None) -> list[int]:
    """The shares a run starts with: a checkpoint's (same world and global batch), fixed weights, or even."""
    total = config.batch_size * config.accum * world
    mode = rowshares.parse_balance(config.balance, world)
    if isinstance(mode, tuple):
        return rowshares.proportional(mode, total)
    if saved and len(saved) == world and sum(saved) == total and mode == "auto":
        return list(saved)
    return rowshares.proportional([1] * world, total)


class BalancedSteps:
    def __init__(self, model, optimizer, config, group, shard_loader, start: int = 0,
                 rows: list[int] | None = None):
        self.model, self.optimizer, self.config, self.group = model, optimizer, config, group
        self.rank, self.world = group.rank(), group.size()
        self.mode = rowshares.parse_balance(config.balance, self.world)
        self.rows = initial_rows(config, self.world, rows)
        self.shard_loader, self.start = shard_loader, start
        self.slow, self.slow_from, self.slow_until = slowdown()
        self.settled: int | None = None       # the exchange at which the shares last settled (said once)
        self.measured_rows, self.measured_s = 0, 0.0
        self.rates = [0, 0.0, 0.0]            # step-by-step speeds since the last exchange: count, sum, and the
        self.last_rate: float | None = None   # squared differences of successive ones (rowshares.spread)
        self.noise: float | None = None       # the last exchange's (rowshares.noise)
        self.proposed: list[int] | None = None    # the shares the last exchange's figures called for
        self.measured_steps, self.exchange_at = 0, rowshares.WARMUP_STEPS
        self.speeds: list[float] | None = None
        self.changes: list[dict] = []
        self.exchanged: int | None = None     # the step after which the last exchange happened
        readable = getattr(shard_loader, "readable", None)
        self.reads_all = readable() if readable is not None else True
        self.held_even: list[int] | None = None   # auto: ranks that cannot read every shard (shares stay even)
        self._build()

    def _build(self):
        model, optimizer, config, group = self.model, self.optimizer, self.config, self.group
        state = [model.state, mx.random.state]
        self.grads_of = mx.compile(partial(weighted_grads, model), inputs=state, outputs=state)
        self.compiled: set[tuple] = set()    # the micro-batch shapes grads_of has compiled
        self.apply = strategies.get(config.strategy).update(model, optimizer, config, group)

    def batch(self, step: int) -> list[tuple[mx.array, mx.array, mx.array]]:
        """This rank's micro-batches of optimizer step `step`, those of one size stacked: per size (two at most, the
        longer first), (m, b, L) inputs and targets and (m, b) weights."""
        config = self.config
        B, L, accum = config.batch_size, config.block_size, config.accum
        weight = self.world / sum(self.rows)
        starts: dict[tuple[int, int], list[int]] = {}
        sizes: dict[int, tuple[list, list, list]] = {}
        for chunk in rowshares.micro_batches(rowshares.assignment(self.rows)[self.rank], B):
            windows = []
            for shard, j in chunk:
                loader, key = self.shard_loader(shard), (shard, j // B)
                if key not in starts:
                    starts[key] = loader.starts(step * accum + j // B)
                windows.append(loader.tokens.window(starts[key][j % B], L + 1))
            rows = mx.stack(windows).astype(mx.int32)
            xs, ys, ws = sizes.setdefault(len(chunk), ([], [], []))
            xs.append(rows[:, :-1])
            ys.append(rows[:, 1:])
            ws.append(mx.array([weight] * len(chunk), dtype=mx.float32))
        return [(mx.stack(xs), mx.stack(ys), mx.stack(ws)) for xs, ys, ws in sizes.values()]

    def __call__(self, step: int):
        groups = self.batch(step)
        computed = sum(x.shape[0] * x.shape[1] for x, _, _ in groups)     # this rank's rows, each computed once
        began = time.perf_counter()
        loss, grads = self.grads_of(*groups[0])
        for x, y, w in groups[1:]:            # the other size's micro-batches (compiled once per shape)
            more_loss, more_grads = self.grads_of(x, y, w)
            loss, grads = loss + more_loss, tree_map(mx.add, grads, more_grads)
        mx.eval(loss, grads)
        took = time.perf_counter() - began
        if self.slow > 1 and self.slow_from <= step + 1 < self.slow_until:
            time.sleep((self.slow - 1) * took)
            took *= self.slow
        shapes = tuple(x.shape for x, _, _ in groups)
        if shapes not in self.compiled:       # the first step of these shapes compiled them: not a measure of speed
            self.compiled.add(shapes)        # (the attempt's first step, and the first after the shares moved)
        elif step > self.start:
            self.measured_rows += computed
            self.measured_s += took
            self.measured_steps += 1
            if took > 0:
                rate = computed / took
                jump = 0.0 if self.last_rate is None else (rate - self.last_rate) ** 2
                self.rates = [self.rates[0] + 1, self.rates[1] + rate, self.rates[2] + jump]
                self.last_rate = rate
        loss, norm = self.apply(loss, grads)
        if self.mode == "auto" and self.measured_steps == self.exchange_at:
            self.exchange(step + 1)
        return loss, norm

    def exchange(self, done: int) -> None:
        """Every rank's rows per second since the last exchange, then the shares `decide` moves to."""
        mine = mx.zeros((self.world, 6))
        mine[self.rank] = mx.array([self.measured_rows, self.measured_s, float(self.reads_all), *self.rates])
        table = mx.distributed.all_sum(mine, group=self.group, stream=mx.cpu).tolist()
        seconds = [row[1] for row in table]
        self.exchange_at = rowshares.next_exchange(self.measured_steps, seconds)
        if not rowshares.enough(seconds):
            return                           # the same table on every rank: all wait a step more together
        self.measured_rows, self.measured_s, self.rates, self.last_rate = 0, 0.0, [0, 0.0, 0.0], None
        self.speeds = [row[0] / row[1] if row[1] > 0 else 0.0 for row in table]
        self.noise = rowshares.noise([rowshares.spread(*row[3:]) for row in table])
        self.exchanged = done
        cannot = [r for r, row in enumerate(table) if not row[2]]
        if cannot:
            if self.held_even is None and self.rank == 0:
                print(f"note: balancing keeps even shares: rank(s) {', '.join(map(str, cannot))} cannot read every "
                      "shard of --data (each host holds its own); send every shard to every host (clusterctl run "
                      "--all-shards, or data push --all-shards) to balance", flush=True)
            self.held_even = cannot
            return
        wanted = rowshares.proposal(self.rows, self.speeds, self.noise)
        new, self.proposed = rowshares.confirmed(self.rows, wanted, self.speeds, self.proposed), wanted
        measured = ", ".join(f"{s:.0f}" for s in self.speeds) + f" rows/s, noise {100 * self.noise:.0f}%"
        if new == self.rows:
            if self.changes and self.settled is None:
                # the shares held at an exchange after a move: said once, until they move again
                self.settled = done
                if self.rank == 0:
                    even = rowshares.step_time(rowshares.proportional([1] * self.world, sum(new)), self.speeds)
                    print(f"balance: settled at {':'.join(map(str, new))} rows a step from step "
                          f"{self.changes[-1]['step']} (measured {measured}; a step predicted "
                          f"{even / rowshares.step_time(new, self.speeds):.2f}x the even split's speed)", flush=True)
            return
        if new != self.rows:
            if self.rank == 0:
                print(f"balance: step {done}: {':'.join(map(str, self.rows))} -> {':'.join(map(str, new))} rows a step "
                      f"(measured {measured})", flush=True)
            self.settled = None
            self.rows = new
            taken = {shard for shard, _ in rowshares.assignment(new)[self.rank]} - {self.rank}
            if taken:                        # opening another rank's shard may take a while (tokenizing it)
                announce_quiet()
                for shard in sorted(taken):
                    self.shard_loader(shard)
            self.changes.append({"step": done, "rows": list(new), "speeds": [round(s, 1) for s in self.speeds],
                                 "noise": round(self.noise, 3)})

    def info(self) -> dict:
        return {"mode": self.mode if isinstance(self.mode, str) else "fixed", "rows": list(self.rows),
                "held_even_for": self.held_even,
                "speeds_rows_per_s": [round(s, 1) for s in self.speeds] if self.speeds else None,
                "noise": round(self.noise, 3) if self.noise is not None else None,
                "changes": self.changes}


def digest(model) -> mx.array:
    """A small fingerprint of every trained parameter (all of them, but for an adapter run's frozen base): its sum
    and sum of squares, in float32."""
    parts = []
    for _, p in sorted(tree_flatten(model.trainable_parameters()), key=lambda kv: kv[0]):
        p = p.astype(mx.float32)
        parts += [p.sum(), (p * p).sum()]
    return mx.stack(parts)


def check_sync(model, group, step: int) -> None:
    """Compare every rank's digest (one all_sum of a world x 2N table); OutOfSync naming the ranks that differ."""
    if group.size() == 1:
        return
    mine = digest(model)
    table = mx.zeros((group.size(), mine.shape[0]))
    table[group.rank()] = mine
    rows = [tuple(r) for r in mx.distributed.all_sum(table, group=group, stream=mx.cpu).tolist()]
    broken = rowshares.not_finite(rows)
    if broken:
        raise Diverged(f"training diverged: the parameters are not finite (nan or inf) after step {step} on "
                       f"{_ranks(broken)}; the loss lines show the step where it began: lower --lr or set --max-norm "
                       "and train again from the start or from a checkpoint saved before it (a later one holds them)")
    differ = rowshares.sync_differs(rows)
    if differ:
        who = _ranks(differ)
        agree = group.size() - len(differ)
        raise OutOfSync(f"replicas out of sync after step {step}: {who}'s parameters differ from "
                        + (f"the other {agree} rank(s)'" if agree else "each other's (no majority: either may "
                           "have drifted)")
                        + "; stopped (a nondeterministic op, a bad restart or a hardware fault: resume from the "
                          "last checkpoint)", differ)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def perturbation() -> tuple[int, int] | None:
    """The test aid CLUSTERCTL_TRAIN_PERTURB=RANK@STEP as (rank, step), None when it is not set."""
    text = os.environ.get(PERTURB, "")
    if not text:
        return None
    try:
        who, when = (int(v) for v in text.split("@"))
    except ValueError:
        raise ConfigError(f"{PERTURB}={text!r}: RANK@STEP, e.g. 1@30") from None
    return who, when


def step_floor(text: str | None = None) -> float:
    """The test aid CLUSTERCTL_TRAIN_STEP_S=S: the seconds a step lasts at least (this rank sleeps the rest of
    them after its step; nothing it computes changes); 0.0 when it is not set."""
    text = (os.environ.get(STEP_FLOOR, "") if text is None else text).strip()
    if not text:
        return 0.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"{STEP_FLOOR}={text!r}: the seconds a step lasts at least (0 or more, e.g. 0.5)")
    return seconds


def perturb(model) -> None:
    """Move this rank's first parameter by 0.001 (a replica drifting: the test aid above)."""
    name, p = sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0])[0]
    model.update(tree_unflatten([(name, p + 0.001)]))
