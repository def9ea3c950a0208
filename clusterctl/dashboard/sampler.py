"""The dashboard's one thread: it runs the jobs that bring the page's data in (the hosts' telemetry, the endpoints'
health, the detached runs' records) while a page is open, and lets go of what they hold when none is.

    sampler = Sampler([Job(hosts.sample, rest=hosts.rest), Job(health.poll, every=5.0)], interval=3.0)
    sampler.watch()              # a page opened: the thread starts (the first time) and runs a round at once
    sampler.unwatch()            # a page closed: IDLE_S after the last one, each job's `rest` is called
    sampler.close()              # the dashboard stops: the thread ends, each job's `rest` called

What a job fetches is its own to keep (and to read, under its own lock): the sampler only says when.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple

IDLE_S = 30.0               # the jobs stop this long after the last page closed


class Job(NamedTuple):
    """Something the sampler runs while a page is open: `run` every `every` seconds (0: every round of the sampler's
    interval), and `rest`, when given, while no page is open and at the end (a job that holds connections closes
    them there)."""
    run: Callable[[], None]
    every: float = 0.0
    rest: Callable[[], None] | None = None


class Sampler:
    """Runs each job when due, one round every `interval` seconds, in one daemon thread started by the first watch();
    while no page has watched for IDLE_S it calls each job's `rest` and waits to be woken."""

    def __init__(self, jobs: list[Job], interval: float):
        self.jobs = list(jobs)
        self.interval = interval
        self._lock = threading.Lock()
        self._watchers = 0
        self._last_watch = 0.0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self) -> None:
        with self._lock:
            self._watchers += 1
            self._last_watch = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="dashboard-sampler", daemon=True)
                self._thread.start()
        self._wake.set()

    def unwatch(self) -> None:
        with self._lock:
            self._watchers = max(0, self._watchers - 1)
            self._last_watch = time.monotonic()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _watched(self) -> bool:
        with self._lock:
            return self._watchers > 0 or time.monotonic() - self._last_watch < IDLE_S

    def _rest(self) -> None:
        for job in self.jobs:
            if job.rest is not None:
                job.rest()

    def _loop(self) -> None:
        due = [0.0] * len(self.jobs)
        try:
            while not self._closed.is_set():
                if not self._watched():
                    self._rest()                  # no page open: no connection held to any host
                    self._wake.wait(1.0)
                    self._wake.clear()
                    continue
                began = time.monotonic()
                for i, job in enumerate(self.jobs):
                    if began >= due[i]:
                        job.run()
                        due[i] = began + job.every
                self._wake.clear()
                self._closed.wait(max(0.2, began + self.interval - time.monotonic()))
        finally:
            self._rest()
