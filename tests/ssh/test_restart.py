"""`clusterctl run --max-restarts N [--elastic MIN]` on the real loopback cluster (3 sshd hosts, each with its
own root where `unshare -m` works), with the bundled trainer checkpointing every few steps.

- kill -9 of one rank, among other faults: tests/ssh/test_storm.py (its curve equals an uninterrupted run's);
- a host whose sshd stops (its ranks die with it) under --elastic 2: the run goes on with the 2 others, and
  takes the host back, with the checkpoint it missed, when it answers again;
- a program that always fails uses exactly N restarts and exits with its own code.
"""
import json
import os
import re
import subprocess
import time
from functools import partial

import clirun
import pytest
from sshcluster import rank_pid, requires_private_roots

pytestmark = pytest.mark.ssh

TOKEN = clirun.TOKEN
STEP = re.compile(r"\] step +(\d+)/\d+ \|")
CHECKPOINT = re.compile(r"\] step (\d+) \| checkpoint ")
STEPS = 60
TRAIN = ["--n-layers", "2", "--dim", "32", "--n-heads", "2", "--mlp-dim", "64", "--block-size", "32",
         "--batch-size", "4", "--warmup", "5", "--steps", str(STEPS), "--report-every", "1", "--eval-every", "0",
         "--ckpt-every", "10", "--dropout", "0.1",
         # even shares throughout: auto could move rows at other steps in the reference run than in the restarted
         # one (its shares follow measured speeds), and this compares the curves to the last bit
         "--balance", "off"]


def _env(cwd):
    return {**os.environ, "XDG_CACHE_HOME": os.path.join(str(cwd), ".cache")}


clusterctl = partial(clirun.clusterctl, timeout=300, own_cache=True)


start = partial(clirun.start, "run", own_cache=True)


def until_past_a_checkpoint(job, limit=180.0) -> tuple[str, list[str]]:
    """Read the job's output until training is 2 steps past a checkpoint; (run id, lines so far)."""
    lines, ckpt, deadline = [], None, time.monotonic() + limit
    while time.monotonic() < deadline:
        line = job.stdout.readline()
        assert line, "the job ended early:\n" + "".join(lines)
        lines.append(line)
        if (m := CHECKPOINT.search(line)):
            ckpt = int(m.group(1))
        if ckpt is not None and (m := STEP.search(line)) and int(m.group(1)) >= ckpt + 2:
            return TOKEN.search("".join(lines)).group(1), lines
    raise AssertionError("no checkpoint in time:\n" + "".join(lines))


def drive(job, fault) -> tuple[str, str]:
    """Let the job train past a checkpoint, then inject `fault(run_id)` (it may read on and return the lines
    it read), and wait for the job's end, which must be a success: (run id, everything the job printed)."""
    try:
        run_id, lines = until_past_a_checkpoint(job)
        lines += fault(run_id) or []
        out, _ = job.communicate(timeout=300)
    finally:
        job.kill()
    text = "".join(lines) + out
    assert job.returncode == 0, text[-3000:]
    return run_id, text


def curve(run_dir) -> dict[int, tuple[float, float]]:
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == sorted(set(steps)), steps           # one curve: what the failed attempt repeated is gone
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if "loss" in r}


def summary(cwd, run_id):
    with open(os.path.join(cwd, "runs", run_id, "summary.json")) as f:
        return json.load(f)


def nothing_left(cluster, run_id, hosts):
    left = subprocess.run(["pgrep", "-f", f"clusterctl-run-{run_id}"], capture_output=True, text=True).stdout.split()
    if left:
        time.sleep(3)      # a rank's last moments after the run said it ended are not a leftover; then ask again
        left = subprocess.run(["pgrep", "-f", f"clusterctl-run-{run_id}"], capture_output=True, text=True).stdout.split()
    assert not left, subprocess.run(["ps", "-o", "pid,ppid,etime,args", "-p", ",".join(left)], capture_output=True,
                                    text=True).stdout[:3000]
    for i in hosts:
        ps = cluster.ssh(i, "ps -eo args")
        assert ps.returncode == 0 and f"clusterctl-run-{run_id}" not in ps.stdout


