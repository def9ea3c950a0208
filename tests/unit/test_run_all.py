"""benchmarks/run_all.py: discovery by glob, headline figures from results JSON, the RESULTS.md summary block."""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("run_all", os.path.join(HERE, "..", "..", "benchmarks", "run_all.py"))
run_all = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_all)


@pytest.fixture
def bench_dir(tmp_path, monkeypatch):
    (tmp_path / "results").mkdir()
    for name in ("bench_a.py", "bench_b.py", "helper.py"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(run_all, "HERE", str(tmp_path))
    monkeypatch.setattr(run_all, "RESULTS_MD", str(tmp_path / "RESULTS.md"))
    return tmp_path


def test_discover_finds_every_bench_script_and_refuses_unknown_names(bench_dir):
    assert run_all.discover() == ["bench_a", "bench_b"]
    (bench_dir / "bench_c.py").write_text("")
    assert run_all.discover({"bench_c"}) == ["bench_c"]
    with pytest.raises(SystemExit, match="no benchmark named bench_x"):
        run_all.discover({"bench_x"})


def test_headlines_known_and_generic(bench_dir):
    bench = {"benchmark": "bench", "date": "2026-11-21T13:00:00+00:00", "bytes": 64 * 2**20,
             "results": {"2": {"mlx": 0.2, "mpi4py": 0.25, "ratio": 0.8}}}
    (bench_dir / "results" / "bench.json").write_text(json.dumps(bench))
    assert run_all.headline(str(bench_dir / "results" / "bench.json")) == (
        "bench", "2026-11-21", "all_sum 64 MiB, MLX/mpi4py busbw: 2 hosts 0.80 (0.200 vs 0.250 GB/s abs.)")
    other = {"benchmark": "newbench", "date": "2026-11-22", "results": {"seconds": 3.0, "speedup_vs_rsync": 1.25}}
    (bench_dir / "results" / "newbench.json").write_text(json.dumps(other))
    name, date, text = run_all.headline(str(bench_dir / "results" / "newbench.json"))
    assert (name, date) == ("newbench", "2026-11-22") and text == "speedup_vs_rsync 1.25, seconds 3"
    (bench_dir / "results" / "doctor.json").write_text(json.dumps({"benchmark": "doctor", "results": {}}))
    assert "could not summarise" in run_all.headline(str(bench_dir / "results" / "doctor.json"))[2]


def test_summary_block_is_inserted_once_then_replaced_keeping_the_sections(bench_dir):
    md = bench_dir / "RESULTS.md"
    md.write_text("# Benchmark results\n\nIntro.\n\n## doctor scaling\n\nHand-written.\n")
    (bench_dir / "results" / "x.json").write_text(json.dumps({"benchmark": "x", "results": {"ratio": 2}}))
    runs = [{"name": "bench_x", "ok": False, "exit": 1, "seconds": 12.0, "args": []}]
    run_all.write_results_md(run_all.summary(runs, 60.0))
    first = md.read_text()
    assert first.startswith("# Benchmark results\n\nIntro.\n\n" + run_all.BEGIN)
    assert "| x | ? | ratio 2 | 12 s, FAILED (1) |" in first and "Failed in this run" in first
    assert first.endswith(run_all.END + "\n\n## doctor scaling\n\nHand-written.\n")
    run_all.write_results_md(run_all.summary([], None))
    second = md.read_text()
    assert second.count(run_all.BEGIN) == 1 and "FAILED" not in second and "| x | ? | ratio 2 | - |" in second
    assert second.endswith(run_all.END + "\n\n## doctor scaling\n\nHand-written.\n")
