"""observe/: the pure parsers and readers on canned inputs (ps outputs, run directories, log sizes)."""
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from clusterctl.errors import UsageError
from clusterctl.launch.launchers import sweep_pattern
from clusterctl.observe import record
from clusterctl.observe.logs import LogLine, merge, read_logs, split_lines
from clusterctl.observe.plot import MARKS, VAL_MARKS, Curves, render_text
from clusterctl.observe.procs import etime_seconds, kind_of, parse_ps, run_processes
from clusterctl.observe.runs import final_losses, latest_checkpoint, list_all, list_runs, read_index, resolve, run_info
from clusterctl import trainer_program
from clusterctl.run.resolve import program_for
from clusterctl.serve.service import Service
from clusterctl.trainer_program import BundledTrainer

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ps"


# ---- ps ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,seconds", [("00:05", 5), ("01:12:16", 4336), ("12-03:04:05", 12 * 86400 + 11045),
                                          ("  59:59", 3599)])
def test_etime(text, seconds):
    assert etime_seconds(text.strip()) == seconds


def test_linux_procps_output_recorded_during_a_two_rank_run():
    rows = parse_ps((FIXTURES / "linux-procps.txt").read_text())
    assert len(rows) == 11 and rows[0].pid == 2 and rows[0].args == "[kthreadd]"
    procs = run_processes("localhost", rows)
    assert {p.run_id for p in procs} == {"20261124-011806-1f0fe2"}
    ranks = [p for p in procs if p.kind == "rank"]
    assert [(p.rank, p.pid) for p in ranks] == [(0, 18154), (1, 18155)]
    assert all(p.rss_kb > 10000 and p.age_s == 4 and p.command.startswith("/work/wt-observe/.venv/bin/python -c")
               for p in ranks)
    shells = [p for p in procs if p.kind == "shell"]
    assert len(shells) == 6 and {p.rank for p in shells} == {0, 1}     # MLX_RANK from the wrapper, or its parent
    assert 18052 not in {p.pid for p in procs}                          # `clusterctl run` itself carries no token


def test_macos_bsd_output_with_raw_newlines_mpi_and_a_sweeps_pgrep():
    rows = parse_ps((FIXTURES / "macos-bsd.txt").read_text())
    assert [r.pid for r in rows] == [1, 341, 7311, 7314, 7316, 7320, 8001, 8010, 8200, 8300]
    assert rows[0].age_s == 12 * 86400 + 3 * 3600 + 4 * 60 + 5
    assert "def env_files" in rows[7].args and rows[7].args.endswith("-m clusterctl.train")   # continuation lines
    procs = {p.pid: p for p in run_processes("mac1", rows)}
    assert set(procs) == {7311, 7314, 7316, 7320, 8001, 8010}           # not the pgrep of a sweep
    rank = procs[7316]
    assert (rank.kind, rank.rank, rank.run_id, rank.cpu, rank.rss_kb) == ("rank", 2, "20250301-093000-a1b2c3", 187.5, 2211840)
    assert (procs[8001].kind, procs[8001].rank) == ("launcher", None)
    assert (procs[8010].kind, procs[8010].rank) == ("rank", None)        # under mpirun no command line says
    assert procs[7311].kind == "shell" and procs[7311].rank == 2


def test_a_detached_runs_supervisor_and_its_keeper_recorded_on_a_host():
    procs = run_processes("h1", parse_ps((FIXTURES / "linux-procps-detached.txt").read_text()))
    assert [(p.run_id, p.kind, p.pid, p.rank) for p in procs] == [("20261206-213653-adda7e", "keeper", 19848, None),
                                                                  ("20261206-213653-adda7e", "supervisor", 19851, None)]
    assert procs[1].command.startswith("/work/main/.venv/bin/python -m clusterctl run --plain --handoff ")
    shell = parse_ps("  300   299  00:01  0.0  1800 /bin/sh -c exec python -c X F W python -m clusterctl run --plain "
                     "--handoff .clusterctl/detached/20261206-213653-adda7e/handoff.json\n")
    assert [p.kind for p in run_processes("h1", shell)] == ["shell"]      # the command that starts the keeper


def test_kinds():
    assert kind_of("-zsh -c exec /bin/sh") == "shell"
    assert kind_of("/usr/bin/ssh -F cfg -- h2 exec /bin/sh") == "ssh"
    assert kind_of("/opt/homebrew/bin/mpirun -np 2") == "launcher"
    assert kind_of("/usr/bin/python3 -c ...") == "rank"


