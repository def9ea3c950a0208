"""Pure parts of `clusterctl bench`: sizes, bandwidth arithmetic, the worker's result line, tables, pairs."""
import json

import pytest

from clusterctl.bench.report import (
    RESULT_MARK,
    BenchError,
    SizesError,
    busbw,
    collective_rows,
    format_bytes,
    p2p_matrix,
    p2p_pairs,
    parse_result,
    parse_size,
    parse_sizes,
    render_matrix,
    render_table,
)
from clusterctl.hosts.facts import shared_subnets

K, M, G = 1024, 1024**2, 1024**3


@pytest.mark.parametrize("text, expected", [("1K", K), ("64m", 64 * M), ("1G", G), ("4096", 4096), ("2KiB", 2 * K),
                                            (" 8MB ", 8 * M)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "1T", "1.5M", "-1K", "2", "8G", "1K2"])
def test_parse_size_refuses(text):
    with pytest.raises(SizesError):
        parse_size(text)


def test_parse_sizes_range_list_and_mix():
    assert parse_sizes("1K..8K") == [K, 2 * K, 4 * K, 8 * K]
    assert parse_sizes("1K..1G")[0] == K and parse_sizes("1K..1G")[-1] == G and len(parse_sizes("1K..1G")) == 21
    assert parse_sizes("64M,1K") == [K, 64 * M]
    assert parse_sizes("1K..4K,2K,64M") == [K, 2 * K, 4 * K, 64 * M]
    assert parse_sizes("3K..12K") == [3 * K, 6 * K, 12 * K]    # doubling from the low end


@pytest.mark.parametrize("text", ["8K..1K", "1K,,2K", "1K..", "1K..x"])
def test_parse_sizes_refuses(text):
    with pytest.raises(SizesError):
        parse_sizes(text)


def test_format_bytes():
    assert [format_bytes(n) for n in (512, K, 64 * M, G, 1536)] == ["512B", "1K", "64M", "1G", "1.5K"]


def test_busbw_follows_nccl_tests():
    # 1 GB in 1 s: all_sum busbw = algbw * 2(N-1)/N, all_gather = algbw * (N-1)/N
    assert busbw("all_sum", 10**9, 1.0, 2) == pytest.approx(1e9)
    assert busbw("all_sum", 10**9, 1.0, 4) == pytest.approx(1.5e9)
    assert busbw("all_gather", 10**9, 0.5, 4) == pytest.approx(1.5e9)
    assert busbw("all_sum", 10**9, 0.0, 2) == 0.0
    with pytest.raises(ValueError):
        busbw("all_reduce", 1, 1.0, 2)


RESULT = {"world": 4, "backend": "mpi", "collectives": [
    {"op": "all_sum", "impl": "mlx", "bytes": K, "iters": 60, "time_s": 1e-4},
    {"op": "all_sum", "impl": "mpi4py", "bytes": K, "iters": 60, "time_s": 5e-5},
    {"op": "all_sum", "impl": "mlx", "bytes": 64 * M, "iters": 3, "time_s": 0.1},
    {"op": "all_sum", "impl": "mpi4py", "bytes": 64 * M, "iters": 3, "time_s": 0.09},
    {"op": "all_gather", "impl": "mlx", "bytes": 64 * M, "iters": 3, "time_s": 0.05}]}


def test_parse_result_finds_the_last_marked_line_behind_pty_noise():
    log = "all_sum 1024 bytes done\n" + "\r\x1b[0m" + RESULT_MARK + json.dumps({"world": 1}) + "\n" + \
          "junk " + RESULT_MARK + json.dumps(RESULT) + "\nbye\n"
    assert parse_result(log) == RESULT


@pytest.mark.parametrize("log, message", [("nothing here\n", "without printing"),
                                          (RESULT_MARK + "{broken", "damaged"),
                                          (RESULT_MARK + "[1, 2]", "no world size")])
def test_parse_result_refuses(log, message):
    with pytest.raises(BenchError, match=message):
        parse_result(log)


def test_rows_and_table():
    rows = collective_rows(RESULT)
    big = [r for r in rows if r["bytes"] == 64 * M and r["op"] == "all_sum" and r["impl"] == "mlx"][0]
    assert big["algbw_gbs"] == pytest.approx(64 * M / 0.1 / 1e9)
    assert big["busbw_gbs"] == pytest.approx(big["algbw_gbs"] * 1.5)
    text = render_table(rows)
    lines = text.splitlines()
    assert lines[0] == "all_sum:" and "mpi4py busbw" in lines[1] and "mlx/mpi4py" in lines[1]
    line_64m = [line for line in lines[:5] if line.split()[:1] == ["64M"]][0].split()
    # size, time (value unit), algbw, busbw, iters, mpi4py busbw, ratio
    assert line_64m[1:3] == ["100.00", "ms"] and float(line_64m[7]) == pytest.approx(0.9, abs=0.005)
    gather = lines[lines.index("all_gather:") + 1:]
    assert "mpi4py" not in gather[0] and gather[1].split()[0] == "64M"
    assert float(gather[1].split()[4]) == pytest.approx(64 * M / 0.05 / 1e9 * 0.75, abs=0.001)


def test_p2p_pairs_mpi_every_ordered_pair_of_hosts_first_ranks():
    assert p2p_pairs(["a", "a", "b", "c"], neighbours_only=False) == [(0, 2), (0, 3), (2, 0), (2, 3), (3, 0), (3, 2)]
    assert p2p_pairs(["a", "a"], neighbours_only=False) == []


