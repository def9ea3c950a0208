"""Detached runs (issue 54, docs/run.md#close-the-lid-detached-runs): `run --detach` hands the job to a supervisor on
one of its hosts and returns; the job goes on with nothing of this machine running and with this machine cut off
(tests/sshcluster.py own_route), restarts without it, stalls are caught and their stacks seen from here, and it comes
home on `attach` with the loss an attached run of the same seed and world ends with; the dashboard reads it from its
supervising host; a supervising host that vanishes without closing a connection (frozen whole) leaves no rank on the
others past the rank starter's ALIVE_S."""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import clirun
import dataplane
import lmfixture
import pytest
from sshcluster import rank_pid, requires_private_roots
from storm import TRAIN as STORM_TRAIN
from test_restart import curve, nothing_left

from clusterctl.dashboard.state import Board
from clusterctl.launch.backends.rankstarter import ALIVE_S

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def steps(args: list[str], n: int) -> list[str]:
    return [*args[:args.index("--steps")], "--steps", str(n), *args[args.index("--steps") + 2:]]


TRAIN = steps(STORM_TRAIN, 240)
# long enough to train on through the 60 s cut, a restart and the attach after it, on any machine: every step lasts
# at least 0.5 s (the trainer's test aid, sleeping the rest: docs/trainer.md#test-aids), so the minutes cost little
# CPU; what the steps compute is unchanged, and the runs they are compared with go unpaced
CUT_STEPS = 150
CUT_TRAIN = steps(TRAIN, CUT_STEPS)
PACED = clirun.paced(0.5)
LORA = ["--model", "models/llama", "--adapter", "lora", "--data", "data/chat", "--steps", "200", "--batch-size", "3",
        "--max-seq-length", "32", "--lr", "1e-2", "--warmup", "3", "--report-every", "1", "--eval-every", "0",
        "--ckpt-every", "50"]
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
    raise AssertionError(f"not in {limit:g}s: {what() if callable(what) else what}")


def first_step(follower, limit=240.0) -> str:
    """What `attach` (started with clirun.start) printed up to its first step line; its whole output on failure."""
    seen, deadline = [], time.monotonic() + limit
    while time.monotonic() < deadline:
        line = follower.stdout.readline()
        if not line:
            break
        seen.append(line)
        if STEP.search(line):
            return "".join(seen)
    raise AssertionError("no step through attach: " + "".join(seen)[-3000:])


def kill_this_machine(cluster, cwd) -> None:
    """Every process this machine runs for `cluster` from `cwd` killed with SIGKILL (clusterctl, its ssh and
    master connections), as when a laptop's lid closes; never a host's."""
    for pid in cluster.this_machines_processes(cwd):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until("nothing of this machine's left", lambda: not cluster.this_machines_processes(cwd), limit=10)


def final_loss(cwd, run_id) -> float:
    listed = clirun.clusterctl("runs", "--json", cwd=cwd, own_cache=True)
    row = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id][0]
    assert row["status"] == "ok", row
    return row["final_loss"]


