"""The hosts of a run, watched while it runs: their telemetry (observe/telemetry.py) sampled every few seconds in
a thread of its own, for `run`'s live panel, and a host that starts or stops swapping or being throttled told
once per change (docs/observe.md#what-run-records).

    watch = HostWatch(connector, on_sample=live.hosts_seen, on_event=told, step=live.step).start()
    ...                                   # the job runs; a sample every DEFAULT_INTERVAL_S
    watch.stop()                          # the thread ends, every connection it held is closed

Transitions (pure) turns the samples into HostEvents: a flag (telemetry.assess(): swapping, throttled) that a host
did not have in its last answered sample "started", one it no longer has "ended" (with how long it lasted). A host
that does not answer changes nothing: its flags are as they were until it answers again. Nothing here may fail or
slow the run: a probe that fails is the host's state in the sample (unreachable, error), anything else is logged
at debug level and the next sample comes as usual.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..hosts.connector import Connector
from .telemetry import DEFAULT_INTERVAL_S, HostTelemetry, Telemetry, throttle_reasons

log = logging.getLogger(__name__)

FLAGS = ("swapping", "throttled")       # what telemetry.assess() raises
STOP_WAIT_S = 2.0                       # stop() waits this long at most for a probe under way to give up
_ENDED = {"swapping": "stopped swapping", "throttled": "is no longer throttled"}


@dataclass(frozen=True)
class HostEvent:
    """A host started or stopped swapping or being throttled. `t`: epoch seconds of the sample that showed it;
    `step`: the job's step then (None before the first metrics line); `why`: what the flag was raised for (a
    start's); `duration_s`: how long it lasted (an end's)."""

    host: str
    flag: str                       # swapping, throttled
    event: str                      # started, ended
    t: float
    step: int | None = None
    why: tuple[str, ...] = ()
    duration_s: float | None = None

    def line(self) -> str:
        """What the run's output says: `clusterctl: h2 is swapping (memory pressure warn) since step 40`, `clusterctl:
        h2 stopped swapping after 25 s`."""
        if self.event == "started":
            why = f" ({'; '.join(self.why)})" if self.why else ""
            since = f" since step {self.step}" if self.step is not None else ""
            return f"clusterctl: {self.host} is {self.flag}{why}{since}"
        return f"clusterctl: {self.host} {_ENDED.get(self.flag, f'is no longer {self.flag}')} after " \
               f"{self.duration_s or 0:.0f} s"

    def as_json(self) -> dict:
        """As runs/<id>/hosts.jsonl and summary.json's "host_events" keep it."""
        doc = {"t": round(self.t, 3), "host": self.host, "flag": self.flag, "event": self.event, "step": self.step}
        if self.event == "started":
            doc["why"] = list(self.why)
        else:
            doc["duration_s"] = None if self.duration_s is None else round(self.duration_s, 1)
        return doc


class Transitions:
    """Each host's flags from one sample to the next (pure): feed() gives the events of a sample."""

    def __init__(self):
        self._since: dict[tuple[str, str], float] = {}      # (host, flag) -> when it started

    def feed(self, hosts: list[HostTelemetry], step: int | None = None) -> list[HostEvent]:
        events = []
        for h in hosts:
            if h.state != "ok":           # no answer: nothing known, nothing changed
                continue
            for flag in FLAGS:
                key = (h.host, flag)
                if flag in h.flags and key not in self._since:
                    self._since[key] = h.taken
                    events.append(HostEvent(h.host, flag, "started", h.taken, step, _reasons(h, flag)))
                elif flag not in h.flags and key in self._since:
                    began = self._since.pop(key)
                    events.append(HostEvent(h.host, flag, "ended", h.taken, step, duration_s=max(0.0, h.taken - began)))
        return events

    def open(self) -> list[tuple[str, str]]:
        """(host, flag) of every flag that started and has not ended."""
        return list(self._since)


def _reasons(h: HostTelemetry, flag: str) -> tuple[str, ...]:
    """Which of assess()'s reasons are for `flag` (pure)."""
    throttled = throttle_reasons(h) if "throttled" in h.flags else []
    return tuple(w for w in h.why if (w in throttled) == (flag == "throttled"))


class HostWatch:
    """Samples the connector's hosts every `interval` seconds in a daemon thread (telemetry.Telemetry: one probe per
    host, printing a sample every `interval` over a connection kept for the watch): each sample to `on_sample`, each
    change of a host's flags to `on_event` (a HostEvent, `step()` giving the job's step), the first `first_after`
    seconds after start() (run: one interval, so that the ranks' start has the hosts to itself, and a job of a few
    seconds is never probed). A callback that fails is logged and the watch goes on; stop() ends the thread and
    closes its probes and connections."""

    def __init__(self, connector: Connector, *, on_sample: Callable[[list[HostTelemetry]], None] | None = None,
                 on_event: Callable[[HostEvent], None] | None = None, step: Callable[[], int | None] = lambda: None,
                 interval: float = DEFAULT_INTERVAL_S, first_after: float = 0.0, telemetry: Telemetry | None = None):
        self.telemetry = telemetry if telemetry is not None else Telemetry(connector, every=interval)
        self.interval, self.first_after = interval, first_after
        self.on_sample, self.on_event, self.step = on_sample, on_event, step
        self.transitions = Transitions()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="host-watch", daemon=True)

    def start(self) -> HostWatch:
        self._thread.start()
        return self

    def stop(self, wait: float = STOP_WAIT_S) -> None:
        """No more samples: a probe under way is cut short (its connection closed), the thread ends and closes
        whatever connection it still holds; waits `wait` seconds at most (the thread is a daemon)."""
        if self._done.is_set():
            return
        self._done.set()
        self._close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait)

    def _close(self) -> None:
        try:
            self.telemetry.close()
        except Exception as e:       # a connection closed twice at once, from the thread and from stop()
            log.debug("host telemetry: closing: %s: %s", type(e).__name__, e)

    def _loop(self) -> None:
        try:
            self._done.wait(self.first_after)
            while not self._done.is_set():
                began = time.monotonic()
                self._once()
                self._done.wait(max(0.0, began + self.interval - time.monotonic()))
        finally:
            self._close()

    def _once(self) -> None:
        try:
            hosts = self.telemetry.sample()
        except Exception as e:       # never the run's failure
            log.debug("host telemetry: a sample failed: %s: %s", type(e).__name__, e)
            return
        if self._done.is_set():      # stopped meanwhile: its connections were cut, the answers are not the hosts'
            return
        for h in hosts:
            if h.state != "ok":
                log.debug("host telemetry: %s %s: %s", h.host, h.state, h.error)
        self._call(self.on_sample, hosts)
        try:
            step = self.step()
        except Exception:
            step = None
        for event in self.transitions.feed(hosts, step):
            self._call(self.on_event, event)

    @staticmethod
    def _call(callback, value) -> None:
        if callback is None:
            return
        try:
            callback(value)
        except Exception as e:
            log.debug("host telemetry: %r failed: %s: %s", callback, type(e).__name__, e)