def test_p2p_pairs_ring_only_neighbours_across_hosts():
    assert p2p_pairs(["a", "b", "c", "d"], neighbours_only=True) == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (3, 0), (0, 3)]
    assert p2p_pairs(["a", "b"], neighbours_only=True) == [(0, 1), (1, 0)]
    assert p2p_pairs(["a", "a", "b"], neighbours_only=True) == [(1, 2), (2, 1)]


def test_p2p_matrix_and_rendering_name_the_slowest_link():
    hosts = ["h1", "h2", "h3"]
    result = {"world": 3, "p2p": [{"src": s, "dst": d, "bytes": 10**9, "time_s": 1.0 if (s, d) != (2, 0) else 4.0}
                                  for s, d in p2p_pairs(hosts, neighbours_only=False)]}
    p2p = p2p_matrix(result, hosts)
    assert p2p["matrix"][2][0] == pytest.approx(0.25) and p2p["matrix"][0][1] == pytest.approx(1.0)
    assert p2p["matrix"][1][1] is None
    text = render_matrix(p2p)
    rows = text.splitlines()
    assert rows[1].split() == hosts and rows[2].split() == ["h1", "-", "1.000", "1.000"]
    assert "slowest link: h3 -> h1 at 0.250 GB/s (0.25x the median link)" in text and "n/a" not in text


def test_p2p_matrix_ring_marks_unmeasured_pairs():
    hosts = ["h1", "h2", "h3", "h4"]
    result = {"world": 4, "p2p": [{"src": s, "dst": d, "bytes": 10**9, "time_s": 1.0}
                                  for s, d in p2p_pairs(hosts, neighbours_only=True)]}
    text = render_matrix(p2p_matrix(result, hosts))
    assert text.splitlines()[2].split() == ["h1", "-", "1.000", "n/a", "1.000"]
    assert "ring ranks send only to their two neighbours" in text


IP_A = ["1: lo    inet 127.0.0.1/8 scope host lo", "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0",
        "3: docker0    inet 172.17.0.1/16 scope global docker0", "4: tb0    inet 192.168.10.1/24 scope global tb0"]
IP_B = ["1: lo    inet 127.0.0.1/8 scope host lo", "2: eth0    inet 10.0.0.6/24 brd 10.0.0.255 scope global eth0",
        "3: docker0    inet 172.17.0.1/16 scope global docker0"]
IFCONFIG_C = ["en0: flags=8863<UP> mtu 1500", "\tinet 10.0.0.7 netmask 0xffffff00 broadcast 10.0.0.255",
              "bridge0: flags=8863<UP> mtu 1500", "\tinet 192.168.10.3 netmask 255.255.255.0"]


def test_shared_subnets_skip_loopback_and_same_address_bridges():
    assert shared_subnets([IP_A, IP_B, IFCONFIG_C]) == ["10.0.0.0/24"]
    assert shared_subnets([IP_A, IFCONFIG_C]) == ["10.0.0.0/24", "192.168.10.0/24"]
    assert shared_subnets([IP_A, IP_B]) == ["10.0.0.0/24"]    # not docker0: 172.17.0.1 on both
    assert shared_subnets([]) == []


def test_a_launch_whose_rank_0_output_never_came_is_measured_once_more_and_said(tmp_path, monkeypatch):
    """Open MPI can drop a rank's forwarded output whole while mpirun exits 0 (docs/facts/launchers.md
    #mpirun-exit-status): bench measures again once, says so, and fails as before if it happens twice."""
    from types import SimpleNamespace

    from clusterctl.bench import measure
    from clusterctl.errors import BenchError
    from clusterctl.inventory import Cluster, Host
    from clusterctl.launch.outcome import Outcome

    result = {"world": 2, "backend": "mpi", "hostname": "h1", "collectives": []}
    outputs = []                                   # what each launch's rank 0 says, in turn

    def prepare(cluster, plan, *, runs_root, **kwargs):
        return SimpleNamespace(run_dir=runs_root)

    class Supervisor:
        def __init__(self, launch, connector, **kwargs):
            self.launch = launch

        def run(self):
            with open(f"{self.launch.run_dir}/rank-0.log", "w") as f:
                f.write(outputs.pop(0))
            return Outcome(0, "all 2 ranks finished")

    monkeypatch.setattr(measure, "prepare", prepare)
    monkeypatch.setattr(measure, "Supervisor", Supervisor)
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))      # where the runs go
    said = []
    bench = measure.Bench.__new__(measure.Bench)
    bench.cluster = Cluster("inv.yaml", (Host(name="h1", rank=0, line=1, slots=1),
                                         Host(name="h2", rank=1, line=2, slots=1)))
    bench.backend, bench.deadline_s, bench.connector, bench.plan, bench.site = "mpi", 60.0, None, None, None
    bench.say = said.append
    spec = {"backend": "mpi", "deadline_s": 60.0}
    outputs[:] = ["", f"{RESULT_MARK}{json.dumps(result)}\n"]
    assert bench.launch(spec) == result
    assert said == ["bench: every rank exited 0, but not one line of rank 0's output reached this machine; "
                    "measuring again"]
    outputs[:] = ["", ""]
    with pytest.raises(BenchError, match="rank 0 finished without printing a result; logs in "):
        bench.launch(spec)
    outputs[:] = [f"{RESULT_MARK}{json.dumps(result)}\n"]
    said.clear()
    assert bench.launch(spec) == result and said == []           # the usual case: one launch
    import glob
    assert len(glob.glob(str(tmp_path / "clusterctl-bench-*"))) == 1    # only the twice-failed one is kept
