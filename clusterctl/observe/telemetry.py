"""Each host's telemetry: memory and its pressure, swap, load, GPU, heat, power, disk and the ranks of clusterctl
runs there, one light probe per host (`clusterctl top`, docs/observe.md#clusterctl-top; made to be read by `run`'s
live panel and a dashboard too).

    with Telemetry(connector) as telemetry:          # each host's connection kept open between samples
        hosts = telemetry.sample()                   # [HostTelemetry], in inventory order, every host at once
    with Telemetry(connector, every=3.0) as telemetry:    # one probe per host, a sample from each every 3 s
        for hosts in telemetry.every(3.0): ...       # each host's newest, every 3 s, until the caller stops

The probe is hosts/scripts/telemetry.py, run with each host's python over the connection kept from the last sample
(a host that dropped it is reconnected at the next): once per sample, or, watched (`every`: top, run, the
dashboard), started once and printing a sample every few seconds for as long as it is watched, so that a host pays
for one Python start, not one per sample (benchmarks/RESULTS.md#dashboard-cost). It reads the host's own tools
(macOS's vm_stat, memory_pressure, sysctl, ioreg, pmset; Linux's /proc, /sys and nvidia-smi) and answers a JSON line,
read here into a HostTelemetry (from_document, pure). Its processes of clusterctl runs are read with observe/procs.py's
parser. assess() (pure) names what is wrong with a host, given its previous sample: swapping (memory pressure warn
or critical, or swap in use or swapped-out pages growing since the last sample) and throttled (a CPU speed limit
under 100%, a thermal warning, a zone past its passive trip point).
"""
from __future__ import annotations

import queue
import shlex
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Iterator

from ..errors import ConnectError, DeadlineExceeded
from ..hosts import hostscript
from ..hosts.connector import Connector
from ..hosts.fanout import run_all
from ..hosts.scripts.contract import EVERY
from ..inventory import Host
from ..hosts.transport import Result, Transport
from .procs import PS_COMMAND, parse_ps, run_processes

PROBE_TIMEOUT_S = 20.0      # one probe: seven tools on a Mac, each under 10 s (the probe's own limit)
DEFAULT_INTERVAL_S = 3.0
SWAP_GROWTH_BYTES = 1024 * 1024     # swap in use growing by more than this between two samples is swapping


@dataclass(frozen=True)
class RankProcess:
    run_id: str
    rank: int | None
    pid: int
    rss_kb: int


