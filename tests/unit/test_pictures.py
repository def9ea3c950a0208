"""The pictures: `bench --png` (clusterctl/bench/picture.py) drawn from bench's report on canned results, `setup network
--png` (clusterctl/setup/picture.py) from plans of the canned Macs of tests/fixtures/macos/thunderbolt/, and
clusterctl/figure.py under them (matplotlib only when asked for, the file written whole or not at all). Each image is
opened and read back: its size in pixels, how much of it is drawn, and the colours that say what was drawn. Then the
two commands through click, their measurement and the Macs' reports canned: the image beside the usual output, and
`--json` still one JSON document on stdout."""
import dataclasses
import json
import os
import sys

import pytest

pytest.importorskip("matplotlib")

from click.testing import CliRunner  # noqa: E402

from clusterctl import figure  # noqa: E402
from clusterctl.bench import picture as bench_picture  # noqa: E402
from clusterctl.bench.report import collective_rows, p2p_matrix, p2p_pairs  # noqa: E402
from clusterctl.cli.app import cli  # noqa: E402
from clusterctl.errors import MissingExtra, UsageError  # noqa: E402
from clusterctl.setup import picture as cable_picture  # noqa: E402
from clusterctl.setup import topology as t  # noqa: E402
from clusterctl.setup.network import NetworkResult  # noqa: E402
from pictures import count, read, share_drawn  # noqa: E402
from test_network_plan import mesh4, ring3  # noqa: E402

M = 1024**2
HOSTS = ["mac1", "mac2", "mac3", "mac4"]


def bench_doc(p2p: str | None = None, rows: bool = True) -> dict:
    """What `bench --json` prints for 4 hosts over mpi: rows of MLX and mpi4py from 1K to 64M, and/or p2p."""
    doc = {"inventory": "inventory.yaml", "backend": "mpi", "world_size": 4, "hosts": HOSTS}
    if rows:
        timed = [{"op": op, "impl": impl, "bytes": 2**k, "time_s": 2e-5 + 2**k / (8e9 * speed), "iters": 10}
                 for op in ("all_sum", "all_gather") for impl, speed in (("mlx", 1.0), ("mpi4py", 1.2))
                 for k in range(10, 27)]
        doc.update({"world": 4, "rows": collective_rows({"world": 4, "collectives": timed})})
    if p2p:
        pairs = p2p_pairs(HOSTS, neighbours_only=p2p == "ring")
        result = {"world": 4, "p2p": [{"src": s, "dst": d, "bytes": 10**9, "time_s": 0.1 * (1 + (3 * s + d) % 5)}
                                      for s, d in pairs]}
        doc["p2p"] = {"backend": p2p, "bytes": 16 * M, **p2p_matrix(result, HOSTS)}
    return doc


def test_bench_draws_one_line_per_collective_and_implementation(tmp_path):
    path = bench_picture.write_png(bench_doc(), str(tmp_path / "bench.png"))
    image = read(path)
    assert image.shape[:2] == (600, 1000)                        # height, width
    assert share_drawn(image) > 0.03
    for op, colour in bench_picture.OP_COLOURS.items():          # MLX's line and mpi4py's, a colour per op
        assert count(image, colour) > 1500, op
    assert os.listdir(tmp_path) == ["bench.png"]                 # no temporary file left beside it


def test_bench_p2p_is_a_heat_map_with_a_cell_per_pair_and_both_panels_side_by_side(tmp_path):
    only = read(bench_picture.write_png(bench_doc("mpi", rows=False), str(tmp_path / "p2p.png")))
    assert only.shape[:2] == (600, 1000) and share_drawn(only) > 0.25
    assert count(only, "#fde725") > 3000          # viridis at its top: the fastest pairs' cells (10 GB/s)
    both = read(bench_picture.write_png(bench_doc("ring"), str(tmp_path / "both.png")))
    assert both.shape[:2] == (600, 2000)
    left, right = both[:, :1000], both[:, 1000:]
    assert count(left, bench_picture.OP_COLOURS["all_sum"]) > 1500 and count(right, "#fde725") > 3000
    assert count(right, bench_picture.OP_COLOURS["all_sum"]) == 0


def test_bench_with_nothing_measured_draws_nothing(tmp_path):
    with pytest.raises(UsageError, match="nothing measured to draw"):
        bench_picture.write_png({"backend": "mpi", "rows": []}, str(tmp_path / "x.png"))
    assert os.listdir(tmp_path) == []


def test_a_ring_of_three_is_drawn_with_every_cable_the_ring_uses(tmp_path):
    p = t.plan(ring3())
    image = read(cable_picture.write_png(p, str(tmp_path / "cables.png")))
    assert image.shape[:2] == (800, 1000) and share_drawn(image) > 0.04
    assert count(image, cable_picture.HOST_COLOUR) > 15000        # three boxes
    assert count(image, cable_picture.SPEED_COLOURS[0]) > 2000    # three bold cables, one speed
    assert count(image, cable_picture.SPARE) < 50                 # none spare