def test_detached_runs_go_on_while_this_machine_is_killed_and_cut_off_and_end_as_attached_runs(make_cluster, tmp_path):
    """The issue's first acceptance: the bundled trainer (on A) and a LoRA fine-tune (on B), 3 hosts each, started
    with --detach; every process of this machine's for them SIGKILLed, then this machine's SSH to every host dropped
    for 60 s (the hosts still reach each other). The steps go on, as the supervising hosts see them; meanwhile a host
    of A is stopped and started, and A's supervisor restarts from the checkpoint alone. After the cut, `attach`
    shows the live run from its start to its end, and each ends with the final loss the same run, left attached on
    3 other hosts meanwhile, ends with."""
    pytest.importorskip("mlx_lm")
    if dataplane.available():
        pytest.skip(f"cutting this machine off needs {dataplane.available()}")
    made = lmfixture.make_inputs(tmp_path / "made")
    a = make_cluster(3, persistent_roots=True, own_route=True)
    requires_private_roots(a, "a host stopped and started keeps its checkpoints")
    b = make_cluster(3, own_route=True)
    clusters = {"a": a, "b": b}
    calm_hosts = {"a": make_cluster(3), "b": make_cluster(3)}      # the same runs left attached, meanwhile
    away = {name: tmp_path / name for name in ("a", "b", "calm-a", "calm-b")}
    for d in away.values():
        d.mkdir()
    for project in ("b", "calm-b"):
        shutil.copytree(made["llama"], away[project] / "models" / "llama")
        shutil.copytree(made["chat"], away[project] / "data" / "chat")
    program = {"b": ["--backend", "ring", "--", *LORA],
               # h3 is started again once the restart line is read from h1 (over SSH, every 0.5 s): the restart waits
               # 10 s for it (with 1 s, a loaded machine's test started h3 after the restart had met its refusal)
               "a": ["--backend", "ring", "--max-restarts", "1", "--restart-delay", "10", "--", *CUT_TRAIN]}
    # B first: its staging (the model to each host's store) takes longest
    runs = {name: ["--hosts", str(clusters[name].inventory), *PACED, *program[name]] for name in ("b", "a")}
    ids, took = {}, {}
    for name, args in runs.items():
        began = time.monotonic()
        detached = clirun.clusterctl("run", "--detach", *args, cwd=away[name], own_cache=True, timeout=180)
        took[name] = time.monotonic() - began
        assert detached.returncode == 0, detached.stderr[-3000:]
        ids[name] = detached.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", ids[name])
        assert f"run {ids[name]}: detached; its supervisor runs on h1" in detached.stderr
        assert f"clusterctl attach {ids[name]}" in detached.stderr
    print("detach returned in", {k: round(v, 1) for k, v in took.items()}, "s")
    assert max(took.values()) < 60, took
    for name in ids:        # an attach of each, then everything of this machine's for the run killed with SIGKILL
        follower = clirun.start("attach", ids[name], cwd=away[name], own_cache=True)
        first_step(follower)
        kill_this_machine(clusters[name], away[name])
        assert follower.wait(10) == -signal.SIGKILL
    with a.cut_this_machine(), b.cut_this_machine():
        cut = time.monotonic()
        calm = {name: clirun.start("run", "--hosts", str(calm_hosts[name].inventory), "--plain", *program[name],
                                   cwd=away[f"calm-{name}"], own_cache=True) for name in program}
        seen = {name: last_step(supervisor_log(clusters[name], 1, ids[name])) for name in ids}
        # this machine reaches no host: runs says so, and the runs go on
        blind = clirun.clusterctl("runs", "--connect-timeout", "3", cwd=away["a"], own_cache=True, timeout=60)
        assert re.search(rf"{ids['a']} .* unknown \(detached, on h1\): unreachable", blind.stdout), blind.stdout
        # A host of A lost: its supervisor restarts from the checkpoint, this machine doing nothing (it cannot)
        wait_until("a checkpoint", lambda: re.search(r"step \d+ \| checkpoint ", supervisor_log(a, 1, ids["a"])))
        a.stop_host(3)
        wait_until("the restart line", lambda: "restart 1 of 1" in supervisor_log(a, 1, ids["a"]))
        a.start_host(3)
        for name in ids:
            wait_until(lambda n=name: f"{n}'s steps on h1 past {seen[n] + 10}; its supervisor's log ends: "
                                      + supervisor_log(clusters[n], 1, ids[n])[-3000:],
                       lambda n=name: last_step(supervisor_log(clusters[n], 1, ids[n])) > seen[n] + 10, limit=120)
        time.sleep(max(0.0, 60 - (time.monotonic() - cut)))
    running = {}
    for name in ids:        # still running after the cut (A surely): the attach below shows it live
        folder = f"{clusters[name].workdir}/.clusterctl/detached/{ids[name]}"
        running[name] = clusters[name].ssh(1, f"test ! -e {folder}/exit.json").returncode == 0
        assert last_step(supervisor_log(clusters[name], 1, ids[name])) > seen[name] + 10
    print("running after the cut:", running)
    assert running["a"], "A ended during the cut: make its run longer"

    attached = {}
    for name in ("a", "b"):         # A first: it surely runs on
        attached[name] = clirun.clusterctl("attach", ids[name], cwd=away[name], own_cache=True, timeout=600)
        out = attached[name]
        assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
        assert f"attach: run {ids[name]} came home from h1" in out.stderr
    assert "rank 2 on h3" in attached["a"].stdout and "restart 1 of 1" in attached["a"].stdout   # printed unwatched
    for name in ids:
        home = away[name] / "runs" / ids[name]
        assert json.loads((home / "summary.json").read_text())["exit_code"] == 0
        assert not (home / "handoff.json").exists()        # the inventory's env values stay nowhere
        nothing_left(clusters[name], ids[name], [1, 2, 3])
    assert (away["b"] / "runs" / ids["b"] / "adapters").is_dir()

    # the same runs, left attached on 3 other hosts meanwhile, end with the same loss (A's resume is exact)
    assert max(curve(away["a"] / "runs" / ids["a"])) == CUT_STEPS
    for name, proc in calm.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
        calm_id = clirun.TOKEN.search(out).group(1)
        assert final_loss(away[f"calm-{name}"], calm_id) == final_loss(away[name], ids[name]), name