@dataclass(frozen=True)
class HostTelemetry:
    """One host's sample. `state`: ok, unreachable (no connection) or error (connected, no answer); the figures
    are None where the host's tools did not give them (`sources` names the tool behind each that it did)."""

    host: str
    state: str = "ok"
    error: str | None = None
    taken: float = 0.0                    # epoch seconds
    os: str | None = None                 # macos, linux
    memory_used: int | None = None        # bytes
    memory_total: int | None = None
    memory_free_percent: int | None = None    # macOS memory_pressure's "System-wide memory free percentage"
    pressure: str | None = None           # normal, warn, critical
    swap_used: int | None = None
    swap_total: int | None = None
    swapouts: int | None = None           # pages swapped out since boot (vm_stat Swapouts, /proc/vmstat pswpout)
    load_1m: float | None = None
    cores: int | None = None
    gpu_percent: float | None = None
    gpu_memory_used: int | None = None    # nvidia-smi's, bytes
    gpu_memory_total: int | None = None
    gpu_temperature_c: float | None = None
    thermal: str | None = None            # nominal, throttled
    speed_limit: int | None = None        # pmset's CPU_Speed_Limit, percent
    thermal_warning: str | None = None    # the warning level pmset recorded
    temperature_c: float | None = None    # Linux: the hottest thermal zone
    power_w: float | None = None          # nvidia-smi's power draw
    disk_free: int | None = None          # bytes, on the filesystem of the workdir
    disk_total: int | None = None
    workdir: str | None = None
    ranks: tuple[RankProcess, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    errors: tuple[str, ...] = ()          # tools that failed on the host (their figures left out)
    flags: tuple[str, ...] = ()           # swapping, throttled (assess())
    why: tuple[str, ...] = ()             # what each flag was raised for

    @property
    def ranks_rss_kb(self) -> int:
        return sum(r.rss_kb for r in self.ranks)

    def as_json(self) -> dict:
        doc = asdict(self)
        doc["ranks"] = [asdict(r) for r in self.ranks]
        doc["ranks_rss_kb"] = self.ranks_rss_kb
        return doc


_FIGURES = {f.name for f in fields(HostTelemetry)} - {"host", "state", "error", "taken", "ranks", "sources", "errors",
                                                      "flags", "why"}


def from_document(host: str, doc: dict, taken: float) -> HostTelemetry:
    """The probe's JSON document as a HostTelemetry (pure): its figures by name, its ps lines as the ranks' processes
    (procs.py's parser: the processes of kind "rank", the python each rank runs)."""
    ranks = tuple(RankProcess(p.run_id, p.rank, p.pid, p.rss_kb)
                  for p in run_processes(host, parse_ps(doc.get("ps") or "")) if p.kind == "rank")
    return HostTelemetry(host, taken=taken, ranks=ranks, sources=dict(doc.get("sources") or {}),
                         errors=tuple(doc.get("errors") or ()), **{k: doc.get(k) for k in _FIGURES})


def assess(now: HostTelemetry, before: HostTelemetry | None = None) -> HostTelemetry:
    """`now` with its flags (pure): swapping when memory pressure is warn or critical, or since `before` (the host's
    previous sample) swap in use grew by more than SWAP_GROWTH_BYTES or pages were swapped out; throttled when the
    CPU speed limit is under 100%, a thermal (or performance) warning level is recorded, or a Linux thermal zone is
    past its passive trip point."""
    if now.state != "ok":
        return now
    flags, why = [], []
    swapping = []
    if now.pressure in ("warn", "critical"):
        swapping.append(f"memory pressure {now.pressure}")
    if before is not None and before.state == "ok":
        if now.swap_used is not None and before.swap_used is not None and now.swap_used - before.swap_used > SWAP_GROWTH_BYTES:
            swapping.append(f"swap in use grew by {(now.swap_used - before.swap_used) / 1024 ** 2:.0f} MiB")
        if now.swapouts is not None and before.swapouts is not None and now.swapouts > before.swapouts:
            swapping.append(f"{now.swapouts - before.swapouts} pages swapped out")
    if swapping:
        flags.append("swapping")
        why += swapping
    throttled = throttle_reasons(now)
    if throttled:
        flags.append("throttled")
        why += throttled
    return replace(now, flags=tuple(flags), why=tuple(why))


def throttle_reasons(now: HostTelemetry) -> list[str]:
    """Why assess() calls a host throttled, from its sample alone (pure): [] when it is not."""
    throttled = []
    if now.speed_limit is not None and now.speed_limit < 100:
        throttled.append(f"CPU speed limit {now.speed_limit}%")
    if now.thermal_warning:
        throttled.append(now.thermal_warning)
    if now.thermal == "throttled" and not throttled:
        throttled.append("thermal zone past its passive trip point" + (
            f" ({now.temperature_c:.0f} °C)" if now.temperature_c is not None else ""))
    return throttled


COLUMNS = ["host", "state", "memory", "pressure", "swap", "load", "gpu", "thermal", "disk free", "ranks", "flags"]


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024 ** 3:.1f}"


def cells(h: HostTelemetry) -> dict[str, str]:
    """One host's figures as the text of a table's cells, one per COLUMNS (pure): what `top`, run's live panel
    (cli/hosttable.py) and the dashboard's page all show. A host without an answer: its state, and its error under
    flags."""
    if h.state != "ok":
        return {c: "" for c in COLUMNS} | {"host": h.host, "state": h.state, "flags": h.error or ""}
    memory = "-"
    if h.memory_used is not None and h.memory_total:
        memory = f"{_gib(h.memory_used)}/{_gib(h.memory_total)} GiB {100 * h.memory_used / h.memory_total:.0f}%"
    swap = "-" if h.swap_total is None else f"{_gib(h.swap_used)}/{_gib(h.swap_total)} GiB"
    load = "-" if h.load_1m is None else f"{h.load_1m:.2f}/{h.cores or '?'}"
    thermal = h.thermal or "-"
    if h.speed_limit is not None and h.speed_limit < 100:
        thermal += f" {h.speed_limit}%"
    elif h.temperature_c is not None:
        thermal += f" {h.temperature_c:.0f}°C"
    ranks = f"{len(h.ranks)}, {h.ranks_rss_kb / 1024 ** 2:.1f} GiB" if h.ranks else "0"
    return {"host": h.host, "state": h.state, "memory": memory, "pressure": h.pressure or "-", "swap": swap,
            "load": load, "gpu": "-" if h.gpu_percent is None else f"{h.gpu_percent:.0f}%", "thermal": thermal,
            "disk free": "-" if h.disk_free is None else f"{_gib(h.disk_free)} GiB", "ranks": ranks,
            "flags": "; ".join(h.why) if h.flags else ""}


