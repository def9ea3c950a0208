"""Balanced data parallelism: each rank a share of the global batch in proportion to its speed (pure logic).

The global batch is the one the even split trains on, whatever the shares: R = batch_size x accum x world rows
per step, shard k contributing its q = R / world rows (the rows rank k reads under the even split:
BatchLoader(shard k).batch(step * accum + i), i < accum). Shares only move rows between ranks:

- `rows[r]` rows go to rank r (sum R, at least one each). A rank first takes rows of its own shard (up to q);
  the rows of its shard it does not take (a slower rank's) go, in shard then row order, to the ranks whose
  share is above q (a faster rank's), so a rank reads another rank's shard only for what it takes over
  (`assignment`). Even shares: every rank reads exactly its own q rows, in the even split's order.
- A rank's rows are cut into as few micro-batches of at most batch_size rows as they need, as even as possible
  (their sizes differ by one at most; none is padded: each row computed is a row of the batch),
  and the loss it differentiates is sum(row losses) x world / R: summed over the ranks and averaged as the even
  split's gradients are (nn.average_gradients, FSDP's reduce-scatter), that is the mean loss over all R rows of
  the step, so the update is the even split's, and one rank's with the whole batch, to float rounding.

`auto` measures each rank's rows per second of computation (its forward and backward passes, not the time it
waits for the others), exchanged after WARMUP_STEPS steps and then every EXCHANGE_EVERY (each decision waits
until every rank has computed MIN_MEASURED_S since the last), and moves rows only when the
measured speeds differ by more than TOLERANCE and the new shares would make the step faster than the current ones
by HYSTERESIS and by more than the noise measured (`noise`: NOISE_Z standard errors of the step time predicted from
the speeds, which the scatter of each rank's step-by-step speeds gives: `spread`), so shares do not flap with noise (a busy
machine's steps vary, and a row moved for that would soon move back); a move that predicts less than CONFIRM is
made only when two exchanges in a row call for it (a busy machine's bursts can hold a rank back for a whole
window, steadily, which no step-by-step scatter shows: `decide`); a Mac that slows down (heat, another job)
gets fewer rows at the next exchange, and its rows back when it recovers. The shares it moves to are the best
the rows allow (`best_split`: the shortest predicted step, rows whole), not the speeds' proportions rounded: with
16 rows and one rank twice as fast, 11:5 (a step of 5.5 of the slow rank's row times), not 10:6 (6).
"""
from __future__ import annotations

import math

from ..errors import ConfigError

WARMUP_STEPS = 3          # steps measured before the first exchange (the first step, which compiles, is not)
EXCHANGE_EVERY = 20       # steps between later exchanges
MIN_MEASURED_S = 0.25     # an exchange decides only once every rank has computed this long since the last one
                          # (a few tiny steps are noise: a rank descheduled once); else it waits a step more
TOLERANCE = 0.10          # speeds within 10% of the mean: even shares (identical Macs, or one a little busy,
                          # never move rows, nor make a rank tokenize another's shard, for noise)
HYSTERESIS = 0.05         # new shares must cut the predicted step time by 5% or more
NOISE_Z = 2.0             # ... and by more than twice the standard error of that prediction (`noise`)
CONFIRM = 0.15            # a move predicting a smaller cut waits for a second exchange in a row to call for it


def parse_balance(text: str, world: int | None = None) -> str | tuple[float, ...]:
    """'auto', 'off', or the fixed weights of `W1,W2,...` (positive numbers, one per rank when `world` is
    known). ConfigError otherwise."""
    text = (text or "").strip()
    if text in ("auto", "off"):
        return text
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        raise ConfigError(f"--balance must be auto, off or weights such as 2,1 (one per rank), not {text!r}") from None
    if not weights or any(not math.isfinite(w) or w <= 0 for w in weights):
        raise ConfigError(f"--balance weights must be positive numbers, not {text!r}")
    if world is not None and len(weights) != world:
        raise ConfigError(f"--balance {text} gives {len(weights)} weight(s) for {world} rank(s): one per rank")
    return weights


def proportional(weights, total: int) -> list[int]:
    """`total` rows split in proportion to `weights`, at least one each (largest remainders; ties to the
    lower rank)."""
    n = len(weights)
    if total < n:
        raise ConfigError(f"a global batch of {total} rows cannot give each of {n} ranks one")
    spare = total - n
    s = sum(weights)
    exact = [spare * w / s for w in weights]
    rows = [1 + math.floor(e) for e in exact]
    left = total - sum(rows)
    order = sorted(range(n), key=lambda r: (-(exact[r] - math.floor(exact[r])), r))
    for r in order[:left]:
        rows[r] += 1
    return rows


def best_split(speeds, total: int) -> list[int]:
    """`total` rows, at least one each, that make the predicted step (step_time) the shortest: each row given in
    turn to the rank that would finish its rows soonest with it (optimal for max(rows / speed): a row is a row;
    ties to the lower rank)."""
    n = len(speeds)
    if total < n:
        raise ConfigError(f"a global batch of {total} rows cannot give each of {n} ranks one")
    rows = [1] * n
    for _ in range(total - n):
        r = min(range(n), key=lambda r: ((rows[r] + 1) / speeds[r], r))
        rows[r] += 1
    return rows


def step_time(rows, speeds) -> float:
    """The predicted compute time of a step: the slowest rank's rows over its speed."""
    return max(r / s for r, s in zip(rows, speeds))


