"""Run one function per host in parallel, each under a deadline, and keep every host's outcome.

A dead host reports its connection error, a slow one a deadline error, and neither delays the others
beyond the deadline: each host runs in a daemon thread, and a thread still busy at the deadline is
abandoned (its transport's own timeouts end it soon after) rather than waited for.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence, TypeVar

from ..errors import DeadlineExceeded
from ..inventory import Host
from .transport import Result

T = TypeVar("T")


@dataclass(frozen=True)
class HostOutcome:
    """What happened on one host: a value (usually a Result) or the error that stopped it."""

    host: Host
    value: object = None
    error: BaseException | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        if self.error is not None:
            return False
        return self.value.ok if isinstance(self.value, Result) else True


class GroupResult(Mapping[str, HostOutcome]):
    """host name -> HostOutcome, in rank order, with `.ok` / `.failed` views."""

    def __init__(self, outcomes: Sequence[HostOutcome]):
        self._outcomes = {o.host.name: o for o in outcomes}

    def __getitem__(self, name: str) -> HostOutcome:
        return self._outcomes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._outcomes)

    def __len__(self) -> int:
        return len(self._outcomes)

    @property
    def ok(self) -> dict[str, HostOutcome]:
        return {n: o for n, o in self._outcomes.items() if o.ok}

    @property
    def failed(self) -> dict[str, HostOutcome]:
        return {n: o for n, o in self._outcomes.items() if not o.ok}

    @property
    def all_ok(self) -> bool:
        return not self.failed


def run_all(hosts: Sequence[Host], fn: Callable[[Host], T], deadline: float) -> GroupResult:
    """Call fn(host) for every host at once; return every host's outcome within `deadline` seconds.

    Exceptions from fn (any type) become that host's error: one host's failure never hides another's
    result. KeyboardInterrupt propagates to the caller after the threads were started.
    """
    slots: dict[str, HostOutcome] = {}
    lock = threading.Lock()
    start = time.monotonic()

    def work(host: Host) -> None:
        t0 = time.monotonic()
        try:
            outcome = HostOutcome(host, value=fn(host), elapsed_s=time.monotonic() - t0)
        except BaseException as e:  # noqa: BLE001 - recorded as this host's outcome, never lost
            outcome = HostOutcome(host, error=e, elapsed_s=time.monotonic() - t0)
        with lock:
            slots.setdefault(host.name, outcome)

    threads = [threading.Thread(target=work, args=(h,), name=f"fanout-{h.name}", daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, start + deadline - time.monotonic()))
    with lock:
        for host in hosts:
            slots.setdefault(host.name, HostOutcome(host, error=DeadlineExceeded(host.name, deadline),
                                                    elapsed_s=time.monotonic() - start))
        return GroupResult([slots[h.name] for h in hosts])


def in_background(fn: Callable[..., T], *args, **kwargs) -> "Future[T]":
    """fn(*args, **kwargs) in a daemon thread, as a Future. Unlike ThreadPoolExecutor's workers, which
    the interpreter joins at exit, it never holds up an exit (Ctrl-C while an SSH probe or a copy runs)."""
    future = Deferred(fn, *args, **kwargs)
    future.start()
    return future


class Deferred(Future):
    """fn(*args, **kwargs) as a Future that runs, in a daemon thread as in_background's, once started: by
    start(), or by the first wait for its result. `started` says whether it has been."""

    def __init__(self, fn: Callable[..., T], *args, **kwargs):
        super().__init__()
        self._call = (fn, args, kwargs)
        self._start_lock = threading.Lock()
        self.started = False

    def start(self) -> None:
        with self._start_lock:
            if self.started:
                return
            self.started = True
        fn = self._call[0]
        threading.Thread(target=self._work, name=f"background-{getattr(fn, '__name__', 'fn')}", daemon=True).start()

    def _work(self) -> None:
        if not self.set_running_or_notify_cancel():
            return
        fn, args, kwargs = self._call
        try:
            self.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            self.set_exception(e)

    def result(self, timeout: float | None = None) -> T:
        self.start()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.start()
        return super().exception(timeout)


class Ticker:
    """`fn()` every `seconds` in a daemon thread of its own until `stop()` (a long copy's progress lines, which a
    copy that has stalled would never wake)."""

    def __init__(self, fn: Callable[[], object], seconds: float = 1.0):
        self._stopped = threading.Event()

        def loop() -> None:
            while not self._stopped.wait(seconds):
                fn()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2)

