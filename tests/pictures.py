"""Reading back the images clusterctl draws (plot -o, bench --png, setup network --png) in tests: the pixels of a
PNG, how much of it is drawn, how many pixels are one colour. Needs matplotlib (the test extra has it)."""
import matplotlib.image
import numpy as np


def read(path) -> np.ndarray:
    """The PNG at `path` as rows of RGB in 0..1 (shape: height, width, 3), after checking that it is a PNG."""
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", path
    return matplotlib.image.imread(str(path))[:, :, :3]


def share_drawn(image: np.ndarray) -> float:
    """The share of pixels that are not the white background."""
    return float((image.min(axis=2) < 0.97).mean())


def count(image: np.ndarray, colour: str) -> int:
    """How many pixels are `colour` ("#rrggbb"), give or take a little antialiasing."""
    rgb = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(image - rgb).max(axis=2) < 0.03).sum())