def test_sweep_patterns_match_runs_but_not_themselves():
    one, every = sweep_pattern("20250301-093000-a1b2c3"), sweep_pattern(None)
    line = "python -c ... clusterctl-run-20250301-093000-a1b2c3 /w 1.0 train.py"
    assert re.search(one, line) and re.search(every, line)
    assert not re.search(one, line.replace("a1b2c3", "a1b2c4"))
    for pattern in (one, every):                     # a pgrep / pkill of the pattern is not matched by it
        assert not re.search(pattern, f"pkill -f {pattern}")


# ---- logs -------------------------------------------------------------------------------------

def test_split_lines_keeps_a_partial_line_for_later():
    lines, used = split_lines(b"a\nbb\ncc")
    assert lines == [(2, "a"), (5, "bb")] and used == 5


def test_merge_orders_by_sample_time_then_rank_and_keeps_file_order():
    per_rank = {0: [(2, "a0"), (4, "b0"), (6, "c0")], 1: [(3, "x1"), (6, "y1")]}
    samples = [(10.0, [2, 0]), (11.0, [4, 3]), (12.0, [4, 6])]
    lines = merge(per_rank, {0: "h1", 1: "h2"}, samples)
    assert [(l.rank, l.text, l.t) for l in lines] == [
        (0, "a0", 10.0), (0, "b0", 11.0), (1, "x1", 11.0), (1, "y1", 12.0), (0, "c0", None)]
    assert lines[1] == LogLine(0, "h1", "b0", 11.0)


def _fake_run(root: Path, run_id: str, *, ranks=("h1", "h2"), summary=None, metrics=(), logs=None,
              times=None) -> Path:
    d = root / run_id
    d.mkdir(parents=True)
    (d / "launch.json").write_text(json.dumps({"run_id": run_id, "backend": "ring", "rank_hosts": list(ranks)}))
    for r, text in (logs or {}).items():
        (d / f"rank-{r}.log").write_text(text)
    if metrics:
        (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics) + '{"step": 9, "lo')
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if times is not None:
        (d / "log-times.jsonl").write_text("".join(json.dumps({"t": t, "sizes": s}) + "\n" for t, s in times))
    return d


def test_read_logs_merged_by_log_times_or_rank_after_rank_without(tmp_path):
    old = _fake_run(tmp_path, "20250101-100000-aaaaaa", logs={0: "a\nb\n", 1: "x\n"})
    info = run_info(str(old))
    lines, timed = read_logs(info)
    assert not timed and [(l.rank, l.host, l.text) for l in lines] == [(0, "h1", "a"), (0, "h1", "b"), (1, "h2", "x")]
    new = _fake_run(tmp_path, "20250101-100001-bbbbbb", logs={0: "a\nb\n", 1: "x\n"}, times=[(1.0, [2, 2]), (2.0, [4, 2])])
    lines, timed = read_logs(run_info(str(new)), pattern=re.compile("[bx]"))
    assert timed and [l.text for l in lines] == ["x", "b"]
    assert [l.text for l in read_logs(run_info(str(new)), rank=1)[0]] == ["x"]


# ---- runs -------------------------------------------------------------------------------------