def probe_args(host: Host, every: float | None = None) -> list[str]:
    """The probe's arguments on `host` (hosts/scripts/telemetry.py): with `every`, a sample every that many seconds
    until it is stopped; the host's workdir and the ps command line procs.py parses."""
    loop = [EVERY, f"{every:g}"] if every is not None else []
    return [*loop, host.workdir, *shlex.split(PS_COMMAND)]


def _one_line(error: BaseException, host: str) -> str:
    text = " ".join(str(error).split())
    return text[len(host) + 2:] if text.startswith(f"{host}: ") else text


class _Stamped(queue.Queue):
    """A streamed command's lines, each with the time it arrived here: (epoch seconds, is_stderr, line)."""

    def put(self, item, block=True, timeout=None):
        super().put((time.time(), *item), block, timeout)


class _Probe:
    """One host's probe in loop mode: its streamed process, and its latest sample (each assessed against the one
    before it, as it arrives)."""

    def __init__(self, host: str, process, lines: _Stamped):
        self.host, self.process, self.lines = host, process, lines
        self.started = time.monotonic()
        self.latest: HostTelemetry | None = None
        self.heard = self.started           # monotonic time of its last sample
        self.said: list[str] = []           # its last lines that were not a sample (stderr, a login banner)

    def read(self, until: float = 0.0, newer_than: float | None = None, stop: threading.Event | None = None) -> None:
        """Take every line that has arrived; without a sample yet (or, with `newer_than`, none taken after it), wait
        for one until `until` (monotonic) or `stop` is set."""
        while True:
            waiting = self.latest is None or (newer_than is not None and self.latest.taken <= newer_than)
            wait = until - time.monotonic() if waiting and self.running() and not (stop and stop.is_set()) else 0.0
            try:
                arrived, is_err, line = self.lines.get(timeout=max(0.0, min(wait, 0.2))) if wait > 0 \
                    else self.lines.get_nowait()
            except queue.Empty:
                if wait > 0:
                    continue
                return
            now = None if is_err else read_answer(self.host, 0, line, "", arrived)
            if now is None or now.state != "ok":
                self.said = (self.said + [line])[-3:]
                continue
            self.latest, self.heard = assess(now, self.latest), time.monotonic()

    def running(self) -> bool:
        return self.process.poll() is None and any(t.is_alive() for t in self.process.readers)

    def ended(self) -> str:
        """Why it stopped answering, once it has ended: its exit status and its last words."""
        last = self.said[-1][:200] if self.said else "no output"
        return f"the probe ended (exit {self.process.poll()}): {last}"


