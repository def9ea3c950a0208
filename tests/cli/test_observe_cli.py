"""runs, logs, plot and completion through the real entry point, on real runs of this machine: two tiny
runs of the bundled trainer, and a live run followed with `logs --follow`."""
import json
import os
import re
import subprocess
import sys
import time
from functools import partial

import clirun
import pytest
from click.testing import CliRunner

from clusterctl.cli import cli
from clusterctl.observe.plot import PALETTE

TOKEN = clirun.TOKEN
TRAIN = ["run", "--", "--steps", "40", "--report-every", "5", "--eval-every", "20"]


clusterctl = partial(clirun.clusterctl, timeout=180, own_cache=True)


def _env(cwd):
    return {**os.environ, "XDG_CACHE_HOME": os.path.join(str(cwd), ".cache")}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny runs of the bundled trainer in one project: (project dir, [run ids])."""
    project = tmp_path_factory.mktemp("project")
    ids = []
    for extra in ([], ["--lr", "1e-3"]):          # another learning rate: two curves that do not hide each other
        r = clusterctl(*TRAIN, *extra, cwd=project)
        assert r.returncode == 0, r.stdout + r.stderr
        ids.append(TOKEN.search(r.stderr).group(1))
    return project, ids


def test_runs_lists_both_with_outcome_and_final_loss(two_runs):
    project, ids = two_runs
    r = clusterctl("runs", cwd=project)
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["ID", "KIND", "MODEL", "STRATEGY", "START", "DURATION", "HOSTS", "WORLD", "BACKEND",
                              "OUTCOME", "LOSS"]
    assert [row.split()[0] for row in rows] == ids[::-1]          # newest first
    assert all(row.split()[1:4] == ["train", "-", "dp"] for row in rows)
    assert all("exit 0: all 2 ranks finished" in row and " ring " in row for row in rows)
    data = json.loads(clusterctl("runs", "--json", cwd=project).stdout)
    assert [d["run_id"] for d in data] == ids[::-1]
    for d in data:
        metrics = [json.loads(l) for l in open(os.path.join(d["dir"], "metrics.jsonl"))]
        assert d["final_loss"] == [m["loss"] for m in metrics if "loss" in m][-1]
        assert d["status"] == "ok" and d["world"] == 2 and d["hosts"] == ["localhost"] and d["duration_s"] > 1
        assert (d["kind"], d["model"], d["strategy"]) == ("train", None, "dp")        # from scratch, the default
        summary = json.load(open(os.path.join(d["dir"], "summary.json")))
        assert summary["exit_code"] == 0 and summary["program"] == "clusterctl.train"
    # from another directory, through the index
    elsewhere = project / "sub"
    elsewhere.mkdir(exist_ok=True)
    r = clirun.clusterctl("runs", "--all", "--json", cwd=elsewhere, env=_env(project), timeout=None)
    assert {d["run_id"] for d in json.loads(r.stdout)} == set(ids)


def test_logs_merged_one_rank_and_grep(two_runs):
    project, ids = two_runs
    r = clusterctl("logs", "latest", cwd=project)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    steps = [int(m.group(1)) for l in lines if (m := re.search(r"step +(\d+)/40", l))]
    assert steps == sorted(steps) and steps[-1] == 40 and all(l.startswith("[rank ") for l in lines)
    one = clusterctl("logs", ids[0][:17], "--rank", "0", "--grep", "held-out", cwd=project)   # an id prefix
    assert one.returncode == 0, one.stderr
    assert [re.sub(r"[0-9.]+$", "L", l) for l in one.stdout.splitlines()] == [
        "step 20 | held-out loss L", "step 40 | held-out loss L"]
    bad = clusterctl("logs", "latest", "--rank", "7", cwd=project)
    assert bad.returncode == 2 and "has no rank 7" in bad.stderr
    assert clusterctl("logs", "nope", cwd=project).returncode == 2
    quiet = clusterctl("logs", "latest", "--rank", "1", cwd=project)      # the trainer's rank 1 prints nothing
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == "(rank 1 printed nothing)\n"
    unmatched = clusterctl("logs", "latest", "--rank", "0", "--grep", "no such text", cwd=project)
    assert unmatched.returncode == 0 and unmatched.stderr == "(rank 0 printed nothing that matches)\n"


def test_stacks_of_an_ended_run_say_there_is_nothing_to_ask(two_runs, tmp_path):
    project, ids = two_runs
    r = clusterctl("stacks", ids[0], cwd=project)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == (f"error: run {ids[0]} is not running (exit 0: all 2 ranks finished): there are no "
                                "ranks to ask"), r.stderr
    r = clusterctl("stacks", "latest", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: no runs in runs/"), r.stderr


def _pixels(path, colour):
    import matplotlib.image
    import numpy as np

    image = matplotlib.image.imread(path)[:, :, :3]
    rgb = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(image - rgb).max(axis=2) < 0.03).sum())


def test_plot_overlays_two_runs_in_a_png_of_the_stated_size(two_runs):
    project, ids = two_runs
    out = project / "both.png"
    r = clusterctl("plot", *ids, "-o", str(out), "--size", "800x500", cwd=project)
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (800, 500)
    first, second = _pixels(str(out), PALETTE[0]), _pixels(str(out), PALETTE[1])
    assert first > 1000 and second > 1000, (first, second)        # a curve each, not just a legend swatch
    assert _pixels(str(out), PALETTE[2]) == 0
    for run_id in ids:                                          # and `run` drew each run's own
        own = project / "runs" / run_id / "loss.png"
        assert own.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and _pixels(str(own), PALETTE[0]) > 400
    text = clusterctl("plot", "latest", cwd=project)
    assert text.returncode == 0 and "step 40" in text.stdout and f"{ids[1]} | loss 5." in text.stdout


def test_plot_to_a_file_without_matplotlib_says_how_to_install_it(two_runs, tmp_path):
    project, _ = two_runs
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('not here')\n")
    env = {**_env(project), "PYTHONPATH": str(tmp_path)}
    r = clirun.clusterctl("plot", "latest", "-o", str(tmp_path / "x.png"), cwd=project, env=env, timeout=None)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: plot -o needs matplotlib, which is not installed: pip install matplotlib")
    r = clirun.clusterctl("plot", "latest", cwd=project, env=env, timeout=None)
    assert r.returncode == 0 and "step 40" in r.stdout                   # the text chart needs nothing


SLOW = """\
import os, sys, time
rank = os.environ["MLX_RANK"]
for i in range(8):
    print(f"line {i} of rank {rank}", flush=True)
    time.sleep(0.5)