def elastic_job(cluster, tmp_path, max_restarts: int):
    """The bundled trainer on 3 hosts under --elastic 2, from shards prepared for 3 ranks."""
    requires_private_roots(cluster, "each host keeps its own checkpoints")
    prep = clusterctl("data", "prepare", "embedded:300", "--world", "3", "--out", str(tmp_path / "tiny"), cwd=tmp_path)
    assert prep.returncode == 0, prep.stderr
    return cluster, start("--hosts", str(cluster.inventory), "--backend", "ring", "--max-restarts", str(max_restarts),
                          "--elastic", "2", "--restart-delay", "1", "--data", str(tmp_path / "tiny"), "--", *TRAIN,
                          cwd=tmp_path)


def test_elastic_finishes_on_the_2_hosts_that_remain_when_one_stops(make_cluster, tmp_path):
    """The issue's own acceptance: host 3's sshd stops and its ranks die with it, under --max-restarts 1
    --elastic 2 and shards prepared for 3 (--data): the run finishes on the 2 others, on the same tokens
    cut in 2, exit 0, both attempts in summary.json, no process of the run left."""
    cluster, job = elastic_job(make_cluster(3), tmp_path, max_restarts=1)
    run_id, text = drive(job, lambda _: cluster.stop_host(3))
    assert "elastic: continuing on 2 rank(s) on h1, h2; left out: h3" in text
    s = summary(tmp_path, run_id)
    assert s["exit_code"] == 0 and s["restarts"] == 1
    assert [(a["world"], a["hosts"], a["outcome"]) for a in s["attempts"]] == [
        (3, ["h1", "h2", "h3"], "failed"), (2, ["h1", "h2"], "ok")]
    assert s["attempts"][0]["failed_host"] == "h3" and s["attempts"][1]["resumed_from"].startswith("step-")
    assert sorted(curve(tmp_path / "runs" / run_id)) == list(range(1, STEPS + 1))
    for i in (1, 2):                                     # each remaining host holds its new shard only
        ls = cluster.ssh(i, f"ls {cluster.workdir}/data/tiny").stdout.split()
        assert ls == sorted([f"shard-0000{i - 1}-of-00002.bin", "val.bin", "manifest.json"]), ls
    nothing_left(cluster, run_id, (1, 2))


def test_elastic_finishes_on_the_hosts_that_remain_and_takes_back_one_that_returns(make_cluster, tmp_path):
    """Shards prepared for 3 ranks (--data). Host 3 stops (its sshd and every session under it: rank 2 dies
    with them): the run goes on with 2 ranks, on the same tokens cut in 2. Host 3 comes back with its disk
    (a Mac waking up) and rank 1 is killed: the next attempt runs on all 3 again, host 3 given the
    checkpoint it missed."""
    cluster, job = elastic_job(make_cluster(3, persistent_roots=True), tmp_path, max_restarts=2)

    def away_and_back(run_id):
        cluster.stop_host(3)
        _, more = until_past_a_checkpoint(job)          # the second attempt, on 2 hosts, past its own checkpoint
        assert "elastic: continuing on 2 rank(s) on h1, h2; left out: h3" in "".join(more)
        cluster.start_host(3)
        os.kill(rank_pid(run_id, 1), 9)
        return more

    run_id, text = drive(job, away_and_back)
    assert "elastic: continuing on 3 rank(s) on h1, h2, h3; left out: none" in text
    s = summary(tmp_path, run_id)
    assert s["exit_code"] == 0 and s["restarts"] == 2
    assert [(a["world"], a["hosts"], a["outcome"]) for a in s["attempts"]] == [
        (3, ["h1", "h2", "h3"], "failed"), (2, ["h1", "h2"], "failed"), (3, ["h1", "h2", "h3"], "ok")]
    first, second, third = s["attempts"]
    assert first["failed_host"] == "h3" and "lost its ssh connection" in first["reason"]
    assert re.fullmatch(r"rank 1 on h2 was killed by SIGKILL(; followed from it: .*)?", second["reason"]), second
    assert first["resumed_from"] is None and second["resumed_from"] < third["resumed_from"]
    assert f"elastic: copied checkpoint {third['resumed_from']} from h1 to h3" in text
    got = curve(tmp_path / "runs" / run_id)
    assert sorted(got) == list(range(1, STEPS + 1))      # one curve across both world changes
    assert "this run has 2" in text and "this run has 3" in text   # the trainer says the batches differ
    for i, shard in ((1, "shard-00000-of-00003.bin"), (2, "shard-00001-of-00003.bin"), (3, "shard-00002-of-00003.bin")):
        ls = cluster.ssh(i, f"ls {cluster.workdir}/data/tiny").stdout.split()
        assert ls == sorted([shard, "val.bin", "manifest.json"]), ls
    assert (tmp_path / "runs" / run_id / "data-world-2" / "tiny" / "manifest.json").is_file()
    nothing_left(cluster, run_id, (1, 2, 3))


