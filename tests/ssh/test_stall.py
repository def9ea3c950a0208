"""Stalls and stacks (docs/run.md#stalls, docs/run.md#stacks) on the real loopback cluster.

- A 3-rank program in which rank 1 sleeps instead of joining the 5th all_sum (ranks 0 and 2 wait inside it),
  under --stall-timeout 20, over ring and over mpi: `run` exits 125 well within 90 s, says stalled and names
  rank 1, runs/<id>/stacks/ holds every rank's stack with the program's lines, and nothing of the job is
  left on any host; over ring, rank 1 also ignores SIGTERM (it is killed after the grace period).
- The same program stalling only in its first attempt, under --max-restarts 1 (--stall-timeout 10): exit 0,
  attempt 0 "stalled".
- `clusterctl stacks latest` during a healthy run of the bundled trainer: every rank's stack within 5 s, in
  the trainer's frames, and the run ends as an undisturbed one does, loss for loss.
- A program that announces a quiet phase longer than the stall timeout is not stopped.
"""
import json
import os
import re
import time

import clirun
import pytest
from test_run import TOKEN, assert_nothing_left, run, start, wait_for_lines

pytestmark = pytest.mark.ssh

STALL = """
import os, signal, sys, time
import mlx.core as mx

group = mx.distributed.init()
first_attempt = os.environ.get("CLUSTERCTL_RESTART", "0") == "0"
for i in range(1, 9):
    if i == 5 and group.rank() == 1 and first_attempt:
        if "--ignore-term" in sys.argv:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    x = mx.distributed.all_sum(mx.ones(4), group=group)
    mx.eval(x)
    print(f"iteration {i} sum {x[0].item():g}", flush=True)
    time.sleep(0.2)
"""

TRAIN = ["--n-layers", "2", "--dim", "32", "--n-heads", "2", "--mlp-dim", "64", "--block-size", "32",
         "--batch-size", "4", "--warmup", "5", "--steps", "150", "--report-every", "10", "--eval-every", "100",
         "--ckpt-every", "0", "--dropout", "0.1",
         # even shares: a rank paused for its stacks could look slow to --balance auto, which would then move rows
         # (the same updates, summed in another order: the final loss is compared to the last digit)
         "--balance", "off"]


