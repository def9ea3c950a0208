"""The hosts watched while a run runs (observe/hostwatch.py): a host's flags from sample to sample as events told
once per change, the watch's thread (a failing sample or callback never stops it, stop() closes its connections),
the record of the events (runs/<id>/hosts.jsonl, summary.json), what run prints, and the live panel's host rows
(cli/panel.py, cli/hosttable.py). A run with a fake Mac made to swap: tests/ssh/test_run_hosts.py."""
import json
import threading
import time

import pytest

from clusterctl.observe.hostwatch import HostEvent, HostWatch, Transitions
from clusterctl.observe.live import LiveRun
from clusterctl.observe.telemetry import HostTelemetry, assess

GiB = 1024 ** 3
NORMAL = dict(memory_used=20 * GiB, memory_total=32 * GiB, pressure="normal", swap_used=0, swap_total=2 * GiB,
              swapouts=16, load_1m=2.0, cores=10, gpu_percent=30.0, thermal="nominal", speed_limit=100,
              disk_free=500 * GiB, disk_total=1000 * GiB)
SWAPPING = dict(NORMAL, memory_used=31 * GiB, pressure="warn")
THROTTLED = dict(NORMAL, thermal="throttled", speed_limit=28, thermal_warning="thermal warning level 2")


def sample(t, **figures):
    """h1 normal, h2 with `figures` (h2's state "unreachable" when figures say so), as Telemetry.sample() gives."""
    h2 = HostTelemetry("h2", "unreachable", "connection refused", t) if figures.get("state") == "unreachable" else \
        assess(HostTelemetry("h2", taken=t, **figures))
    return [assess(HostTelemetry("h1", taken=t, **NORMAL)), h2]


# ---- transitions -------------------------------------------------------------------------------------------------

def test_a_host_flagged_in_sample_2_still_in_3_cleared_in_4_is_one_start_and_one_end():
    transitions = Transitions()
    assert transitions.feed(sample(100.0, **NORMAL), step=10) == []
    started = transitions.feed(sample(103.0, **SWAPPING), step=40)
    assert started == [HostEvent("h2", "swapping", "started", 103.0, 40, ("memory pressure warn",))]
    assert transitions.feed(sample(106.0, **SWAPPING), step=50) == []
    assert transitions.open() == [("h2", "swapping")]
    ended = transitions.feed(sample(128.0, **NORMAL), step=90)
    assert ended == [HostEvent("h2", "swapping", "ended", 128.0, 90, duration_s=25.0)]
    assert transitions.feed(sample(131.0, **NORMAL)) == [] and transitions.open() == []
    assert started[0].line() == "clusterctl: h2 is swapping (memory pressure warn) since step 40"
    assert ended[0].line() == "clusterctl: h2 stopped swapping after 25 s"
    assert started[0].as_json() == {"t": 103.0, "host": "h2", "flag": "swapping", "event": "started", "step": 40,
                                    "why": ["memory pressure warn"]}
    assert ended[0].as_json() == {"t": 128.0, "host": "h2", "flag": "swapping", "event": "ended", "step": 90,
                                  "duration_s": 25.0}


def test_a_host_that_does_not_answer_changes_nothing_and_each_flag_has_its_own_reasons():
    transitions = Transitions()
    both = dict(THROTTLED, pressure="critical")
    events = transitions.feed(sample(10.0, **both))            # before the first metrics line: no step
    assert [(e.flag, e.event, e.why, e.step) for e in events] == [
        ("swapping", "started", ("memory pressure critical",), None),
        ("throttled", "started", ("CPU speed limit 28%", "thermal warning level 2"), None)]
    assert events[0].line() == "clusterctl: h2 is swapping (memory pressure critical)"
    assert events[1].line() == ("clusterctl: h2 is throttled (CPU speed limit 28%; thermal warning level 2)")
    assert transitions.feed(sample(13.0, state="unreachable")) == []     # unknown: still flagged
    events = transitions.feed(sample(16.0, **THROTTLED), step=7)
    assert [(e.flag, e.event, e.duration_s) for e in events] == [("swapping", "ended", 6.0)]
    events = transitions.feed(sample(19.5, **NORMAL), step=8)
    assert [(e.flag, e.event, e.duration_s) for e in events] == [("throttled", "ended", 9.5)]
    assert events[0].line() == "clusterctl: h2 is no longer throttled after 10 s"


# ---- the watch's thread ------------------------------------------------------------------------------------------

class Samples:
    """Telemetry's interface (sample, close) on canned samples: the second raises, as a bug would."""

    def __init__(self, samples):
        self.samples, self.closed, self.calls = list(samples), 0, 0

    def sample(self):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("a bug in a sample")
        return self.samples.pop(0) if self.samples else sample(time.time(), **NORMAL)

    def close(self):
        self.closed += 1


