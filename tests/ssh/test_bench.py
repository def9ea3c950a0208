"""`clusterctl bench` on the real loopback cluster: real mpirun, real mlx.launch, real MLX collectives.

No speed is asserted, not even one size against another: every simulated host shares this machine's
two cores with whatever else runs. The tests check that each reported bandwidth is that row's bytes over
its own measured time (and bus bandwidth the nccl-tests factor of it); how fast is benchmarks/' business.
"""
import difflib
import glob
import json
import os

import clirun
import pytest
from pictures import read, share_drawn

from clusterctl.bench.report import parse_size

pytestmark = pytest.mark.ssh


def bench(cluster, *args, cwd, timeout=120, env=None):
    r = clirun.clusterctl("bench", "--hosts", str(cluster.inventory), *args, timeout=timeout, cwd=cwd,
                          own_cache=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def table_rows(text: str, op: str) -> list[list[str]]:
    lines = text.splitlines()
    start = lines.index(f"{op}:") + 2
    rows = []
    for line in lines[start:]:
        if not line.strip() or line.endswith(":"):
            break
        rows.append(line.split())
    return rows


def test_mpi_two_hosts_json_with_the_raw_mpi4py_comparison(make_cluster, tmp_path):
    cluster = make_cluster(2)
    tmp = tmp_path / "tmp"      # a temporary directory of its own: other tests' benches run beside this one
    tmp.mkdir()
    r = bench(cluster, "--backend", "mpi", "--sizes", "4K..4M", "--json", "--png", "bench.png", cwd=tmp_path,
              env={**os.environ, "TMPDIR": str(tmp)})
    doc = json.loads(r.stdout)                                   # --png leaves stdout to the JSON
    image = read(tmp_path / "bench.png")                         # and draws MLX's and mpi4py's lines
    assert image.shape[:2] == (600, 1000) and share_drawn(image) > 0.03
    assert doc["backend"] == "mpi" and doc["world"] == 2 and doc["hosts"] == ["h1", "h2"]
    for op in ("all_sum", "all_gather"):
        for impl in ("mlx", "mpi4py"):
            rows = [x for x in doc["rows"] if x["op"] == op and x["impl"] == impl]
            assert [x["bytes"] for x in rows] == [4096 * 2**k for k in range(11)]
            assert all(x["time_s"] > 0 and x["iters"] >= 3 for x in rows)
            for x in rows:      # the reported bandwidth is this row's bytes over its own measured time
                assert x["algbw_gbs"] == pytest.approx(x["bytes"] / x["time_s"] / 1e9), (op, impl, x)
    big = [x for x in doc["rows"] if x["op"] == "all_sum" and x["bytes"] == 4 * 2**20][0]
    assert big["busbw_gbs"] == pytest.approx(big["algbw_gbs"] * 2 * (2 - 1) / 2)
    left = glob.glob(os.path.join(tmp, "clusterctl-bench-*"))
    assert not left, "bench keeps no run directories when it succeeds"


def test_ring_four_hosts_table(make_cluster, tmp_path):
    cluster = make_cluster(4)
    r = bench(cluster, "--backend", "ring", "--sizes", "1K..1M,4M", cwd=tmp_path)
    assert "mpi4py" not in r.stdout                              # no raw MPI beside the ring backend
    for op in ("all_sum", "all_gather"):
        rows = table_rows(r.stdout, op)
        assert [row[0] for row in rows] == ["1K", "2K", "4K", "8K", "16K", "32K", "64K", "128K", "256K", "512K",
                                            "1M", "4M"]
        algbw = [float(row[3]) for row in rows]                  # size, time, unit, algbw, busbw, iters
        for row, bw in zip(rows, algbw):    # each line's bandwidth is its size over its printed time
            seconds = float(row[1]) * {"s": 1, "ms": 1e-3, "us": 1e-6}[row[2]]
            assert bw == pytest.approx(parse_size(row[0]) / seconds / 1e9, rel=0.01, abs=0.0011), row
        busbw = [float(row[4]) for row in rows]
        factor = 1.5 if op == "all_sum" else 0.75                # 2(N-1)/N and (N-1)/N at N = 4
        assert busbw[-1] == pytest.approx(algbw[-1] * factor, abs=0.002)
    assert "on 4 ranks over ring" in r.stderr


def test_tune_write_changes_only_that_setting(make_cluster, tmp_path):
    cluster = make_cluster(2)
    before = cluster.inventory.read_text() + "launch:\n  backend: ring    # the data plane\n  connections_per_ip: 3\n"
    cluster.inventory.write_text(before)
    r = bench(cluster, "--tune", "--write", "--sizes", "4M", cwd=tmp_path)
    tried = [line for line in r.stderr.splitlines() if line.startswith("  connections_per_ip=")]
    assert [line.split(":")[0].strip() for line in tried] == [f"connections_per_ip={n}" for n in (1, 2, 4, 8)]
    best = r.stdout.split("best: connections_per_ip=")[1].split(":")[0]
    after = cluster.inventory.read_text()
    changed = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-  connections_per_ip: 3", f"+  connections_per_ip: {best}"]
    assert f"wrote launch.connections_per_ip={best}" in r.stderr


def test_p2p_prints_a_matrix_of_every_pair_over_mpi(make_cluster, tmp_path):
    cluster = make_cluster(3)
    r = bench(cluster, "--backend", "mpi", "--p2p", "--p2p-size", "1M", "--png", "p2p.png", cwd=tmp_path)
    assert share_drawn(read(tmp_path / "p2p.png")) > 0.25          # the heat map's cells
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["h1", "h2", "h3"]
    for i, line in enumerate(lines[2:5]):
        cells = line.split()
        assert cells[0] == f"h{i + 1}" and cells[1 + i] == "-"
        assert all(float(c) > 0 for j, c in enumerate(cells[1:]) if j != i)
    assert lines[5].startswith("slowest link: ")
