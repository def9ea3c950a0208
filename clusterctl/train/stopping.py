"""Stopping a run with its work kept, and checkpoints by the clock as well as by steps (docs/trainer.md#stopping).

    stopping = Stopping(interval_s, group)     # fit makes one; `with stopping.request:` arms the signals
    stopping.step_begins()
    ...the step...
    signum, due = stopping.poll()              # after every step, on every rank: the same answer everywhere
    stopping.checkpointed(started)             # the clock starts again

The first SIGINT or SIGTERM a rank receives only sets a flag, and the rank finishes the step it is in (a Python
handler runs once the step's native code returns). After a step the ranks agree, in one all_max of three
integers, on the signal any rank received, on the longest time any rank counts since the last checkpoint and on
when to poll next, so that every rank stops, and checkpoints by the clock, at the same step: a rank that decided
alone would wait in the next collective for ever (dp's gradient all_sum, zero3's gathers). They poll after every
step, or, when steps are short, after each half second of them (POLL_S): the stop comes at most that late.
fit then writes a checkpoint and raises Stopped; the trainer exits 128 + the signal (130, 143). A second signal
stops the rank at once, as the first did before (KeyboardInterrupt for SIGINT, exit 128 + N for another).

`clusterctl run` reaches every rank with the signal itself, over SSH (launch/stop.py), and waits as long as the
ranks said they may need (`stop_bound`, announced in a metrics line: callbacks.Stoppable).
"""
from __future__ import annotations

import signal
import threading
import time

import mlx.core as mx

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_FLOOR_S = 60.0          # the least time a rank asks for to finish its step, write the checkpoint and exit
MAX_MS = 2**31 - 1           # the clock travels as int32 milliseconds (24 days)
POLL_S = 0.5                 # how much training, at most, between two polls (and so, past the request, before a stop)


class Stopped(Exception):
    """The ranks stopped on request at `step`, its checkpoint written: the trainer exits 128 + `signum`."""

    def __init__(self, signum: int, step: int):
        super().__init__(f"stopped at step {step} by {signal.Signals(signum).name}")
        self.signum, self.step = signum, step

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopRequest:
    """SIGINT and SIGTERM as a request (`signum`, 0 while none came) while armed (`with request:`); the second
    one stops at once. Only the main thread can take signals: elsewhere (fit called from a thread) nothing is
    armed and a signal does what it did before."""

    def __init__(self):
        self.signum = 0
        self.previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self.previous[signum] = signal.signal(signum, self._received)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _received(self, signum, frame) -> None:
        if not self.signum:
            self.signum = signum
            return
        self._restore()            # the second: stop now, as before the request
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def _restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}


def ignore_stop_signals() -> None:
    """From a stop's checkpoint to the exit: a launcher's SIGTERM to a rank already on its way out (the rank
    starter's, mpirun's, once another rank has exited) changes nothing."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def agree(signum: int, since_ms: int, gap: int, group) -> tuple[int, int, int]:
    """(the signal any rank received, 0: none; the longest time since the last checkpoint any rank counts, in ms;
    the fewest steps any rank proposes until the next poll): the same on every rank, from one all_max of three
    int32 on the CPU stream (the gaps negated, so that their max is the least)."""
    mine = (signum, min(max(since_ms, 0), MAX_MS), -min(max(gap, 1), MAX_MS))
    if group.size() == 1:
        return mine[0], mine[1], -mine[2]
    got = mx.distributed.all_max(mx.array(mine, dtype=mx.int32), group=group, stream=mx.cpu).tolist()
    return int(got[0]), int(got[1]), -int(got[2])


def poll_gap(seconds: float, steps: int) -> int:
    """Steps until the next poll, proposed from the time the last `steps` steps took: about POLL_S of training
    (every step when a step takes that long or longer), so that the poll's collective costs nothing worth
    counting however short a step is (a small all_max: ~0.1 ms between two test hosts over ring, ~4 ms over mpi
    there)."""
    per_step = seconds / max(steps, 1)
    return max(1, int(POLL_S / per_step)) if per_step > 0 else 1


def checkpoint_due(since_ms: int, interval_s: float) -> bool:
    """Whether the clock asks for a checkpoint: `interval_s` (0: never) have passed since the last one."""
    return interval_s > 0 and since_ms >= interval_s * 1000


def stop_bound(longest_step_s: float, longest_checkpoint_s: float) -> float:
    """How long a rank may need, from the request, to finish its step, write the checkpoint and exit: a minute,
    plus twice the longest step and twice the longest checkpoint it has taken (a slower step or a larger write
    than any yet)."""
    return STOP_FLOOR_S + 2 * (longest_step_s + longest_checkpoint_s)


class Stopping:
    """One rank's side of it, for fit: the request, the clock since the last checkpoint, the polls (every step, or
    for short steps every POLL_S of them, the next one agreed at each), and the bound to offer `run` (offer(): a
    new value when it grew by a tenth or more since the last one offered)."""

    def __init__(self, interval_s: float, group, clock=time.monotonic):
        self.interval_s, self.group, self.clock = interval_s, group, clock
        self.request = StopRequest()
        self.since = self.began = self.polled_at = clock()
        self.steps = 0                       # steps since the last poll
        self.next_in = 1                     # steps from the last poll to the next: the first step is polled
        self.longest_step = self.longest_checkpoint = 0.0
        self.offered = 0.0

    def step_begins(self) -> None:
        self.began = self.clock()

    def poll(self) -> tuple[int, bool]:
        """After a step: (the signal that stops every rank here, 0: none; whether the clock asks for a
        checkpoint). Between polls (short steps) nothing is asked of the others: (0, False)."""
        now = self.clock()
        self.longest_step = max(self.longest_step, now - self.began)
        self.steps += 1
        if self.steps < self.next_in:
            return 0, False
        signum, since_ms, self.next_in = agree(self.request.signum, int((now - self.since) * 1000),
                                               poll_gap(now - self.polled_at, self.steps), self.group)
        self.polled_at, self.steps = now, 0
        return signum, checkpoint_due(since_ms, self.interval_s)

    def checkpointed(self, started: float) -> None:
        now = self.clock()
        self.longest_checkpoint = max(self.longest_checkpoint, now - started)
        self.since = now

    def offer(self) -> float | None:
        bound = stop_bound(self.longest_step, self.longest_checkpoint)
        if bound < 1.1 * self.offered:
            return None
        self.offered = bound
        return bound
