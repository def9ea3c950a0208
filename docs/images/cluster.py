"""docs/images/cluster.png, the README's picture of a cluster: this machine, the hosts, SSH from here to each,
the data plane between the hosts, rank 0. Drawn with matplotlib (the `plot` extra):

    .venv/bin/python docs/images/cluster.py          # writes docs/images/cluster.png beside this file
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SSH, PLANE, BOX, TEXT = "#4a78b5", "#d9822b", "#f3f5f8", "#1f2933"


def box(ax, x, y, w, h, title, lines, edge="#9aa5b1"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=BOX, ec=edge, lw=1.4))
    ax.text(x + w / 2, y + h - 0.22, title, ha="center", va="top", fontsize=11, weight="bold", color=TEXT)
    for i, line in enumerate(lines):
        ax.text(x + w / 2, y + h - 0.58 - 0.27 * i, line, ha="center", va="top", fontsize=8.5, color=TEXT)


def arrow(ax, a, b, color, style="-|>", lw=1.6, rad=0.0, ls="-"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, color=color, lw=lw, ls=ls,
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))


def main() -> None:
    fig, ax = plt.subplots(figsize=(10, 4.6), dpi=100)
    ax.set_xlim(0, 10.4)
    ax.set_ylim(-0.45, 4.8)
    ax.axis("off")
    box(ax, 3.7, 3.25, 3.0, 1.45, "this machine", ["clusterctl run / serve / doctor", "inventory.yaml, runs/<id>/"])
    xs, y, w, h = [0.2, 2.85, 5.5, 8.15], 0.95, 2.05, 1.55
    for i, x in enumerate(xs):
        lines = ["rank 0 (the job's leader)" if i == 0 else f"rank {i}", "workdir, model store", "Python + MLX"]
        box(ax, x, y, w, h, f"mac{i + 1}", lines, edge=PLANE if i == 0 else "#9aa5b1")
        arrow(ax, (5.2 + (i - 1.5) * 0.5, 3.22), (x + w / 2, y + h + 0.04), SSH)
    for a, b in zip(xs, xs[1:]):               # the data plane: neighbours on a Thunderbolt ring ...
        arrow(ax, (a + w + 0.03, y + h / 2), (b - 0.03, y + h / 2), PLANE, style="<|-|>", lw=2.4)
    arrow(ax, (xs[-1] + w / 2, y - 0.04), (xs[0] + w / 2, y - 0.04), PLANE, style="<|-|>", lw=2.4, rad=-0.12)
    ax.text(5.2, -0.2, "data plane (Thunderbolt or Ethernet, each host's `address`): the ranks' collectives, the "
            "relayed model", ha="center", va="center", fontsize=9, color=PLANE, weight="bold",
            bbox={"fc": "white", "ec": "none", "pad": 1.5})
    ax.text(6.9, 4.0, "SSH from here: check, copy,\nlaunch, watch, stop", ha="left", va="center", fontsize=9,
            color=SSH, weight="bold")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "cluster.png"), metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    main()