def summary(tmp_path, run_id) -> dict:
    with open(tmp_path / "runs" / run_id / "summary.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_a_stalled_job_is_stopped_with_every_ranks_stack_and_the_odd_one_named(make_cluster, tmp_path, backend):
    cluster = make_cluster(3)
    (tmp_path / "stall.py").write_text(STALL)
    extra = ["--ignore-term"] if backend == "ring" else []
    began = time.monotonic()
    r = run("--hosts", str(cluster.inventory), "--backend", backend, "--plain", "--stall-timeout", "20",
            "stall.py", *extra, cwd=tmp_path)
    took = time.monotonic() - began
    out = r.stdout + r.stderr
    assert r.returncode == 125, out[-3000:]
    assert took < 90, took
    run_id = TOKEN.search(r.stderr).group(1)
    reason = re.search(r"failed: (stalled: .*)", r.stderr).group(1)
    assert reason.startswith("stalled: no progress from any rank for ")
    assert "rank 1 is the odd one out: time.sleep(3600) at stall.py:" in reason, reason
    assert re.search(r"ranks 0, 2 +mx\.eval\(x\) at stall\.py:\d+", r.stderr), r.stderr
    s = summary(tmp_path, run_id)
    assert s["exit_code"] == 125 and s["reason"] == reason and s["failed_rank"] == 1
    folder = tmp_path / "runs" / run_id / s["stacks"]
    assert sorted(os.listdir(folder)) == ["rank-0.txt", "rank-1.txt", "rank-2.txt", "stacks.json"]
    for rank in (0, 1, 2):
        text = (folder / f"rank-{rank}.txt").read_text()
        assert "(main thread)" in text and "stall.py" in text
        assert ("time.sleep(3600)" in text) == (rank == 1) and ("mx.eval(x)" in text) == (rank != 1)
    # the run is over: `stacks` shows the stall's, as saved
    again = clirun.clusterctl("stacks", "latest", cwd=tmp_path, own_cache=True)
    assert again.returncode == 0, again.stderr
    assert f"stacks of 3 rank(s) of run {run_id} in {folder} (saved " in again.stdout, again.stdout
    assert ", the stall's; the run ended: exit 125):" in again.stdout, again.stdout
    assert re.search(r"rank 1 +time\.sleep\(3600\) at stall\.py:\d+ +<- the odd one out", again.stdout), again.stdout
    assert run_listing(tmp_path)[run_id].startswith("exit 125: stalled: no progress from any rank")
    assert_nothing_left(cluster, run_id)
    for i in (1, 2, 3):            # the killed ranks' pid and stacks files went with them
        assert cluster.ssh(i, f"ls {cluster.workdir}/.clusterctl/runs/{run_id} 2>/dev/null | wc -l").stdout.strip() == "0"


def run_listing(tmp_path) -> dict[str, str]:
    from clirun import clusterctl
    r = clusterctl("runs", "--json", cwd=tmp_path, own_cache=True)
    assert r.returncode == 0, r.stderr
    return {row["run_id"]: f"exit {row['exit_code']}: {row['reason']}" for row in json.loads(r.stdout)}


def test_a_stall_restarts_like_a_crash(make_cluster, tmp_path):
    cluster = make_cluster(3)
    (tmp_path / "stall.py").write_text(STALL)
    r = run("--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--stall-timeout", "10",
            "--max-restarts", "1", "--restart-delay", "1", "stall.py", cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    s = summary(tmp_path, TOKEN.search(r.stderr).group(1))
    first, second = s["attempts"]
    assert first["outcome"] == "stalled" and first["exit_code"] == 125 and first["failed_rank"] == 1
    assert first["stacks"].startswith("stacks/") and second["outcome"] == "ok"
    assert r.stdout.count("iteration 8 sum 3") == 3


def test_stacks_of_a_healthy_run_leave_it_unharmed(make_cluster, tmp_path):
    cluster = make_cluster(2)
    reference = run("--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--", *TRAIN, cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-2000:]
    # each step at least 0.1 s (the trainer's test aid; nothing it computes changes): the run is still there when its
    # stacks are asked for at step 20, however fast its ranks step (a clean clone saw it end first)
    job = start("--hosts", str(cluster.inventory), "--backend", "ring", "--plain", *clirun.paced(0.1), "--", *TRAIN,
                cwd=tmp_path)
    try:
        lines = wait_for_lines(job, lambda line: " step  20/150 " in line, 1, limit=120)
        run_id = TOKEN.search("".join(lines)).group(1)
        from clirun import clusterctl
        began = time.monotonic()
        asked = clusterctl("stacks", "latest", cwd=tmp_path, own_cache=True)
        took = time.monotonic() - began
        out, _ = job.communicate(timeout=300)
    finally:
        job.kill()
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert took < 30, took      # its speed is a benchmark (benchmarks/bench_stall.py: 0.67 s); here it must only not hang
    assert f"stacks of 2 rank(s) of run {run_id}" in asked.stdout
    # healthy ranks are caught wherever their step is: together on one line, or one at the step's call and the
    # other at the eval after it (seen in CI), or writing its report line (clusterctl/progress.py, seen once), or
    # agreeing after a step whether to stop (stopping.py, seen in CI); each rank is named once, in the trainer's code
    shown = re.findall(r"^ +ranks? (\d+(?:, \d+)*) +.* at (trainer|step|strategies|stopping|metrics|callbacks|progress)"
                       r"\.py:\d+", asked.stdout, re.M)
    named = sorted(int(r) for ranks, _ in shown for r in ranks.split(","))
    assert named == [0, 1], asked.stdout
    folder = tmp_path / "runs" / run_id / "stacks"
    [taken] = os.listdir(folder)
    for rank in (0, 1):
        assert "clusterctl/train/trainer.py" in (folder / taken / f"rank-{rank}.txt").read_text()
    assert job.returncode == 0, out[-2000:]

    def final_loss(text):
        return re.findall(r"step 150/150 \| loss (\S+)", text)[-1]
    assert final_loss("".join(lines) + out) == final_loss(reference.stdout)


def test_an_announced_quiet_phase_is_not_a_stall(make_cluster, tmp_path):
    cluster = make_cluster(2)
    (tmp_path / "quiet.py").write_text(
        "import json, time\n"
        "def report(**fields):\n    print('clusterctl:metrics ' + json.dumps(fields), flush=True)\n"
        "for step in range(1, 4):\n    report(step=step, total_steps=6)\n    time.sleep(0.5)\n"
        "report(quiet_s=30)\ntime.sleep(12)\n"
        "for step in range(4, 7):\n    report(step=step, total_steps=6)\n    time.sleep(0.5)\nprint('done', flush=True)\n")
    r = run("--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--stall-timeout", "5", "quiet.py",
            cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert r.stdout.count("done") == 2
