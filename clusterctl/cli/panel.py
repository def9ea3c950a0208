"""run's live panel: observe/live.py's snapshot, drawn with rich under the scrolling `[rank N host]` lines.

rich's Live keeps the panel at the bottom of the terminal: what is printed through its console goes above
the panel, whole, and the panel is redrawn at the terminal's current width and height (a resize is drawn at
the next tick). Everything is written from rich's own timer thread, REFRESH_PER_S times a second: the
output lines that arrived since the last tick in one write, then the panel once. Redrawing the panel under
each line instead costs about a millisecond of CPU per line (benchmarks/RESULTS.md). This module imports
rich; cli/printedrun.py imports it only when a panel is drawn.

Under the ranks, once the first sample of the hosts' telemetry is in (run samples it every few seconds:
observe/hostwatch.py), a row per host: memory, pressure, swap, load, GPU and heat, as `clusterctl top` draws them
(cli/hosttable.py), a swapping or throttled host in bold red, one that does not answer in red.
"""
from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.live import Live
from rich.segment import Segment
from rich.text import Text

from ..observe.live import LiveRun, Snapshot
from . import hosttable
from .console import table_lines

REFRESH_PER_S = 4
# "share": the rank's part of the global batch, shown when a rank reports one (the bundled trainer's balancing)
COLUMNS = ["rank", "host", "state", "step", "loss", "tok/s", "share", "peak mem", "heartbeat", "lines/s"]
STATE_STYLE = {"starting": "yellow", "running": "", "behind": "bold yellow", "finished": "dim", "failed": "red"}


class Panel:
    def __init__(self, live: LiveRun):
        self.state = live
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self.live = _Live(self._take_lines, console=Console(highlight=False, markup=False, emoji=False),
                          get_renderable=self._render, refresh_per_second=REFRESH_PER_S, transient=False)
        self.live.start()

    def print(self, text: str) -> None:
        """One output line (rank stderr too: the panel owns the terminal while it runs), shown above the
        panel at the next tick."""
        with self._lock:
            self._pending.append(text)

    def stop(self) -> None:
        """The lines still queued are printed, the last state stays on screen, the cursor is shown again."""
        self.live.stop()

    def _take_lines(self) -> list[str]:
        with self._lock:
            lines, self._pending = self._pending, []
        return lines

    def _render(self):
        return render(self.state.snapshot(time.monotonic()))


class _Live(Live):
    """rich's Live that, at each refresh, first prints the lines queued since the last one."""

    def __init__(self, take_lines, **kwargs):
        super().__init__(**kwargs)
        self._take_lines = take_lines

    def refresh(self) -> None:
        lines = self._take_lines()
        if lines:
            self.console.print(_Lines(lines), crop=False, soft_wrap=True)
        super().refresh()


class _Lines:
    """Lines written as they are: no markup, no wrapping by rich (the terminal wraps a long one)."""

    def __init__(self, lines: list[str]):
        self.lines = lines

    def __rich_console__(self, console, options):
        for line in self.lines:
            yield Segment(line)
            yield Segment.line()


class Cropped:
    """Styled lines, each cut at the terminal's width (a wrapped line would push the panel up)."""

    def __init__(self, lines: list[tuple[str, str]]):
        self.lines = lines

    def __rich_console__(self, console, options):
        for line, style in self.lines:
            text = Text(line, style=style)
            text.truncate(options.max_width, overflow="ellipsis")
            yield text


def render(snap: Snapshot) -> Cropped:
    """The panel for one snapshot: a line for the job, a header, a row per rank (plain columns: a rich
    Table costs about 20 times as much to draw, 4 times a second), then the hosts' rows (host_lines)."""
    job = snap.job
    parts = [f"elapsed {clock(job.elapsed_s)}"]
    if job.step is not None:
        parts.append(f"step {job.step}" + (f"/{job.total_steps}" if job.total_steps else ""))
    parts.append(f"ETA {clock(job.eta_s)}" if job.eta_s is not None else "ETA -")
    if job.tokens_per_s is not None:
        parts.append(f"{job.tokens_per_s:,.0f} tok/s")
    rows = [{"rank": r.rank, "host": r.host, "state": r.state,
             "step": "-" if r.step is None else f"{r.step}" + (f"/{r.total_steps}" if r.total_steps else ""),
             "loss": _num(r.loss, "{:.4f}"), "tok/s": _num(r.tokens_per_s, "{:,.0f}"), "share": _num(r.share, "{:.0%}"),
             "peak mem": _num(r.peak_mem_mb, "{:,.1f} MB"), "heartbeat": _num(r.since_seen_s, "{:.1f}s ago"),
             "lines/s": f"{r.lines_per_s:.1f}"} for r in snap.ranks]
    shown = COLUMNS if any(r.share is not None for r in snap.ranks) else [c for c in COLUMNS if c != "share"]
    header, *lines = table_lines(rows, shown)
    return Cropped([("job: " + "  ".join(parts), "bold"), (header, "dim")]
                   + [(line, STATE_STYLE.get(r.state, "")) for r, line in zip(snap.ranks, lines)]
                   + host_lines(snap))


def host_lines(snap: Snapshot) -> list[tuple[str, str]]:
    """The hosts' rows under the ranks (none before the first sample): a line saying how old the sample is, a
    header, a row per host."""
    hosts = list(snap.hosts)
    if not hosts:
        return []
    age = "" if snap.hosts_age_s is None else f", sampled {snap.hosts_age_s:.0f}s ago"
    return [(f"hosts: {len(hosts)}{age}", "bold")] + hosttable.lines(hosts, hosttable.PANEL_COLUMNS)


def clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
