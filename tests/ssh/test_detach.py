"""Detached runs (issue 54, docs/run.md#close-the-lid-detached-runs): `run --detach` hands the job to a supervisor on
one of its hosts and returns; the job goes on with nothing of this machine running, restarts without it, and comes
home on `attach` with the loss an attached run of the same seed and world ends with."""
import json
import os
import re
import signal
import subprocess
import time

import clirun
import pytest
from sshcluster import requires_private_roots
from storm import TRAIN as STORM_TRAIN
from test_restart import curve, nothing_left

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

STEPS = 240
TRAIN = [*STORM_TRAIN[:STORM_TRAIN.index("--steps")], "--steps", str(STEPS),
         *STORM_TRAIN[STORM_TRAIN.index("--steps") + 2:]]
STEP = re.compile(r"\] step +(\d+)/\d+ \|")


def supervisor_log(cluster, index, run_id) -> str:
    got = cluster.ssh(index, f"cat {cluster.workdir}/.clusterctl/detached/{run_id}/supervisor.log")
    return got.stdout


def last_step(text: str) -> int:
    steps = [int(m.group(1)) for m in STEP.finditer(text)]
    return steps[-1] if steps else 0


def wait_until(what, check, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"not in {limit:g}s: {what}")


def test_a_detached_run_goes_on_alone_restarts_without_this_machine_and_ends_as_an_attached_run(make_cluster, tmp_path):
    cluster = make_cluster(3, persistent_roots=True)
    requires_private_roots(cluster, "a host stopped and started keeps its checkpoints")
    calm_hosts = make_cluster(3)
    (tmp_path / "away").mkdir()
    (tmp_path / "calm").mkdir()
    calm = clirun.start("run", "--hosts", str(calm_hosts.inventory), "--backend", "ring", "--plain", "--", *TRAIN,
                        cwd=tmp_path / "calm", own_cache=True)
    began = time.monotonic()
    detached = clirun.clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--detach",
                                 "--max-restarts", "1", "--restart-delay", "1", "--", *TRAIN, cwd=tmp_path / "away",
                                 own_cache=True, timeout=120)
    took = time.monotonic() - began
    assert detached.returncode == 0, detached.stderr[-3000:]
    run_id = detached.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", run_id)
    assert f"run {run_id}: detached; its supervisor runs on h1" in detached.stderr
    assert f"clusterctl attach {run_id}" in detached.stderr
    assert took < 60, took

    # nothing of clusterctl runs here any more; an attach started and killed with SIGKILL changes nothing
    follower = clirun.start("attach", run_id, cwd=tmp_path / "away", own_cache=True)
    wait_until("steps through attach", lambda: STEP.search(follower.stdout.readline() or ""), limit=180)
    follower.send_signal(signal.SIGKILL)
    follower.wait(10)
    here = subprocess.run(["pgrep", "-f", f"-m clusterctl (run|attach).*{run_id}"], capture_output=True, text=True)
    assert not here.stdout.strip(), here.stdout
    # the steps go on, as the supervising host sees them
    first = wait_until("a step on h1", lambda: last_step(supervisor_log(cluster, 1, run_id)))
    wait_until("more steps on h1", lambda: last_step(supervisor_log(cluster, 1, run_id)) > first + 10)
    # a host lost mid-run: the supervisor restarts from the checkpoint, with this machine doing nothing
    wait_until("a checkpoint", lambda: re.search(r"step \d+ \| checkpoint ", supervisor_log(cluster, 1, run_id)))
    cluster.stop_host(3)
    wait_until("the restart line", lambda: "restart 1 of 1" in supervisor_log(cluster, 1, run_id))
    cluster.start_host(3)

    attached = clirun.clusterctl("attach", run_id, cwd=tmp_path / "away", own_cache=True, timeout=400)
    assert attached.returncode == 0, attached.stderr[-3000:] + attached.stdout[-3000:]
    assert "rank 2 on h3" in attached.stdout and "restart 1 of 1" in attached.stdout      # what was printed unwatched
    assert f"attach: run {run_id} came home from h1" in attached.stderr
    calm_out, _ = calm.communicate(timeout=400)
    assert calm.returncode == 0, calm_out[-3000:]
    calm_id = clirun.TOKEN.search(calm_out).group(1)

    home = tmp_path / "away" / "runs" / run_id
    with open(home / "summary.json") as f:
        summary = json.load(f)
    assert summary["exit_code"] == 0 and summary["restarts"] == 1, summary
    assert not (home / "handoff.json").exists()        # the inventory's env values stay nowhere
    # the same final model as the same run left attached (resume is exact)
    away, here_curve = curve(home), curve(tmp_path / "calm" / "runs" / calm_id)
    assert max(away) == max(here_curve) == STEPS
    assert away[STEPS] == here_curve[STEPS]
    listed = clirun.clusterctl("runs", "--json", cwd=tmp_path / "away", own_cache=True)
    row = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id][0]
    assert row["status"] == "ok" and row["final_loss"] == away[STEPS][0], row
    nothing_left(cluster, run_id, [1, 2, 3])
    gone = cluster.ssh(1, "ps -eo args")
    assert f".clusterctl/detached/{run_id}/handoff.json" not in gone.stdout


