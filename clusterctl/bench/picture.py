"""`bench --png FILE`: bench's report (the document `--json` prints) as one image (matplotlib, the `plot` extra).

    write_png(doc, "bench.png")     # doc["rows"]: bandwidth by size; doc["p2p"]: the host-pair heat map

Bandwidth by size: bus bandwidth (GB/s, the figure to compare with a link's speed: report.py) against the message
size on a log axis, one line per collective (a colour each) and implementation (MLX solid, raw mpi4py dashed).
Point to point: sender (row) by receiver (column), GB/s written in each cell; the diagonal and the pairs a ring
does not measure are left blank. With both in `doc`, the two panels side by side.
"""
from __future__ import annotations

import math

from .. import figure
from ..errors import UsageError
from .report import format_bytes

NEEDS = "bench --png"
PANEL = (1000, 600)             # pixels per panel
OP_COLOURS = {"all_sum": "#1f77b4", "all_gather": "#d62728"}
IMPL_STYLES = {"mlx": "-", "mpi4py": "--"}


def write_png(doc: dict, path: str) -> str:
    """Draw `doc`'s collectives and/or p2p matrix into `path` (PNG, written whole or not at all)."""
    panels = [k for k in ("rows", "p2p") if doc.get(k)]
    if not panels:
        raise UsageError("bench --png: nothing measured to draw")
    fig = figure.new((PANEL[0] * len(panels), PANEL[1]), NEEDS)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        (_sizes if panel == "rows" else _matrix)(ax, doc)
    fig.tight_layout()
    return figure.save(fig, path, "png")


def _where(doc: dict) -> str:
    world = doc.get("world", doc.get("world_size"))
    hosts = doc.get("hosts") or []
    return f"{doc.get('backend', '?')}, {world} ranks on {len(hosts)} hosts" if world else str(doc.get("backend", "?"))


def _sizes(ax, doc: dict) -> None:
    rows = doc["rows"]
    for op in dict.fromkeys(r["op"] for r in rows):
        for impl in dict.fromkeys(r["impl"] for r in rows if r["op"] == op):
            mine = sorted((r["bytes"], r["busbw_gbs"]) for r in rows if r["op"] == op and r["impl"] == impl)
            label = f"{op} ({'MLX over ' + doc.get('backend', '?') if impl == 'mlx' else impl})"
            ax.plot(*zip(*mine), color=OP_COLOURS.get(op, "#2ca02c"), linestyle=IMPL_STYLES.get(impl, ":"),
                    marker="o", markersize=4, linewidth=2, label=label)
    sizes = sorted({r["bytes"] for r in rows})
    ax.set_xscale("log", base=2)
    step = max(1, math.ceil(len(sizes) / 12))            # at most a dozen size labels
    ax.set_xticks(sizes[::step], [format_bytes(s) for s in sizes[::step]])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth, GB/s")
    ax.set_title(f"bandwidth by size: {_where(doc)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _matrix(ax, doc: dict) -> None:
    p2p = doc["p2p"]
    hosts, matrix = p2p["hosts"], p2p["matrix"]
    n = len(hosts)
    values = [[math.nan if i == j or v is None else v for j, v in enumerate(row)] for i, row in enumerate(matrix)]
    measured = [v for row in values for v in row if not math.isnan(v)]
    top = max(measured, default=1.0) or 1.0
    image = ax.imshow(values, cmap="viridis", vmin=0, vmax=top)
    ax.figure.colorbar(image, ax=ax, label="GB/s")
    for i in range(n):
        for j in range(n):
            v = values[i][j]
            text = "-" if i == j else "n/a" if math.isnan(v) else f"{v:.2f}"
            dark = not math.isnan(v) and v < 0.6 * top              # viridis is dark at its low end
            ax.text(j, i, text, ha="center", va="center", fontsize="large" if n <= 6 else "small",
                    color="white" if dark else "black")
    ax.set_xticks(range(n), hosts, rotation=30 if n > 4 else 0)
    ax.set_yticks(range(n), hosts)
    ax.set_xlabel("receiver")
    ax.set_ylabel("sender")
    size = f"{format_bytes(p2p['bytes'])} messages, " if p2p.get("bytes") else ""
    ax.set_title(f"point to point: {size}{p2p.get('backend', doc.get('backend', '?'))}")