def test_a_detached_stall_is_caught_its_stacks_seen_from_here_ctrl_c_leaves_it_kill_stops_it_and_export_works(
        make_cluster, tmp_path):
    cluster = make_cluster(2)
    detached = clirun.clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--detach",
                                 "--stall-timeout", "8", "--max-restarts", "1", "--restart-delay", "1",
                                 "--", *steps(TRAIN, 100000), cwd=tmp_path, own_cache=True, timeout=120)
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
    # its step and loss as its live panel has them on h1 (the supervisor writes the panel's snapshot every second)
    assert re.search(rf"{run_id} .* h1,h2 .* running \(detached, on h1\): step \d+/100000 +\d+\.\d{{4}}$",
                     listed.stdout, re.MULTILINE), listed.stdout
    # the dashboard: its row as `runs` says it, and its ranks' curves, both asked of h1 while a page is open
    board = Board(str(tmp_path / "runs"), interval=0.5)
    board.watch()
    try:
        rows = lambda: [r for r in board.overview()["runs"] if r["run_id"] == run_id]     # noqa: E731
        shown = re.compile(r"running \(detached, on h1\): step \d+/100000")
        row = wait_until(lambda: f"the dashboard's row: {rows()}",
                         lambda: next((r for r in rows() if shown.fullmatch(r["outcome"])), None), limit=60)
        assert row["supervisor"] == "h1" and row["status"] == "running", row
        ranks = wait_until("its curves", lambda: [r for r in board.run(run_id)["ranks"] if r["curve"]], limit=60)
        assert {r["rank"] for r in ranks} == {0, 1} and all(r["step"] >= 1 and r["loss"] for r in ranks), ranks
    finally:
        board.unwatch()
        board.close()
    # its ranks' logs and stacks, from here, while it runs under its supervisor
    logs = clirun.clusterctl("logs", "latest", "--rank", "0", "--grep", "step", cwd=tmp_path, own_cache=True)
    # the last lines it has, a step's report last or just before its checkpoint's line ("step 200 | checkpoint ...")
    assert logs.returncode == 0 and any(STEP.search("] " + line) for line in logs.stdout.splitlines()[-2:]), (
        logs.stdout[-2000:])
    live = clirun.clusterctl("stacks", "latest", cwd=tmp_path, own_cache=True, timeout=120)
    assert live.returncode == 0, live.stdout + live.stderr
    assert f"stacks of 2 rank(s) of run {run_id} in " in live.stdout, live.stdout

    # a rank made to stall: the supervisor's watchdog catches it, saves the stacks and restarts; seen from here
    frozen = rank_pid(run_id, 1)
    os.kill(frozen, signal.SIGSTOP)
    try:
        wait_until("the stall's restart", lambda: "restart 1 of 1" in supervisor_log(cluster, 1, run_id), limit=90)
    finally:
        try:
            os.kill(frozen, signal.SIGCONT)
        except ProcessLookupError:
            pass
    saved = clirun.clusterctl("stacks", "latest", "--saved", cwd=tmp_path, own_cache=True, timeout=120)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert re.search(rf"stacks of \d rank\(s\) of run {run_id} in .*/stacks/[0-9-]+ \(saved ", saved.stdout), saved.stdout
    assert "rank 1" in saved.stdout and (tmp_path / "runs" / run_id / "stacks").is_dir()
    step = last_step(supervisor_log(cluster, 1, run_id))
    wait_until("steps after the restart", lambda: last_step(supervisor_log(cluster, 1, run_id)) > step + 5)

    killed = clirun.clusterctl("kill", run_id, cwd=tmp_path, own_cache=True, timeout=180)
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert f"kill: run {run_id} stopped by its supervisor on h1; its run directory came home" in killed.stderr
    log = (tmp_path / "runs" / run_id / "supervisor.log").read_text()
    assert re.search(r"stopped at step \d+/100000 by SIGTERM, its checkpoint written", log), log[-3000:]
    listed = clirun.clusterctl("runs", "--json", cwd=tmp_path, own_cache=True)
    row = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id][0]
    assert row["status"] == "stopped" and row["restarts"] == 1, row
    exported = clirun.clusterctl("export", "latest", "-o", str(tmp_path / "model"), cwd=tmp_path, own_cache=True,
                                 timeout=120)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert (tmp_path / "model").is_dir() and os.listdir(tmp_path / "model")
    nothing_left(cluster, run_id, [1, 2])