def test_a_mesh_asked_for_a_ring_draws_the_unused_diagonals_dashed(tmp_path):
    ring = read(cable_picture.write_png(t.plan(mesh4(), "ring"), str(tmp_path / "ring.png")))
    jaccl = read(cable_picture.write_png(t.plan(mesh4()), str(tmp_path / "jaccl.png")))
    assert count(ring, cable_picture.SPARE) > 200 and count(jaccl, cable_picture.SPARE) < 50
    assert count(jaccl, cable_picture.SPEED_COLOURS[0]) > count(ring, cable_picture.SPEED_COLOURS[0])


def test_cables_of_different_speeds_get_a_colour_each(tmp_path):
    p = t.plan(mesh4())
    slow = dataclasses.replace(p.topology.cables[1], speed="40 Gb/s")
    p.subnets = {(slow if c == p.topology.cables[1] else c): ends for c, ends in p.subnets.items()}
    p.topology.cables[1] = slow
    image = read(cable_picture.write_png(p, str(tmp_path / "mixed.png"), size=(700, 600)))
    assert image.shape[:2] == (600, 700)
    assert count(image, cable_picture.SPEED_COLOURS[1]) > 500      # the slow one, and its legend swatch


def test_the_image_is_whole_or_not_there(tmp_path, monkeypatch):
    path = tmp_path / "cables.png"
    path.write_bytes(b"the picture before")

    def broken(self, fname, **kw):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG half of it")
        raise OSError("disk full")

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        cable_picture.write_png(t.plan(ring3()), str(path))
    assert path.read_bytes() == b"the picture before" and os.listdir(tmp_path) == ["cables.png"]


def test_without_matplotlib_the_error_names_what_asked_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)     # import fails as if absent
    with pytest.raises(MissingExtra) as e:
        figure.check("bench --png")
    assert str(e.value) == "bench --png needs matplotlib, which is not installed: pip install matplotlib"
    assert e.value.exit_code == 2


# ---- the commands, with the measurement and the Macs' reports canned (the real ones: tests/ssh/) ----------

INVENTORY = ("hosts:\n  - name: mac1\n    address: 10.255.255.1\n  - name: mac2\n    address: 10.255.255.2\n"
             "  - name: mac3\n    address: 10.255.255.3\n")


class CannedBench:
    """bench's measurements as tests/unit/test_pictures.py cans them; no launch."""

    def __init__(self, connector, backend, deadline_s=600.0, say=None):
        self.backend = backend

    def collectives(self, sizes, ops, mpi4py=True):
        doc = bench_doc()
        return {"world": doc["world"], "backend": self.backend, "rows": doc["rows"]}

    def point_to_point(self, nbytes):
        return bench_doc("mpi", rows=False)["p2p"]


@pytest.fixture
def canned(tmp_path, monkeypatch):
    monkeypatch.setattr("clusterctl.cli.app.connector", lambda *a, **kw: None)
    monkeypatch.setattr("clusterctl.bench.measure.Bench", CannedBench)
    monkeypatch.setattr("clusterctl.setup.network.setup_network",
                        lambda connector, backend, subnet, **kw: NetworkResult({}, plan=t.plan(ring3())))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    return str(inventory)


def test_bench_json_and_png_both(canned, tmp_path):
    out = tmp_path / "pics" / "bench.png"                     # its folder is made
    r = CliRunner().invoke(cli, ["bench", "--hosts", canned, "--backend", "mpi", "--json", "--png", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {x["impl"] for x in doc["rows"]} == {"mlx", "mpi4py"}
    assert f"wrote {out}" in r.stderr
    image = read(out)
    assert image.shape[:2] == (600, 1000) and share_drawn(image) > 0.03
    r = CliRunner().invoke(cli, ["bench", "--hosts", canned, "--p2p", "--png", str(tmp_path / "p2p.png")])
    assert r.exit_code == 0 and r.stdout.startswith("GB/s, sender (row)"), r.output
    assert share_drawn(read(tmp_path / "p2p.png")) > 0.25


def test_setup_network_png_beside_the_printed_plan(canned, tmp_path):
    out = tmp_path / "cables.png"
    r = CliRunner().invoke(cli, ["setup", "network", "--hosts", canned, "--png", str(out)])
    assert r.exit_code == 0, r.output
    assert "Thunderbolt cables between 3 Macs" in r.stdout and f"wrote {out}" in r.stderr
    image = read(out)
    assert image.shape[:2] == (800, 1000) and share_drawn(image) > 0.04
    r = CliRunner().invoke(cli, ["setup", "network", "--hosts", canned, "--json", "--dot", "--png", str(out)])
    assert r.exit_code == 0 and r.stdout.startswith("graph thunderbolt {"), r.output