def spread(count: float, total: float, jumps: float) -> float:
    """The relative standard error of a rank's mean speed from `count` step-by-step speeds: their sum and the sum of
    the squared differences between successive ones (`jumps`). The variance is von Neumann's, half the mean squared
    successive difference: a busy machine's scattered steps count in full, where a single change of level (the Mac
    heated up within the window) counts as one difference among count - 1, not as noise over the whole window
    (which would slow the very move that change calls for). 0 for fewer than three speeds."""
    if count < 3 or total <= 0:
        return 0.0
    mean = total / count
    return math.sqrt(jumps / (2 * (count - 1)) / count) / mean


def noise(spreads: list[float]) -> float:
    """The relative standard error of a predicted step time's change, from each rank's `spread`: the prediction's
    ratio rests on two ranks' speeds (the slowest under each split), taken at the noisiest rank's."""
    return math.sqrt(2) * max(spreads, default=0.0)


def needed(noise_: float = 0.0) -> float:
    """The cut of the predicted step time a move must make: HYSTERESIS, or NOISE_Z times the noise when more."""
    return max(HYSTERESIS, NOISE_Z * noise_)


def proposal(rows: list[int], speeds: list[float], noise_: float = 0.0) -> list[int]:
    """The shares one exchange's figures call for, from `rows` given measured speeds (rows per second per rank):
    even when the speeds are within TOLERANCE of their mean, else the best split; `rows` unless the change predicts
    a step faster by `needed(noise_)` (the speeds' relative standard error, `noise`)."""
    total, n = sum(rows), len(rows)
    if any(not math.isfinite(s) or s <= 0 for s in speeds):
        return rows
    mean = sum(speeds) / n
    if all(abs(s - mean) <= TOLERANCE * mean for s in speeds):
        target = proportional([1] * n, total)
    else:
        target = best_split(speeds, total)
    if target == rows:
        return rows
    if step_time(target, speeds) <= (1 - needed(noise_)) * step_time(rows, speeds):
        return target
    return rows


def decide(rows: list[int], speeds: list[float], noise_: float = 0.0, last: list[int] | None = None) -> list[int]:
    """The shares `auto` moves to: this exchange's `proposal`, at once when it predicts a step CONFIRM faster or
    more (a Mac that heated up or cooled down), else only when the last exchange proposed the same shares (`last`):
    on a busy machine one window of 20 steps can find two equal ranks 20% apart, steady step by step, and a row
    moved for it would move back at the next."""
    return confirmed(rows, proposal(rows, speeds, noise_), speeds, last)


def confirmed(rows: list[int], target: list[int], speeds: list[float], last: list[int] | None) -> list[int]:
    """`decide` given this exchange's proposal `target` (which the trainer keeps as the next exchange's `last`)."""
    if target != rows and target != last and step_time(target, speeds) > (1 - CONFIRM) * step_time(rows, speeds):
        return rows
    return target


def next_exchange(measured: int, seconds: list[float]) -> int:
    """After an exchange at `measured` measured steps with these compute seconds per rank: how many measured
    steps the next one comes at (WARMUP_STEPS first; the next step again while some rank has measured less
    than MIN_MEASURED_S, the figures adding up meanwhile; else EXCHANGE_EVERY later)."""
    if min(seconds) < MIN_MEASURED_S:
        return measured + 1
    return measured + EXCHANGE_EVERY


def enough(seconds: list[float]) -> bool:
    return min(seconds) >= MIN_MEASURED_S


def assignment(rows: list[int]) -> list[list[tuple[int, int]]]:
    """Per rank, the (shard, row) pairs it trains on this step, in order: its own shard's first, then what it
    takes over from slower ranks' shards. rows[r] is rank r's share; the shards' quota is sum(rows) / len."""
    n, total = len(rows), sum(rows)
    if total % n:
        raise ValueError(f"{total} rows do not split into {n} equal shards")
    q = total // n
    out = [[(r, j) for j in range(min(rows[r], q))] for r in range(n)]
    spare = [(k, j) for k in range(n) for j in range(min(rows[k], q), q)]
    for r in range(n):
        need = rows[r] - len(out[r])
        out[r] += spare[:need]
        spare = spare[need:]
    return out


def micro_batches(pairs: list[tuple[int, int]], batch_size: int) -> list[list[tuple[int, int]]]:
    """A rank's rows in as few micro-batches as batch_size allows, as even as possible: their sizes differ by one at
    most, the longer first, and none is padded. 10 rows with --batch-size 8 are 5 + 5 (not 8 + 2), 11 are 6 + 5: the
    fast rank of a 2:1 pair at 16 rows a step computes its 11 rows, not 12 (6 + 5 padded to 6, as before: a twelfth of
    its step spent on a row weighted 0). The step computes each size's micro-batches stacked, a size at a time."""
    if not pairs:
        return []
    count = math.ceil(len(pairs) / batch_size)
    size, longer = divmod(len(pairs), count)
    chunks, start = [], 0
    for i in range(count):
        end = start + size + (i < longer)
        chunks.append(pairs[start:end])
        start = end
    return chunks


def not_finite(digests: list[tuple[float, ...]]) -> list[int]:
    """The ranks whose parameter digest holds a nan or an inf: their training diverged (a nan is never equal to
    itself, so such ranks would read as out of sync with every other)."""
    return [rank for rank, d in enumerate(digests) if not all(math.isfinite(v) for v in d)]


def sync_differs(digests: list[tuple[float, ...]]) -> list[int]:
    """The ranks whose parameter digest differs from the majority's; every rank when no digest is held by more
    than half of them (two ranks that disagree: either may be the one that drifted); [] when all agree."""
    groups: dict[tuple[float, ...], list[int]] = {}
    for rank, d in enumerate(digests):
        groups.setdefault(tuple(d), []).append(rank)
    if len(groups) == 1:
        return []
    best = max(groups.values(), key=len)
    if 2 * len(best) <= len(digests):
        return list(range(len(digests)))
    return [r for r in range(len(digests)) if r not in best]
