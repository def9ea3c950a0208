"""How the CLI prints: tables, sizes, one-line errors, per-host outcomes, and progress bars drawn in place."""
from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..hosts.fanout import HostOutcome



def table(rows: list[dict], columns: list[str]) -> None:
    for line in table_lines(rows, columns):
        click.echo(line)


def table_lines(rows: list[dict], columns: list[str]) -> list[str]:
    """A header (the column names in capitals) and one line per row, each column as wide as its widest."""
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in columns}
    return ["  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip()] + [
        "  ".join(str(r[c]).ljust(widths[c]) for c in columns).rstrip() for r in rows]


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def stored_line(prefix: str, host: str, entry, path: str) -> str:
    """What a host's model store did with a model a command pushed (`entry`: transfer.models.StoreEntry; None for
    this machine, which reads the model where it is)."""
    if entry is None:
        return f"{prefix}: {host} is this machine: it reads the model where it is ({path})"
    if entry.reused:
        return f"{prefix}: {host} has it already in its store ({entry.path}): no model bytes moved"
    return f"{prefix}: {host}: {size(entry.sent_bytes)} sent, verified, in its store ({entry.path})"


def one_line(error: BaseException) -> str:
    text = str(error)
    # ConnectError / CommandTimeout already name the host; the prefix does too.
    host = getattr(error, "host", None)
    if host and text.startswith(f"{host}: "):
        text = text[len(host) + 2:]
    return " ".join(text.split())


def outcome_json(o: HostOutcome) -> dict:
    r = o.value
    return {"host": o.host.name, "rank": o.host.rank, "ok": o.ok, "elapsed_s": round(o.elapsed_s, 3),
            "exit_code": getattr(r, "exit_code", None), "stdout": getattr(r, "stdout", ""),
            "stderr": getattr(r, "stderr", ""), "error": str(o.error) if o.error else None}


def print_outcome(o: HostOutcome) -> None:
    prefix = f"[{o.host.rank} {o.host.name}]"
    if o.error is not None:
        click.secho(f"{prefix} error: {one_line(o.error)}", fg="red", err=True)
        return
    for line in o.value.stdout.splitlines():
        click.echo(f"{prefix} {line}")
    for line in o.value.stderr.splitlines():
        click.echo(f"{prefix} {line}", err=True)
    if not o.value.ok:
        click.secho(f"{prefix} exited {o.value.exit_code}", fg="red", err=True)


class Bars:
    """Progress bars redrawn in place, one line per name: the hosts of a transfer, the phases of `data
    prepare`. Drawn only on a terminal, and only once some total reaches `threshold` (small transfers
    print just their summary). A total of None (not known yet) shows the count alone."""

    WIDTH = 30
    LARGE = 4 * 1024 * 1024          # a transfer this large gets bars; smaller ones only their summary

    def __init__(self, names=(), *, err: bool = False, threshold: int = 0, unit: str = "bytes"):
        self.names = list(names)
        self.err, self.threshold, self.unit = err, threshold, unit
        self.state: dict[str, tuple[int, int | None]] = {}
        self.notes: dict[str, str] = {}           # shown after a name's bar: a transfer's rate and time left
        self.lock = threading.Lock()
        self.drawn = 0
        self.last = 0.0

    @classmethod
    def on_terminal(cls, names=(), *, err: bool = False, **kwargs) -> "Bars | None":
        stream = sys.stderr if err else sys.stdout
        return cls(names, err=err, **kwargs) if stream.isatty() else None

    def update(self, name: str, done: int, total: int | None, note: str = "") -> None:
        with self.lock:
            if name not in self.names:
                self.names.append(name)
            self.state[name] = (done, total)
            self.notes[name] = note
            if not any((t or 0) >= self.threshold for _, t in self.state.values()):
                return
            now = time.monotonic()
            if now - self.last < 0.1 and (total is None or done < total):
                return
            self.last = now
            self._draw()

    def _amount(self, n: int) -> str:
        return size(n) if self.unit == "bytes" else f"{n:,}"

    def _draw(self) -> None:
        width = max(len(n) for n in self.names)
        lines = []
        for name in self.names:
            done, total = self.state.get(name, (0, 0))
            if total is None:
                lines.append(f"{name.ljust(width)} {self._amount(done)}")
                continue
            frac = done / total if total else 0.0
            bar = "#" * int(frac * self.WIDTH)
            note = self.notes.get(name)
            lines.append(f"{name.ljust(width)} [{bar.ljust(self.WIDTH)}] {frac * 100:3.0f}% "
                         f"{self._amount(done)} / {self._amount(total)}" + (f", {note}" if note else ""))
        if self.drawn:
            click.echo(f"\x1b[{self.drawn}A", nl=False, err=self.err)
        for line in lines:
            click.echo("\x1b[2K" + line, err=self.err)
        self.drawn = len(lines)

    def close(self) -> None:
        with self.lock:
            if self.drawn:
                self._draw()