def test_a_host_that_goes_to_sleep_is_noticed_by_its_silence_and_left_out(make_cluster, tmp_path):
    """Host 3 freezes, ranks and sshd (a Mac asleep): no error ever comes, only silence. A restartable run
    notices its ranks' heartbeats stopped, and the re-check finds the host not answering; the run finishes
    on the 2 others. Woken afterwards, what the first attempt left there is stopped by `clusterctl kill`."""
    cluster = make_cluster(3)
    requires_private_roots(cluster, "each host keeps its own checkpoints")
    job = start("--hosts", str(cluster.inventory), "--backend", "ring", "--max-restarts", "1", "--elastic", "2",
                "--restart-delay", "0", "--hang-timeout", "4", "--connect-timeout", "3", "--", *TRAIN, cwd=tmp_path)
    frozen = []
    try:
        run_id, text = drive(job, lambda _: frozen.extend(cluster.sleep_host(3)))
    finally:
        cluster.wake_host(3, frozen)
    assert "hang timeout: no output and no heartbeat from rank 2 on h3" in text
    assert "elastic: continuing on 2 rank(s) on h1, h2; left out: h3" in text
    s = summary(tmp_path, run_id)
    assert [(a["world"], a["outcome"], a["exit_code"]) for a in s["attempts"]] == [(3, "failed", 124), (2, "ok", 0)]
    assert s["attempts"][0]["failed_host"] == "h3"
    k = clusterctl("kill", run_id, "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert k.returncode == 0, k.stdout + k.stderr
    nothing_left(cluster, run_id, (1, 2, 3))


def test_a_restart_waits_for_a_host_that_reboots_and_goes_on_when_it_answers(make_cluster, tmp_path):
    """Without --elastic, h2 stops (sshd and its sessions: a Mac rebooting) and is started again 8 s into the
    restart's re-check: the restart asks it again every 5 s instead of failing on the refused connection, says
    so, and the next attempt runs on both hosts when h2 answers; summary.json has how long it waited."""
    cluster = make_cluster(2, persistent_roots=True)           # h2 comes back with the project's copy
    (tmp_path / "reboot.py").write_text(
        "import os, time\nprint('attempt', os.environ['CLUSTERCTL_RESTART'], flush=True)\n"
        "if os.environ['CLUSTERCTL_RESTART'] == '0':\n    time.sleep(300)\n")
    job = start("--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--max-restarts", "1",
                "--restart-delay", "0", "--host-wait", "60", "--connect-timeout", "5", "reboot.py", cwd=tmp_path)
    seen = []

    def read_until(text, limit=120.0):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            line = job.stdout.readline()
            assert line, "the job ended early:\n" + "".join(seen)
            seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in time:\n" + "".join(seen))

    try:
        read_until("] attempt 0")
        read_until("] attempt 0")                                 # both ranks up
        cluster.stop_host(2)
        waits = read_until("waits for h2 to answer over SSH")
        time.sleep(8)                                               # a poll or two meets the refusal again
        cluster.start_host(2)
        out, _ = job.communicate(timeout=120)
    finally:
        job.kill()
    text = "".join(seen) + out
    assert job.returncode == 0, text[-3000:]
    assert "restart 1 waits for h2 to answer over SSH, up to 60s (--host-wait): " in waits
    assert "connection refused" in waits, waits
    back = re.search(r": h2 answers again after (\d+)s; restart 1 goes on", text)
    assert back and int(back.group(1)) >= 8, text[-3000:]
    assert sorted(re.findall(r"\[rank (\d) h\d\] attempt 1", text)) == ["0", "1"], text[-3000:]
    run_id = TOKEN.search(text).group(1)
    s = summary(tmp_path, run_id)
    assert [(a["outcome"], a.get("host_wait_s")) for a in s["attempts"]][0] == ("failed", None)
    assert s["attempts"][1]["outcome"] == "ok" and s["attempts"][1]["host_wait_s"] >= 8
    nothing_left(cluster, run_id, (1, 2))


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_a_program_that_always_fails_uses_exactly_n_restarts_and_exits_with_its_code(make_cluster, tmp_path, backend):
    cluster = make_cluster(2)
    (tmp_path / "fail.py").write_text(
        "import os, sys\n"
        "print('attempt', os.environ['CLUSTERCTL_RESTART'], os.environ.get('CLUSTERCTL_RESUME_DIR', '-'), flush=True)\n"
        "sys.exit(3)\n")
    r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", backend, "--max-restarts", "2",
                   "--restart-delay", "0", "fail.py", cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    run_id = TOKEN.search(r.stderr).group(1)
    s = summary(tmp_path, run_id)
    assert s["exit_code"] == 3 and s["restarts"] == 2
    assert [a["attempt"] for a in s["attempts"]] == [0, 1, 2]
    assert all(a["outcome"] == "failed" and a["exit_code"] == 3 for a in s["attempts"])
    assert r.stderr.count("restart ") == 2 and "restart 2 of 2" in r.stderr
    seen = sorted(set(re.findall(r"\] attempt (\d) (\S+)", r.stdout)))
    where = f"{cluster.workdir}/runs/{run_id}"         # absolute on the host, as CLUSTERCTL_RUN_DIR
    assert seen == [("0", "-"), ("1", where), ("2", where)], r.stdout
    # each attempt's logs on their own; the run's hold them all; runs says how many restarts it took
    logs = clusterctl("logs", run_id, "--attempt", "1", cwd=tmp_path)
    assert logs.returncode == 0 and set(re.findall(r"\] attempt (\d)", logs.stdout)) == {"1"}, logs.stdout
    assert set(re.findall(r"\] attempt (\d)", clusterctl("logs", run_id, cwd=tmp_path).stdout)) == {"0", "1", "2"}
    bad = clusterctl("logs", run_id, "--attempt", "3", cwd=tmp_path)
    assert bad.returncode == 2 and f"run {run_id} has no attempt 3 (attempts 0, 1, 2)" in bad.stderr
    info = json.loads(clusterctl("runs", "--json", cwd=tmp_path).stdout)[0]
    assert info["run_id"] == run_id and info["restarts"] == 2
    assert "exit 3: rank" in clusterctl("runs", cwd=tmp_path).stdout and "after 2 restarts" in clusterctl("runs", cwd=tmp_path).stdout
    # without --max-restarts: today's single attempt, logs directly in runs/<id>/, no restart variables
    r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", backend, "fail.py", cwd=tmp_path)
    assert r.returncode == 1 and "KeyError: 'CLUSTERCTL_RESTART'" in r.stdout + r.stderr
    once = TOKEN.search(r.stderr).group(1)
    assert not [p for p in os.listdir(tmp_path / "runs" / once) if p.startswith("attempt-")]
    assert "attempts" not in summary(tmp_path, once)


def test_sigterm_during_the_restart_delay_stops_the_run_at_once(tmp_path):
    """Between attempts nothing runs; a stop there ends the run as a stop in a job does (summary written)."""
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(3)\n")
    job = start("--no-sync", "--max-restarts", "2", "--restart-delay", "60", "fail.py", cwd=tmp_path)
    try:
        seen = ""
        deadline = time.monotonic() + 60
        while "restart 1 of 2 in 60s" not in seen and time.monotonic() < deadline:
            seen += job.stdout.readline()
        job.terminate()
        out, _ = job.communicate(timeout=20)
    finally:
        job.kill()
    assert job.returncode == 143, seen + out
    assert "SIGTERM received before restart 1: nothing was running" in out
    run_id = TOKEN.search(seen).group(1)
    s = summary(tmp_path, run_id)
    assert s["exit_code"] == 143 and [a["outcome"] for a in s["attempts"]] == ["failed"]
