"""Images drawn with matplotlib, the optional `plot` extra, imported only when an image is asked for:
`plot -o` (observe/plot.py), `bench --png` (bench/picture.py), `setup network --png` (setup/picture.py).

    check("bench --png")                        # before any work: MissingExtra (exit 2) naming the extra
    fig = new((1000, 600), "bench --png")       # exactly 1000 x 600 pixels, an Agg canvas: no pyplot, no display
    ...draw on fig...
    save(fig, "bench.png")                      # a temporary name beside it, then a rename: never half written
"""
from __future__ import annotations

import os

from .atomic import replacing
from .errors import MissingExtra

INSTALL = "pip install matplotlib"
DPI = 100


def check(needs: str):
    """matplotlib's (Figure, FigureCanvasAgg); MissingExtra, one line naming `needs` (what asked for the image)
    and the extra to install, when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtra(f"{needs} needs matplotlib, which is not installed: {INSTALL}") from None
    return Figure, FigureCanvasAgg


def new(size: tuple[int, int], needs: str):
    """An empty figure of size[0] x size[1] pixels with its own Agg canvas (no global state)."""
    Figure, FigureCanvasAgg = check(needs)
    fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def save(fig, path: str, fmt: str | None = None) -> str:
    """Write `fig` into `path` atomically, in `fmt` (default: from the path's extension, else PNG); its directory
    is made when missing. Returns `path`."""
    fmt = fmt or os.path.splitext(path)[1][1:].lower() or "png"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=DPI, format=fmt)
    return path