class TransferProgress:
    """Each host's progress in a long copy (a model pushed to the hosts' stores, run's project copy, a fetch), as
    the copy reports it (host, bytes done, bytes total). On a terminal: a line per host redrawn in place, with the
    rate and the time left. Otherwise: a plain line per host still copying every `every` seconds, then one when it
    ends. Either way, a host that has moved nothing for `stall` seconds is named once (which host, how far), not
    left silent. Only copies of `threshold` bytes or more are shown, a host only once it has moved a byte (a total
    may be an upper bound: rsync's copy of a project that is mostly there already moves less, and its last report,
    (moved, moved), is the truth), and a quick copy not at all: no bar before QUICK seconds, no line at its end
    unless it lasted `every` seconds. `draw`: the Bars to draw into (several copies at once share one block);
    `clock`, `say` and `draw`: injected by the tests."""

    QUICK = 1.0

    def __init__(self, prefix: str, *, terminal: bool | None = None, every: float = 5.0, stall: float = 30.0,
                 threshold: int = Bars.LARGE, clock=time.monotonic, say=None, draw=None):
        self.prefix, self.every, self.stall, self.threshold, self.clock = prefix, every, stall, threshold, clock
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.say = say or (lambda line: click.echo(line, err=True))
        self.bars = draw if draw is not None else (Bars(err=True, threshold=threshold) if self.terminal else None)
        self.lock = threading.Lock()
        self.hosts: dict[str, dict] = {}
        self.last_said = clock()
        self._ticker = None

    def start(self) -> "TransferProgress":
        """Tick once a second (hosts/fanout.py's Ticker: a stalled copy reports nothing to wake it)."""
        from ..hosts.fanout import Ticker

        self._ticker = Ticker(self.tick, 1.0)
        return self

    def update(self, host: str, done: int, total: int) -> None:
        now = self.clock()
        with self.lock:
            h = self.hosts.setdefault(host, {"began": now, "done": 0, "moved_at": now, "stalled": False,
                                             "total": total, "ended": False, "drawn": False})
            if done != h["done"]:
                h["moved_at"], h["stalled"] = now, False
            h["done"], h["total"] = done, total
            if self.bars is not None and (h["drawn"] or (done > 0 and total >= self.threshold
                                                          and now - h["began"] >= self.QUICK)):
                h["drawn"] = True
                self.bars.update(f"{self.prefix}: {host}", done, total, self._pace(h, now))
            if done >= total and not h["ended"]:
                h["ended"] = True
                if self.bars is None and total >= self.threshold and now - h["began"] >= self.every:
                    self.say(self.line(host, now))

    def tick(self) -> None:
        """The periodic lines (not on a terminal) and the stalled hosts: called once a second."""
        now = self.clock()
        with self.lock:
            copying = [n for n, h in self.hosts.items() if not h["ended"] and h["total"] >= self.threshold]
            for name in copying:
                h = self.hosts[name]
                if not h["stalled"] and now - h["moved_at"] >= self.stall:
                    h["stalled"] = True
                    self.say(f"{self.prefix}: {name}: no progress for {now - h['moved_at']:.0f} s (at "
                             f"{size(h['done'])} of {size(h['total'])}): the copy to {name} is stuck or very slow")
            moving = [name for name in copying if self.hosts[name]["done"] > 0]
            if self.bars is None and moving and now - self.last_said >= self.every:
                self.last_said = now
                for name in moving:
                    self.say(self.line(name, now))

    @staticmethod
    def _pace(h: dict, now: float) -> str:
        """The rate so far and, while copying, the time left at that rate."""
        rate = h["done"] / max(now - h["began"], 1e-6)
        if h["done"] >= h["total"] or rate <= 0:
            return f"{size(rate)}/s"
        return f"{size(rate)}/s, {(h['total'] - h['done']) / rate:.0f} s left"

    def line(self, host: str, now: float) -> str:
        h = self.hosts[host]
        done, total = h["done"], h["total"]
        if done >= total:
            return f"{self.prefix}: {host}: {size(total)} copied, {self._pace(h, now)}"
        return (f"{self.prefix}: {host}: {size(done)} of {size(total)} ({100 * done / total if total else 0:.0f}%), "
                f"{self._pace(h, now)}")

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
        if self.bars is not None:
            self.bars.close()

