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
        self.lock = threading.Lock()
        self.drawn = 0
        self.last = 0.0

    @classmethod
    def on_terminal(cls, names=(), *, err: bool = False, **kwargs) -> "Bars | None":
        stream = sys.stderr if err else sys.stdout
        return cls(names, err=err, **kwargs) if stream.isatty() else None

    def update(self, name: str, done: int, total: int | None) -> None:
        with self.lock:
            if name not in self.names:
                self.names.append(name)
            self.state[name] = (done, total)
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
            lines.append(f"{name.ljust(width)} [{bar.ljust(self.WIDTH)}] {frac * 100:3.0f}% "
                         f"{self._amount(done)} / {self._amount(total)}")
        if self.drawn:
            click.echo(f"\x1b[{self.drawn}A", nl=False, err=self.err)
        for line in lines:
            click.echo("\x1b[2K" + line, err=self.err)
        self.drawn = len(lines)

    def close(self) -> None:
        with self.lock:
            if self.drawn:
                self._draw()