class Telemetry:
    """Samples every host of a connector's inventory, keeping each host's transport open from one sample to the
    next. With `every`, each host runs one probe that prints a sample every `every` seconds (hosts/scripts/
    telemetry.py --every): sample() then gives each host's newest, waiting only for a probe's first; a probe that
    ends, or is silent for `every` + `timeout` seconds, is stopped and started anew at the next sample. Without it,
    each sample() runs the probe once on every host; a host whose probe is still running then is not asked twice.
    close() stops every probe and connection; a sample() after it starts them again."""

    def __init__(self, connector: Connector, timeout: float = PROBE_TIMEOUT_S, every: float | None = None):
        self.connector = connector
        self.timeout = timeout
        self.every_s = every
        self.hosts = list(connector.cluster.hosts)
        self._transports: dict[str, Transport] = {}
        self._probes: dict[str, _Probe] = {}
        self._last: dict[str, HostTelemetry] = {}
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._closing = threading.Event()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            probes, self._probes = list(self._probes.values()), {}
            transports, self._transports = list(self._transports.values()), {}
        for p in probes:
            p.process.stop()
        for t in transports:
            t.close()

    def sample(self) -> list[HostTelemetry]:
        """One sample of every host, at once; a host that cannot be reached or answer is one of them, its state
        and error saying why."""
        self._closing.clear()
        if self.every_s is not None:
            return self._newest()
        group = run_all(self.hosts, self._probe, deadline=self.connector.deadline(self.timeout))
        found = []
        for name, outcome in group.items():
            now = outcome.value if outcome.error is None else self._failed(name, outcome.error)
            now = assess(now, self._last.get(name))
            if now.state == "ok":
                self._last[name] = now
            found.append(now)
        return found

    def every(self, interval: float = DEFAULT_INTERVAL_S) -> Iterator[list[HostTelemetry]]:
        """A sample, then another `interval` seconds after the last one began, for as long as the caller reads;
        watched, not before every answering host's probe has printed a newer one (`interval` + 2 s at most), so
        that no sample is shown twice."""
        while True:
            began = time.monotonic()
            hosts = self.sample()
            yield hosts
            if self.every_s is not None:
                with self._lock:
                    probes = dict(self._probes)
                for h in hosts:
                    if h.state == "ok" and h.host in probes:
                        probes[h.host].read(began + interval + 2.0, newer_than=h.taken, stop=self._closing)
            time.sleep(max(0.0, began + interval - time.monotonic()))

    def _failed(self, name: str, error: BaseException) -> HostTelemetry:
        if isinstance(error, ConnectError):
            return HostTelemetry(name, "unreachable", _one_line(error, name), time.time())
        if isinstance(error, DeadlineExceeded):
            return HostTelemetry(name, "error", f"no answer within {self.connector.deadline(self.timeout):.0f}s",
                                 time.time())
        return HostTelemetry(name, "error", _one_line(error, name), time.time())

    def _transport(self, host: Host) -> Transport:
        with self._lock:
            transport = self._transports.get(host.name)
        if transport is None:
            transport = self.connector.transport(host)
            with self._lock:
                self._transports[host.name] = transport
        return transport

    def _drop(self, name: str) -> None:
        """A host's connection closed and forgotten: made anew at the next sample (it may have dropped)."""
        with self._lock:
            transport = self._transports.pop(name, None)
        if transport is not None:
            transport.close()

    # -- one probe per host, printing a sample every `every_s` ---------------------------------------------------
    def _newest(self) -> list[HostTelemetry]:
        with self._lock:
            starting = [h for h in self.hosts if h.name not in self._probes]
        failed = {}
        if starting:
            group = run_all(starting, self._start, deadline=self.connector.deadline(self.timeout))
            failed = {name: self._failed(name, o.error) for name, o in group.items() if o.error is not None}
        until = time.monotonic() + self.timeout
        found = []
        for host in self.hosts:
            if host.name in failed:
                found.append(failed[host.name])
                continue
            with self._lock:
                probe = self._probes.get(host.name)
            if probe is None:                       # closed meanwhile
                found.append(HostTelemetry(host.name, "error", "stopped", time.time()))
                continue
            probe.read(until, stop=self._closing)
            found.append(self._answer(host, probe))
        return found

    def _answer(self, host: Host, probe: _Probe) -> HostTelemetry:
        silent = time.monotonic() - probe.heard
        if not probe.running():
            error = probe.ended()
        elif probe.latest is not None and silent <= self.every_s + self.timeout:
            return probe.latest
        else:
            error = f"no answer within {silent:.0f}s"
        with self._lock:
            if self._probes.get(host.name) is probe:
                del self._probes[host.name]
        probe.process.stop()
        self._drop(host.name)
        return HostTelemetry(host.name, "error", error, time.time())

    def _start(self, host: Host) -> None:
        transport = self._transport(host)
        lines = _Stamped()
        try:
            process = hostscript.start(transport, host.python, "telemetry.py", *probe_args(host, self.every_s), lines=lines)
        except BaseException:
            self._drop(host.name)
            raise
        with self._lock:
            self._probes[host.name] = _Probe(host.name, process, lines)

    # -- one probe per sample --------------------------------------------------------------------------------
    def _probe(self, host: Host) -> HostTelemetry:
        with self._lock:
            if host.name in self._busy:
                raise RuntimeError("still waiting for the previous probe's answer")
            self._busy.add(host.name)
        try:
            transport = self._transport(host)
            taken = time.time()
            try:
                result = hostscript.run(transport, host.python, "telemetry.py", *probe_args(host), timeout=self.timeout)
            except BaseException:
                self._drop(host.name)
                raise
            return read_answer(host.name, result.exit_code, result.stdout, result.stderr, taken)
        finally:
            with self._lock:
                self._busy.discard(host.name)


def read_answer(host: str, exit_code: int, stdout: str, stderr: str, taken: float) -> HostTelemetry:
    """The probe's answer (its last line of output, one JSON document) as a HostTelemetry; an error state with the
    probe's last line of stderr when there is none (pure)."""
    try:
        doc = hostscript.answer(Result(exit_code, stdout, stderr))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        last = (stderr.strip().splitlines() or ["no output"])[-1][:200]
        return HostTelemetry(host, "error", f"the probe gave no answer (exit {exit_code}): {last}", taken)
    return from_document(host, doc, taken)