def test_attach_ctrl_c_leaves_it_running_kill_stops_it_with_a_checkpoint_and_export_works(make_cluster, tmp_path):
    cluster = make_cluster(2)
    detached = clirun.clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--detach",
                                 "--", *TRAIN[:TRAIN.index("--steps")], "--steps", "100000",
                                 *TRAIN[TRAIN.index("--steps") + 2:], cwd=tmp_path, own_cache=True, timeout=120)
    assert detached.returncode == 0, detached.stderr[-3000:]
    run_id = detached.stdout.strip().splitlines()[-1]
    follower = clirun.start("attach", "latest", cwd=tmp_path, own_cache=True)
    wait_until("steps through attach", lambda: STEP.search(follower.stdout.readline() or ""), limit=180)
    follower.send_signal(signal.SIGINT)
    out, _ = follower.communicate(timeout=30)
    assert follower.returncode == 0, out[-2000:]
    assert f"attach: detached from run {run_id}; it goes on under its supervisor on h1" in out
    step = last_step(supervisor_log(cluster, 1, run_id))
    wait_until("steps after Ctrl-C", lambda: last_step(supervisor_log(cluster, 1, run_id)) > step + 5)
    listed = clirun.clusterctl("runs", cwd=tmp_path, own_cache=True)
    assert re.search(rf"{run_id} .* h1,h2 .* running \(detached, on h1\)", listed.stdout), listed.stdout

    killed = clirun.clusterctl("kill", run_id, cwd=tmp_path, own_cache=True, timeout=180)
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert f"kill: run {run_id} stopped by its supervisor on h1; its run directory came home" in killed.stderr
    log = (tmp_path / "runs" / run_id / "supervisor.log").read_text()
    assert re.search(r"stopped at step \d+/100000 by SIGTERM, its checkpoint written", log), log[-3000:]
    listed = clirun.clusterctl("runs", "--json", cwd=tmp_path, own_cache=True)
    row = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id][0]
    assert row["status"] == "stopped", row
    exported = clirun.clusterctl("export", "latest", "-o", str(tmp_path / "model"), cwd=tmp_path, own_cache=True,
                                 timeout=120)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert (tmp_path / "model").is_dir() and os.listdir(tmp_path / "model")
    nothing_left(cluster, run_id, [1, 2])


def test_the_supervising_host_lost_stops_every_rank_and_runs_says_why(make_cluster, tmp_path):
    cluster = make_cluster(3, persistent_roots=True)
    requires_private_roots(cluster, "the supervising host comes back with its disk")
    detached = clirun.clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--detach",
                                 "--", *TRAIN[:TRAIN.index("--steps")], "--steps", "100000",
                                 *TRAIN[TRAIN.index("--steps") + 2:], cwd=tmp_path, own_cache=True, timeout=120)
    assert detached.returncode == 0, detached.stderr[-3000:]
    run_id = detached.stdout.strip().splitlines()[-1]
    wait_until("steps on h1", lambda: last_step(supervisor_log(cluster, 1, run_id)) > 5, limit=180)
    cluster.stop_host(1)          # the supervising host dies: its supervisor, its ranks, its sshd
    lost = time.monotonic()
    wait_until("every rank gone", lambda: not subprocess.run(["pgrep", "-f", f"clusterctl-run-{run_id}"],
                                                             capture_output=True).stdout, limit=30)
    assert time.monotonic() - lost < 15
    away = clirun.clusterctl("runs", cwd=tmp_path, own_cache=True)
    assert re.search(rf"{run_id} .* unknown \(detached, on h1\): unreachable", away.stdout), away.stdout
    cluster.start_host(1)
    back = clirun.clusterctl("runs", "--json", cwd=tmp_path, own_cache=True)
    row = [r for r in json.loads(back.stdout) if r["run_id"] == run_id][0]
    assert row["status"] == "failed" and "its supervisor on h1 was lost" in row["reason"], row
    assert "--resume latest" in row["reason"]
    nothing_left(cluster, run_id, [1, 2, 3])