def test_runs_before_the_index_existed_and_after(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    _fake_run(runs, "20250101-100000-aaaaaa", logs={0: "hello\n"},
              metrics=[{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0}, {"step": 2, "val_loss": 4.5}])
    _fake_run(runs, "20250102-100000-bbbbbb", summary={"format": 1, "started": "2025-01-02T10:00:00+00:00",
                                                      "duration_s": 12.5, "exit_code": 3, "reason": "rank 1 on h2 exited 3",
                                                      "world": 2, "backend": "ring", "hosts": ["h1", "h2"]})
    (runs / "not-a-run").mkdir()
    infos = list_runs(str(runs))
    assert [i.run_id for i in infos] == ["20250102-100000-bbbbbb", "20250101-100000-aaaaaa"]
    new, old = infos
    assert (new.status, new.outcome, new.duration_s) == ("failed", "exit 3: rank 1 on h2 exited 3", 12.5)
    assert (old.status, old.hosts, old.world, old.final_loss, old.final_val_loss) == ("unknown", ["h1", "h2"], 2, 4.0, 4.5)
    assert (new.kind, new.model, new.strategy) == (old.kind, old.model, old.strategy) == (None, None, None)   # older records
    assert old.start.startswith("2025-01-01T10:00:00") and old.duration_s is not None   # the id's time -> last write
    assert resolve(str(runs), "latest").run_id == new.run_id
    assert resolve(str(runs), "20250101").run_id == old.run_id
    with pytest.raises(UsageError, match="matches 2 runs"):
        resolve(str(runs), "2025")
    with pytest.raises(UsageError, match="no run"):
        resolve(str(runs), "1999")


def test_a_recorded_run_writes_its_summary_and_the_index(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run_dir = tmp_path / "elsewhere" / "runs" / "20250103-100000-cccccc"
    run_dir.mkdir(parents=True)
    rec = record.RunRecord.start("20250103-100000-cccccc", str(run_dir), world=2, backend="mpi", hosts=["h1", "h2"],
                                 program="train.py")
    info = run_info(str(run_dir))
    assert info.status == "running"                        # this process is the run's
    (run_dir / "rank-0.log").write_text("one\n")
    summary = rec.end(0, "all 2 ranks finished")
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert summary["exit_code"] == 0 and summary["world"] == 2 and summary["duration_s"] >= 0
    assert json.loads((run_dir / "log-times.jsonl").read_text().splitlines()[-1])["sizes"] == [4, 0]
    index = read_index()
    assert index["20250103-100000-cccccc"]["event"] == "end" and index["20250103-100000-cccccc"]["pid"] == os.getpid()
    every = list_all(str(tmp_path / "runs"))                # another project's run, through the index
    assert [(i.run_id, i.status) for i in every] == [("20250103-100000-cccccc", "ok")]
    # the same id in the runs directory asked for (a detached run's record here, its supervisor's directory in the
    # index on a host sharing it): shown as the runs directory has it, once
    here = tmp_path / "here" / "20250103-100000-cccccc"
    here.mkdir(parents=True)
    (here / "summary.json").write_text(json.dumps({"exit_code": 1, "reason": "rank 1 exited 1", "world": 2}))
    shown = list_all(str(tmp_path / "here"))
    assert [(i.run_id, i.dir, i.status) for i in shown] == [("20250103-100000-cccccc", str(here), "failed")]
    assert resolve(str(tmp_path / "runs"), "20250103").dir == str(run_dir)


def test_the_trainers_own_summary_goes_into_summary_json_and_a_bad_one_is_left_out(tmp_path, monkeypatch):
    """trainer.json (the bundled trainer's shares and sync checks, trainer_contract.TRAINER_SUMMARY) becomes
    summary.json's "trainer"; one that is not a JSON object is left out, never an error."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for text, expected in [('{"balance": {"rows": [10, 6]}}', {"balance": {"rows": [10, 6]}}), ("[1, 2]", None),
                           ("{not json", None)]:
        run_dir = tmp_path / f"r{len(text)}"
        run_dir.mkdir()
        (run_dir / "trainer.json").write_text(text)
        rec = record.RunRecord.start("20250103-100000-dddddd", str(run_dir), world=2, backend="ring",
                                     hosts=["h1", "h2"], program="clusterctl.train")
        assert rec.end(0, "all 2 ranks finished").get("trainer") == expected


# ---- what a run is (issue 45: `runs` could not tell a dp run from a zero3 one, a fine-tune from training
# from scratch, nor a serve job from training) -----------------------------------------------------------

SERVED = Service("http://127.0.0.1:8080", "tiny", "/m/tiny", None, "tensor")
SERVICE = {"url": "http://127.0.0.1:8080", "model": "tiny", "model_dir": "/m/tiny", "listen": None,
           "strategy": "tensor"}


def describe(module, args, service=None):
    """What the run of `module` (None: a script) with `args` is, as run knows its kind (program.Capabilities)."""
    program = program_for(None if module else "s.py", tuple(args), module, (BundledTrainer(), SERVED))
    assert program.kind.service == service
    return program.kind.describe(program.args)


@pytest.mark.parametrize("module, args, service, described", [
    ("clusterctl.train", ["--model", "models/llama", "--data", "d", "--strategy", "dp"], None,
     {"kind": "fine-tune", "model": "models/llama", "strategy": "dp"}),
    ("clusterctl.train", ["--model=/abs/qwen3", "--strategy=zero3", "--strategy", "fsdp"], None,
     {"kind": "fine-tune", "model": "/abs/qwen3", "strategy": "fsdp"}),          # the last one wins, as argparse
    ("clusterctl.train", ["--steps", "40"], None, {"kind": "train", "model": None, "strategy": "dp"}),
    ("clusterctl.serve.rank", ['{"name": "tiny"}', "--port", "1"], SERVICE,
     {"kind": "serve", "model": "tiny", "strategy": "tensor"}),
    (None, ["--model", "x"], None, {"kind": "program", "model": None, "strategy": None}),     # a script's own flags
    ("mlx_lm", ["lora", "--model", "x"], None, {"kind": "program", "model": None, "strategy": None}),
])
def test_what_a_run_is_comes_from_its_program_and_arguments(module, args, service, described):
    assert describe(module, args, service) == described


def test_an_adapter_run_is_its_own_kind_whatever_the_order_of_its_flags():
    assert describe("clusterctl.train", ["--model", "m", "--adapter", "lora"])["kind"] == "adapters"
    assert describe("clusterctl.train", ["--adapter=dora", "--model", "m"]) == \
        {"kind": "adapters", "model": "m", "strategy": "dp"}
    assert describe("clusterctl.train", ["--model", "m"])["kind"] == "fine-tune"


def test_the_record_says_what_ran_while_it_runs_and_after_and_a_stop_is_no_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    serve_dir, train_dir = runs / "20250104-100000-aaaaaa", runs / "20250104-100001-bbbbbb"
    for d in (serve_dir, train_dir):
        d.mkdir(parents=True)
    served = record.RunRecord.start(serve_dir.name, str(serve_dir), world=2, backend="ring", hosts=["h1", "h2"],
                                    program="clusterctl.serve.rank", service=SERVICE,
                                    described=describe("clusterctl.serve.rank", [], SERVICE))
    running = run_info(str(serve_dir))           # no summary yet: run.json says what it is
    assert (running.status, running.kind, running.model, running.strategy) == ("running", "serve", "tiny", "tensor")
    served.end(143, "SIGTERM received: stopped every rank", stopped=True)
    (train_dir / "trainer.json").write_text('{"strategy": "zero3", "balance": {"mode": "off"}}')   # chose: auto
    trained = record.RunRecord.start(train_dir.name, str(train_dir), world=2, backend="mpi", hosts=["h1", "h2"],
                                     program="clusterctl.train",
                                     described=describe("clusterctl.train", ["--model", "m", "--strategy", "auto"]))
    assert trained.end(1, "rank 1 on h2 exited 1")["strategy"] == "zero3"
    new, old = list_runs(str(runs))
    assert (old.status, old.outcome, old.exit_code) == ("stopped", "stopped: SIGTERM received: stopped every rank", 143)
    assert (new.status, new.kind, new.model, new.strategy, new.world) == ("failed", "fine-tune", "m", "zero3", 2)
    assert old.as_json()["kind"] == "serve" and old.as_json()["strategy"] == "tensor"
    for d in (serve_dir, train_dir):            # through the index alone, once the directories are gone
        for name in os.listdir(d):
            os.unlink(d / name)
        d.rmdir()
    gone = {i.run_id: i for i in list_all(str(tmp_path / "elsewhere"))}
    assert (gone[serve_dir.name].status, gone[serve_dir.name].kind) == ("stopped", "serve")
    assert (gone[train_dir.name].status, gone[train_dir.name].strategy) == ("failed", "zero3")


def test_kill_signals_a_runs_own_process_only_while_that_pid_is_still_it(tmp_path):
    """`clusterctl kill` stops a run through the process supervising it (which then records it as stopped and
    never restarts it), but never signals a pid the system has given to another process since."""
    import subprocess
    import sys

    from clusterctl.observe.procs import stop_supervisor, supervisor

    run_dir = tmp_path / "20250105-100000-aaaaaa"
    run_dir.mkdir()
    # stands in for `clusterctl run`: on SIGTERM it writes its summary, as run does, and ends
    code = ("import pathlib, signal, sys, time\n"
            "def stop(*_):\n    pathlib.Path(sys.argv[1], 'summary.json').write_text('{}'); sys.exit(143)\n"
            "signal.signal(signal.SIGTERM, stop)\nprint('up', flush=True)\ntime.sleep(60)\n")
    runner = subprocess.Popen([sys.executable, "-c", code, str(run_dir), "clusterctl"], stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert runner.stdout.readline() == "up\n"
        pid_file = run_dir / "clusterctl.pid"
        pid_file.write_text(f"{other.pid} {record.socket.gethostname()}\n")
        assert supervisor(str(run_dir)) is None and not stop_supervisor(str(run_dir))   # not clusterctl's
        pid_file.write_text(f"{runner.pid} {record.socket.gethostname()}\n")
        os.utime(pid_file, (time.time() - 60, time.time() - 60))        # the run began before this process did
        assert supervisor(str(run_dir)) is None
        os.utime(pid_file, None)
        assert supervisor(str(run_dir)) == runner.pid
        assert stop_supervisor(str(run_dir), wait_s=20) and runner.wait(20) == 143
        assert (run_dir / "summary.json").exists() and supervisor(str(run_dir)) is None
        assert other.poll() is None
    finally:
        for proc in (runner, other):
            proc.kill()
            proc.wait()


def test_index_lines_appended_from_many_threads_stay_whole(tmp_path):
    path = str(tmp_path / "runs.jsonl")
    payload = "x" * 300

    def work(k):
        for i in range(50):
            record.append_line(path, {"run_id": f"{k}-{i}", "pad": payload})

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = Path(path).read_text().splitlines()
    assert len(lines) == 400 and all(json.loads(l)["pad"] == payload for l in lines)


def test_final_losses_skip_a_torn_line(tmp_path):
    d = _fake_run(tmp_path, "20250101-100000-dddddd", metrics=[{"step": 5, "loss": 2.0}])
    assert run_info(str(d)).final_loss == 2.0
    assert final_losses([]) == (None, None)


# ---- plot (text) ------------------------------------------------------------------------------

def test_text_chart_marks_each_run_and_held_out_points():
    a = Curves.of("run-a", [{"step": 1, "loss": 5.0, "tokens_per_s": 100.0, "peak_mem_mb": 10.0},
                            {"step": 10, "loss": 3.0}, {"step": 10, "val_loss": 3.2}])
    b = Curves.of("run-b", [{"step": 1, "loss": 4.0}, {"step": 10, "loss": float("nan")}, {"step": 10, "loss": 2.0}])
    lines = render_text([a, b], width=40, height=10)
    chart = "\n".join(lines[:10])
    assert lines[0].startswith("5.000 |" ) and lines[9].startswith("2.000 |")
    for mark in (MARKS[0], VAL_MARKS[0], MARKS[1]):
        assert mark in chart
    assert lines[-2].startswith(f"{MARKS[0]} {VAL_MARKS[0]} run-a | loss 5.000 -> 3.000 at step 10 | held-out 3.200")
    assert "100 tok/s" in lines[-2] and "peak mem 10.0 MB" in lines[-2]
    assert lines[-1].startswith(f"{MARKS[1]} {VAL_MARKS[1]} run-b | loss 4.000 -> 2.000")
    assert render_text([Curves.of("empty", [])]) == ["nothing to plot: no losses in metrics.jsonl"]


def test_one_damaged_run_record_never_breaks_runs_logs_or_plot(tmp_path):
    """Issue 25 item 7: a summary.json with fields of the wrong type, a launch.json whose rank_hosts is not a
    list, metrics.jsonl, log-times.jsonl and the runs index with invalid UTF-8: the good run beside them is
    listed, logged and plotted, and the damaged ones are listed too, their bad fields read as absent."""
    import clirun

    good = _fake_run(tmp_path / "runs", "20250101-100000-aaaaaa", logs={0: "step 1\n", 1: "x\n"},
                     summary={"exit_code": 0, "reason": "all 2 ranks finished", "duration_s": 3.5},
                     metrics=[{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.0}], times=[(1.0, [7, 2])])
    bad = _fake_run(tmp_path / "runs", "20250101-100001-bbbbbb", logs={0: "y\n"},
                    summary={"exit_code": "zero", "duration_s": "abc", "restarts": "two", "hosts": 5,
                             "world": [1], "reason": {"no": 1}})
    (bad / "launch.json").write_text(json.dumps({"run_id": bad.name, "rank_hosts": 5, "backend": 7}))
    (bad / "metrics.jsonl").write_bytes(b'{"step": 1, "loss": 2.5}\n\xff\xfe{"step": 2, "loss": "x"}\n')
    (bad / "log-times.jsonl").write_bytes(b'{"t": 1.0, "sizes": [2]}\n\xff\n{"t": "t", "sizes": 3}\n')
    worse = _fake_run(tmp_path / "runs", "20250101-100002-cccccc", summary={"exit_code": 1})
    (worse / "summary.json").write_bytes(b'{"exit_code": 1, "reason": "\xff\xfe"}')
    cache = tmp_path / "cache" / "clusterctl"
    cache.mkdir(parents=True)
    (cache / "runs.jsonl").write_bytes(b'\xff\xfe\n{"run_id": "20250101-090000-dddddd", "event": "end", '
                                       b'"dir": "/nowhere", "exit_code": 0, "duration_s": "abc", "hosts": 5}\n')
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    listing = clirun.clusterctl("runs", "--json", cwd=tmp_path, env=env)
    assert listing.returncode == 0, listing.stderr
    rows = {r["run_id"]: r for r in json.loads(listing.stdout)}
    assert rows[good.name]["status"] == "ok" and rows[good.name]["final_loss"] == 2.0
    assert rows[bad.name]["duration_s"] is None and rows[bad.name]["restarts"] == 0 and rows[bad.name]["hosts"] == []
    assert rows[bad.name]["final_loss"] == 2.5 and rows[worse.name]["status"] == "failed"
    everything = clirun.clusterctl("runs", "--all", cwd=tmp_path, env=env)
    assert everything.returncode == 0 and "20250101-090000-dddddd" in everything.stdout, everything.stderr
    for ref in (good.name, bad.name, worse.name):
        for command in (["logs", ref], ["plot", ref]):
            r = clirun.clusterctl(*command, cwd=tmp_path, env=env)
            assert r.returncode == 0, (command, r.stderr)
    assert clirun.clusterctl("logs", good.name, cwd=tmp_path, env=env).stdout.splitlines() == [
        "[rank 0 h1] step 1", "[rank 1 h2] x"]


def test_kill_of_a_directory_that_is_no_run_builds_no_pattern(tmp_path):
    """Issue 25 item 8: `kill DIR` took DIR's base name as the run id, so `x|python` matched every python."""
    import clirun

    odd = tmp_path / "x|python"
    odd.mkdir()
    (odd / "launch.json").write_text("{}")
    r = clirun.clusterctl("kill", str(odd), cwd=tmp_path, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode == 2 and r.stderr.strip() == \
        f"error: {str(odd)!r} is not a run of clusterctl's (a run id looks like 20250101-120000-abcdef)", r.stderr


def test_the_latest_checkpoint_is_the_newest_run_that_holds_a_whole_one(tmp_path):
    """`run -- --resume latest`: the newest run (by id) with a step directory holding its state.json; a newer run
    without one (failed before its first checkpoint, or only a half-written one) is passed over."""
    def step(run_id, name, whole=True):
        d = tmp_path / run_id / "checkpoints" / name
        d.mkdir(parents=True)
        if whole:
            (d / "state.json").write_text("{}")

    assert latest_checkpoint(str(tmp_path)) is None and latest_checkpoint(str(tmp_path / "none")) is None
    step("20261101-100000-aaaaaa", "step-000200")
    step("20261101-100000-aaaaaa", "step-000040")
    step("20261102-100000-bbbbbb", "step-000010")
    step("20261102-100000-bbbbbb", "step-000999", whole=False)
    step("20261102-100000-bbbbbb", ".step-000300.tmp-00ab12")
    (tmp_path / "20261103-100000-cccccc" / "checkpoints").mkdir(parents=True)
    step("train-20261104-100000", "step-000500")                   # not a run of clusterctl's
    assert latest_checkpoint(str(tmp_path)) == ("20261102-100000-bbbbbb", "step-000010")
    step("20261101-100000-aaaaaa", "step-001000")
    assert latest_checkpoint(str(tmp_path)) == ("20261102-100000-bbbbbb", "step-000010")


def test_a_runs_outcome_cell_is_the_cause_without_its_fix_and_followers():
    from clusterctl.observe.runs import RunInfo

    reason = ("rank 1 on h2 exited 1: error: no space left on device writing /w/runs/x (0.0 MiB free in /w/runs/x): "
              "free space there -> free space on h2; followed from it: rank 0 on h1 (RuntimeError: [ring] connection "
              "to a peer was lost); not restarted: a restart would meet the same disk full")
    info = RunInfo(run_id="x", dir="/r/x", start=None, duration_s=None, hosts=["h1", "h2"], world=2, backend="ring",
                   status="failed", exit_code=1, reason=reason, final_loss=None, final_val_loss=None, restarts=1)
    assert info.outcome == ("exit 1: rank 1 on h2 exited 1: error: no space left on device writing /w/runs/x (0.0 MiB "
                            "free in /w/runs/x): free space there; not restarted: a restart would meet the same disk "
                            "full, after 1 restart")

