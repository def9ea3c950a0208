"""`setup network --png FILE`: the cable plan as a picture (matplotlib, the `plot` extra; no Graphviz).

    write_png(plan, "cables.png")

Each Mac is a box (its name, the `address` the plan gives it) on a circle in inventory order, clockwise from the
top; each Thunderbolt cable a line between two boxes, with the interface and the address at each end written near
that end; the link speed in the title, or by colour (a legend) when the cables differ. For a ring the cables the
ranks use are drawn bold with an arrow from each host to the next (rank order), a cable the ring does not use thin
and dashed; for jaccl every cable is used. The backend and why, and the notes (ports holding a drive, a Mac outside
the inventory), go above and below.
"""
from __future__ import annotations

import math

from .. import figure
from ..launch import backends
from .topology import Plan, gbps

NEEDS = "setup network --png"
SIZE = (1000, 800)
HOST_COLOUR, SPARE = "#dbe9f6", "#b0a090"     # the spare cables: a colour no text or box edge blends into
SPEED_COLOURS = ["#1f77b4", "#ff7f0e", "#d62728", "#9467bd"]    # the fastest link's first, slower ones after
# how far from a Mac's centre its end of a cable is labelled (the circle's radius is 1): clear of its box, which is
# wider than it is tall
END_AT, BOX_HALF_WIDTH = 0.25, 0.45


def positions(hosts: list[str]) -> dict[str, tuple[float, float]]:
    """Each host's centre on the unit circle: inventory order, clockwise from the top (two: left and right)."""
    n = len(hosts)
    start = math.pi if n == 2 else math.pi / 2
    return {h: (math.cos(start - 2 * math.pi * i / n), math.sin(start - 2 * math.pi * i / n))
            for i, h in enumerate(hosts)}


def ring_cables(p: Plan) -> list:
    """The cables a ring's ranks use: host i's cable from host i-1 (the first of them when there are several)."""
    hosts = p.topology.hosts
    return [p.topology.between(hosts[i - 1], h)[0] for i, h in enumerate(hosts)]


def write_png(p: Plan, path: str, size: tuple[int, int] = SIZE) -> str:
    """Draw plan `p` into `path` (PNG, written whole or not at all), size[0] x size[1] pixels."""
    fig = figure.new(size, NEEDS)
    ax = fig.add_axes((0.02, 0.08, 0.96, 0.82))
    top = p.topology
    at = positions(top.hosts)
    xs, ys = [x for x, _ in at.values()], [y for _, y in at.values()]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.3, max(ys) + 0.3)
    ax.set_aspect("equal", adjustable="box")
    ax.axis("off")
    ring = backends.get(p.backend).neighbours_only
    used = set(ring_cables(p)) if ring else set(top.cables)
    speeds = sorted({c.speed for c in top.cables}, key=lambda v: -(gbps(v) or 0))   # fastest first
    colour = {v: SPEED_COLOURS[min(i, len(SPEED_COLOURS) - 1)] for i, v in enumerate(speeds)}
    for c in top.cables:
        twins = top.between(c.a, c.b)
        shift = (twins.index(c) - (len(twins) - 1) / 2) * 0.12      # side by side when two cables join a pair
        (ax0, ay0), (bx0, by0) = at[c.a], at[c.b]
        length = math.hypot(bx0 - ax0, by0 - ay0)
        nx, ny = -(by0 - ay0) / length * shift, (bx0 - ax0) / length * shift
        a, b = (ax0 + nx, ay0 + ny), (bx0 + nx, by0 + ny)
        on = c in used
        ax.plot([a[0], b[0]], [a[1], b[1]], color=colour[c.speed] if on else SPARE, linewidth=3 if on else 2,
                linestyle="-" if on else "--", zorder=1)
        t = min((END_AT + BOX_HALF_WIDTH * abs(b[0] - a[0]) / length) / length, 0.4)   # each end near its Mac
        for (x, y), (ox, oy), end, iface in ((a, b, p.subnets[c][0], c.a_iface), (b, a, p.subnets[c][1], c.b_iface)):
            ax.text(x + (ox - x) * t, y + (oy - y) * t, f"{iface}\n{end}", ha="center", va="center",
                    fontsize=8.5, zorder=3, bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.9})
    if len(speeds) > 1:                                # one speed for all is said once, in the title
        for v in speeds:
            ax.plot([], [], color=colour[v], linewidth=3, label=v or "speed unknown")
        ax.legend(loc="lower right", fontsize=9, title="link speed", title_fontsize=9)
    if ring and len(top.hosts) > 2:                # rank order: an arrow from each host towards the next
        for i, h in enumerate(top.hosts):
            _arrow(ax, at[h], at[top.hosts[(i + 1) % len(top.hosts)]])
    for h in top.hosts:
        x, y = at[h]
        ax.text(x, y, f"{h}\naddress {p.address.get(h, '?')}", ha="center", va="center", fontsize=11, zorder=4,
                bbox={"boxstyle": "round,pad=0.5", "fc": HOST_COLOUR, "ec": "#333333", "lw": 1.5})
    shape = "every pair cabled" if top.full_mesh() else "a ring" if top.ring_in_order() else "not a ring"
    speed = f", {next(iter(speeds))}" if len(speeds) == 1 and None not in speeds else ""
    title = f"Thunderbolt cables between {len(top.hosts)} Macs ({shape}{speed}); backend: {p.backend}"
    if ring:
        title += "\nring: " + " -> ".join(top.hosts + top.hosts[:1]) + " (bold: the cables the ring uses)"
    fig.text(0.5, 0.97, title, ha="center", va="top", fontsize=12)
    notes = [f"backend {p.backend}: {p.why}"] + [f"note: {n}" for n in top.notes]
    fig.text(0.02, 0.02, "\n".join(notes), ha="left", va="bottom", fontsize=9, color="#444444")
    return figure.save(fig, path, "png")


def _arrow(ax, start, end) -> None:
    """A small arrow beside the line start-end, pointing from start to end (the ring's direction), on the outside
    of the circle (left of the way clockwise), away from the cables' labels."""
    dx, dy = end[0] - start[0], end[1] - start[1]
    length = math.hypot(dx, dy)
    ox, oy = -dy / length * 0.2, dx / length * 0.2
    s = (start[0] + dx * 0.42 + ox, start[1] + dy * 0.42 + oy)
    e = (start[0] + dx * 0.58 + ox, start[1] + dy * 0.58 + oy)
    ax.annotate("", xy=e, xytext=s, zorder=2, arrowprops={"arrowstyle": "-|>", "color": "#333333", "lw": 1.5})
