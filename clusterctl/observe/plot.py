"""Training curves from metrics.jsonl: an image (PNG, SVG, PDF: matplotlib, the optional `plot` extra)
or a small text chart for the terminal (no dependency).

    curves = [Curves.of(info.run_id, read_metrics(info.dir)) for info in runs]
    write_image(curves, "loss.png", size=(960, 640))     # MissingExtra without matplotlib
    print("\\n".join(render_text(curves)))

The image has two panels sharing the step axis: training loss (solid) and held-out loss (dashed, dots)
above; tokens/s (solid) and peak memory (dotted, right axis) below. Run i is drawn in PALETTE[i].
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from statistics import median_high

from .. import figure
from ..errors import MissingExtra, UsageError

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
MARKS = "*o+x~^=:"           # run i's training loss in the text chart
VAL_MARKS = "#O%X$&@!"       # and its held-out loss
DEFAULT_SIZE = (960, 640)


@dataclass(frozen=True)
class Curves:
    label: str
    loss: list[tuple[int, float]]
    val_loss: list[tuple[int, float]]
    tokens_per_s: list[tuple[int, float]]
    peak_mem_mb: list[tuple[int, float]]

    @classmethod
    def of(cls, label: str, records: list[dict]) -> "Curves":
        def series(key):
            return [(int(r["step"]), float(r[key])) for r in records
                    if isinstance(r.get("step"), (int, float)) and isinstance(r.get(key), (int, float))
                    and math.isfinite(r[key])]
        return cls(label, series("loss"), series("val_loss"), series("tokens_per_s"), series("peak_mem_mb"))

    @property
    def empty(self) -> bool:
        return not (self.loss or self.val_loss)


def write_image(curves: list[Curves], path: str, size: tuple[int, int] = DEFAULT_SIZE) -> str:
    """Draw the curves into `path` (the format from its extension; written whole or not at all), exactly
    size[0] x size[1] pixels for a raster format. No pyplot: no global state, no display needed."""
    if not curves or all(c.empty for c in curves):
        raise UsageError("nothing to plot: no losses in metrics.jsonl")
    fig = figure.new(size, "plot -o")
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    memory = bottom.twinx()
    for i, c in enumerate(curves):
        colour = PALETTE[i % len(PALETTE)]
        if c.loss:
            top.plot(*zip(*c.loss), color=colour, linewidth=2, label=f"{c.label} train")
        if c.val_loss:
            top.plot(*zip(*c.val_loss), color=colour, linewidth=2, linestyle="--", marker="o",
                     label=f"{c.label} held-out")
        if c.tokens_per_s:
            bottom.plot(*zip(*c.tokens_per_s), color=colour, linewidth=1.5)
        if c.peak_mem_mb:
            memory.plot(*zip(*c.peak_mem_mb), color=colour, linewidth=1.5, linestyle=":")
    top.set_ylabel("loss")
    top.grid(alpha=0.3)
    top.legend(fontsize="small")
    bottom.set_xlabel("step")
    bottom.set_ylabel("tokens/s (solid)")
    memory.set_ylabel("peak memory MB (dotted)")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    return figure.save(fig, path)


def plot_run(run_dir: str, records: list[dict], label: str) -> str | None:
    """`run`'s loss.png: written when matplotlib is installed and there are losses, else nothing."""
    curves = Curves.of(label, records)
    if curves.empty:
        return None
    try:
        return write_image([curves], os.path.join(run_dir, "loss.png"))
    except MissingExtra:
        return None


def render_text(curves: list[Curves], width: int = 64, height: int = 14) -> list[str]:
    """Training loss (MARKS[i]) and held-out loss (VAL_MARKS[i]) of run i against step on a character
    grid, then one line per run: its marks, first and last loss, held-out, tokens/s, peak memory (pure)."""
    points = [(i, s, v, MARKS[i % len(MARKS)]) for i, c in enumerate(curves) for s, v in c.loss]
    points += [(i, s, v, VAL_MARKS[i % len(VAL_MARKS)]) for i, c in enumerate(curves) for s, v in c.val_loss]
    if not points:
        return ["nothing to plot: no losses in metrics.jsonl"]
    steps = [p[1] for p in points]
    values = [p[2] for p in points]
    s0, s1 = min(steps), max(steps)
    v0, v1 = min(values), max(values)
    grid = [[" "] * width for _ in range(height)]
    for _, s, v, mark in points:
        x = 0 if s1 == s0 else round((s - s0) / (s1 - s0) * (width - 1))
        y = 0 if v1 == v0 else round((v1 - v) / (v1 - v0) * (height - 1))
        grid[y][x] = mark
    label_width = max(len(f"{v1:.3f}"), len(f"{v0:.3f}"))
    lines = []
    for y, row in enumerate(grid):
        label = f"{v1:.3f}" if y == 0 else f"{v0:.3f}" if y == height - 1 else ""
        lines.append(f"{label.rjust(label_width)} |{''.join(row).rstrip()}")
    lines.append(" " * label_width + " +" + "-" * width)
    lines.append(" " * label_width + f"  step {s0}" + f"step {s1}".rjust(width - len(f"step {s0}")))
    for i, c in enumerate(curves):
        parts = [f"{MARKS[i % len(MARKS)]} {VAL_MARKS[i % len(VAL_MARKS)]} {c.label}",
                 c.loss and f"loss {c.loss[0][1]:.3f} -> {c.loss[-1][1]:.3f} at step {c.loss[-1][0]}",
                 c.val_loss and f"held-out {c.val_loss[-1][1]:.3f}",
                 c.tokens_per_s and f"{median_high(v for _, v in c.tokens_per_s):,.0f} tok/s (median)",
                 c.peak_mem_mb and f"peak mem {max(v for _, v in c.peak_mem_mb):,.1f} MB"]
        lines.append(" | ".join(p for p in parts if p))     # the parts a run has
    return lines