def test_the_supervising_host_lost_stops_every_rank_and_runs_says_why(make_cluster, tmp_path):
    cluster = make_cluster(3, persistent_roots=True)
    requires_private_roots(cluster, "the supervising host comes back with its disk")
    detached = clirun.clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--detach",
                                 "--", *steps(TRAIN, 100000), cwd=tmp_path, own_cache=True, timeout=120)
    assert detached.returncode == 0, detached.stderr[-3000:]
    run_id = detached.stdout.strip().splitlines()[-1]
    wait_until("steps on h1", lambda: last_step(supervisor_log(cluster, 1, run_id)) > 5, limit=180)
    # the supervising host's power cut: every process of h1 frozen, none of its connections closed; the ranks on
    # h2 and h3 stop once the rank starter's pulses stop (ALIVE_S: its watchdog there counts the silence)
    frozen = set(cluster.sleep_host(1))
    lost = time.monotonic()

    def elsewhere() -> list[int]:
        found = subprocess.run(["pgrep", "-f", f"clusterctl-run-{run_id}"], capture_output=True, text=True).stdout
        return [int(pid) for pid in found.split() if int(pid) not in frozen]

    def left() -> str:
        return "every rank on h2 and h3 gone; left:\n" + subprocess.run(
            ["ps", "-o", "pid,ppid,stat,etime,args", "-p", ",".join(map(str, elsewhere())) or "0"],
            capture_output=True, text=True).stdout[:4000]

    assert elsewhere(), "no rank of the run on h2 or h3 to begin with"

    wait_until(left, lambda: not elsewhere(), limit=ALIVE_S + 30)
    assert time.monotonic() - lost < ALIVE_S + 10, time.monotonic() - lost
    cluster.stop_host(1)          # and it does not come back as it was: its supervisor, its ranks, its sshd gone
    away = clirun.clusterctl("runs", cwd=tmp_path, own_cache=True)
    assert re.search(rf"{run_id} .* unknown \(detached, on h1\): unreachable", away.stdout), away.stdout
    cluster.start_host(1)
    back = clirun.clusterctl("runs", "--json", cwd=tmp_path, own_cache=True)
    row = [r for r in json.loads(back.stdout) if r["run_id"] == run_id][0]
    pid = json.loads((tmp_path / "runs" / run_id / "detached.json").read_text())["pid"]
    assert row["status"] == "failed" and "its supervisor on h1 was lost" in row["reason"], (row, subprocess.run(
        ["ps", "-o", "pid,ppid,stat,etime,args", "-p", str(pid)], capture_output=True, text=True).stdout[:2000])
    assert "--resume latest" in row["reason"]
    nothing_left(cluster, run_id, [1, 2, 3])