"""


def test_logs_follow_a_live_run_until_it_ends(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    run = subprocess.Popen([sys.executable, "-m", "clusterctl", "run", "slow.py"], cwd=tmp_path, env=_env(tmp_path),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "runs").glob("*/rank-0.log")) and time.monotonic() < deadline:
            time.sleep(0.1)
        follow = subprocess.Popen([sys.executable, "-m", "clusterctl", "logs", "latest", "--follow"], cwd=tmp_path,
                                  env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        arrivals = []
        for line in follow.stdout:
            arrivals.append((time.monotonic(), line.rstrip("\n")))
        follow.wait(30)
        ended = time.monotonic()
        assert run.wait(30) == 0
    finally:
        run.kill()
    texts = [t for _, t in arrivals]
    for rank in (0, 1):
        assert [t for t in texts if f"of rank {rank}" in t] == [f"[rank {rank} localhost] line {i} of rank {rank}"
                                                             for i in range(8)]
    assert arrivals[-1][0] - arrivals[0][0] > 1.5          # lines came as the run printed them, not at once
    assert follow.returncode == 0 and ended - arrivals[-1][0] < 10   # and following stopped with the run


def test_completion_scripts_are_clicks_own():
    for shell, marker in (("bash", "_CLUSTERCTL_COMPLETE=bash_complete"), ("zsh", "#compdef clusterctl"),
                          ("fish", "_CLUSTERCTL_COMPLETE=fish_complete")):
        r = CliRunner().invoke(cli, ["completion", shell])
        assert r.exit_code == 0 and marker in r.output, (shell, r.output)
    env = {**os.environ, "_CLUSTERCTL_COMPLETE": "bash_complete", "COMP_WORDS": "clusterctl lo", "COMP_CWORD": "1"}
    r = clirun.clusterctl(env=env, timeout=None)
    assert r.returncode == 0 and "plain,logs" in r.stdout.splitlines()
