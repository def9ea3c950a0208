"""run's live panel: observe/live.py's snapshot, drawn with rich under the scrolling `[rank N host]` lines.

rich's Live keeps the panel at the bottom of the terminal: a line printed through its console goes above
the panel, whole, and the panel is redrawn from rich's own timer (REFRESH_PER_S) at the terminal's current
width and height, so a resize is redrawn at the next tick. rich is imported only when a panel is shown.
"""
from __future__ import annotations

import sys
import time

from ..observe.live import LiveRun, Snapshot

REFRESH_PER_S = 4
STATE_STYLE = {"starting": "yellow", "running": "green", "finished": "dim", "failed": "bold red"}


def wanted(plain: bool) -> bool:
    """The panel is drawn only on a terminal: stdout and stderr both a tty, and no --plain."""
    return not plain and sys.stdout.isatty() and sys.stderr.isatty()


class Panel:
    def __init__(self, live: LiveRun):
        from rich.console import Console
        from rich.live import Live

        self.state = live
        self.console = Console(highlight=False, markup=False, emoji=False)
        self.live = Live(console=self.console, get_renderable=self._render, refresh_per_second=REFRESH_PER_S,
                         transient=False, redirect_stdout=True, redirect_stderr=True)
        self.live.start()

    def print(self, text: str) -> None:
        """One output line, above the panel (rank stderr too: the panel owns the terminal while it runs)."""
        self.console.out(text, highlight=False)

    def stop(self) -> None:
        """The last state stays on screen; the cursor is shown again."""
        self.live.stop()

    def _render(self):
        return render(self.state.snapshot(time.monotonic()))


def render(snap: Snapshot):
    """The panel for one snapshot: a line for the job, a row per rank."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    job = snap.job
    parts = [f"elapsed {clock(job.elapsed_s)}"]
    if job.step is not None:
        parts.append(f"step {job.step}" + (f"/{job.total_steps}" if job.total_steps else ""))
    parts.append(f"ETA {clock(job.eta_s)}" if job.eta_s is not None else "ETA -")
    if job.tokens_per_s is not None:
        parts.append(f"{job.tokens_per_s:,.0f} tok/s")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
    for name in ("rank", "host", "state", "step", "loss", "tok/s", "peak mem", "heartbeat", "lines/s"):
        table.add_column(name, justify="left" if name in ("host", "state") else "right", no_wrap=True)
    for r in snap.ranks:
        step = "-" if r.step is None else f"{r.step}" + (f"/{r.total_steps}" if r.total_steps else "")
        table.add_row(str(r.rank), r.host, Text(r.state, style=STATE_STYLE.get(r.state, "")), step,
                      _num(r.loss, "{:.4f}"), _num(r.tokens_per_s, "{:,.0f}"), _num(r.peak_mem_mb, "{:,.1f} MB"),
                      _num(r.since_seen_s, "{:.1f}s ago"), f"{r.lines_per_s:.1f}")
    return Group(Text("job: " + "  ".join(parts), style="bold"), table)


def clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