def test_the_watch_samples_tells_each_change_once_and_stops_closing_its_connections():
    canned = Samples([sample(1.0, **NORMAL), sample(4.0, **SWAPPING), sample(7.0, **SWAPPING), sample(9.0, **NORMAL)])
    seen, told, done = [], [], threading.Event()

    def on_event(event):
        told.append(event)
        if event.event == "ended":
            done.set()

    def broken(hosts):                       # a failing callback: logged, the watch goes on
        seen.append(hosts)
        raise ValueError("a panel bug")

    watch = HostWatch(None, on_sample=broken, on_event=on_event, step=lambda: 12, interval=0.01,
                      telemetry=canned).start()
    assert done.wait(10)
    watch.stop()
    assert not watch._thread.is_alive() and canned.closed >= 1
    assert [(e.host, e.flag, e.event, e.step) for e in told] == [("h2", "swapping", "started", 12),
                                                                  ("h2", "swapping", "ended", 12)]
    assert told[1].duration_s == 5.0 and len(seen) >= 4
    calls = canned.calls
    time.sleep(0.05)
    assert canned.calls == calls             # stopped: no more samples
    watch.stop()                             # twice: nothing more


class Hung:
    """A sample that hangs until its connections are closed, as a probe over a dead SSH connection would."""

    def __init__(self):
        self.closed, self.asked = threading.Event(), threading.Event()

    def sample(self):
        self.asked.set()
        self.closed.wait(30)
        raise ConnectionError("closed")

    def close(self):
        self.closed.set()


def test_stop_cuts_a_probe_under_way_short_and_nothing_is_told_after_it():
    hung, told = Hung(), []
    watch = HostWatch(None, on_sample=told.append, on_event=told.append, telemetry=hung).start()
    assert hung.asked.wait(10)
    began = time.monotonic()
    watch.stop()
    assert time.monotonic() - began < 1 and not watch._thread.is_alive() and told == []


# ---- the record and what run prints --------------------------------------------------------------------------------

def test_the_events_are_hosts_jsonl_lines_and_listed_in_the_summary(tmp_path, monkeypatch):
    from clusterctl.observe.record import HOST_EVENTS, RunRecord

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run_dir = tmp_path / "runs" / "20261127-000000-abcdef"
    run_dir.mkdir(parents=True)
    record = RunRecord.start("20261127-000000-abcdef", str(run_dir), world=2, backend="ring", hosts=["h1", "h2"],
                             program="x.py")
    events = [HostEvent("h2", "swapping", "started", 103.0, 40, ("memory pressure warn",)),
              HostEvent("h2", "swapping", "ended", 128.0, 90, duration_s=25.0)]
    for event in events:
        record.host_event(event.as_json())
    summary = record.end(0, "all 2 ranks finished")
    lines = [json.loads(line) for line in (run_dir / HOST_EVENTS).read_text().splitlines()]
    assert lines == [e.as_json() for e in events] == summary["host_events"]
    assert json.loads((run_dir / "summary.json").read_text())["host_events"] == lines
    quiet = tmp_path / "runs" / "20261127-000001-abcdef"
    quiet.mkdir()
    summary = RunRecord.start(quiet.name, str(quiet), world=1, backend="ring", hosts=["h1"], program="x.py").end(0, "ok")
    assert "host_events" not in summary and not (quiet / HOST_EVENTS).exists()


def test_run_prints_each_event_on_one_line(capsys):
    from clusterctl.cli.printedrun import PrintedRun

    printed = PrintedRun(live=False)
    printed.host_flagged(HostEvent("h2", "swapping", "started", 103.0, 40, ("memory pressure warn",)))
    printed.host_flagged(HostEvent("h2", "swapping", "ended", 128.0, 90, duration_s=25.0))
    assert capsys.readouterr().err.splitlines() == ["clusterctl: h2 is swapping (memory pressure warn) since step 40",
                                                    "clusterctl: h2 stopped swapping after 25 s"]


# ---- the live panel's host rows ----------------------------------------------------------------------------------

def test_the_panel_shows_a_row_per_host_under_the_ranks():
    from rich.console import Console

    from clusterctl.cli.panel import render

    live = LiveRun(["h1", "h2"], now=0.0)
    live.update(0, "metrics", {"step": 5, "total_steps": 100}, 1.0)
    console = Console(width=160, record=True, color_system=None)
    console.print(render(live.snapshot(2.0)))
    assert "HOST  STATE  MEMORY" not in console.export_text()          # no sample yet: no host rows
    assert live.step() == 5
    hosts = sample(1.0, **SWAPPING)
    hosts[1] = HostTelemetry("h3", "unreachable", "connection refused", 1.0)
    live.hosts_seen(hosts, 1.5)
    console = Console(width=160, record=True, color_system=None)
    console.print(render(live.snapshot(4.0)))
    text = console.export_text().splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("hosts: "))
    assert text[at] == "hosts: 2, sampled 2s ago" and at > 3                  # under the job line and both ranks
    assert text[at + 1].split() == ["HOST", "STATE", "MEMORY", "PRESSURE", "SWAP", "LOAD", "GPU", "THERMAL", "FLAGS"]
    assert text[at + 2].split() == ["h1", "ok", "20.0/32.0", "GiB", "62%", "normal", "0.0/2.0", "GiB", "2.00/10",
                                    "30%", "nominal"]
    assert text[at + 3].split() == ["h3", "unreachable", "connection", "refused"]


@pytest.mark.parametrize("figures,style", [(NORMAL, ""), (SWAPPING, "bold red")])
def test_a_flagged_host_is_styled_as_top_styles_it(figures, style):
    from clusterctl.cli import hosttable

    (_, header_style), (line, row_style) = hosttable.lines([assess(HostTelemetry("h1", taken=1.0, **figures))],
                                                           hosttable.PANEL_COLUMNS)
    assert header_style == "dim" and row_style == style
    assert ("memory pressure warn" in line) is (style != "")
