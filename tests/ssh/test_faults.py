"""Faults named by their cause (launch/causes.py, supervise.py's first cause): a host's disk fills while the bundled
trainer runs on 2 test hosts; h2's root, its workdir in it, is a small filesystem of its own (a 24 MB tmpfs this
machine mounts and fills, bound over h2's root in its private mount namespace only)."""
import json
import re
from functools import partial

import clirun
import dataplane
import pytest
from sshcluster import requires_private_roots

pytestmark = pytest.mark.ssh

CHECKPOINT = re.compile(r"\] step (\d+) \| checkpoint ")
# a report each step, a checkpoint each 100: what the test does between a report and the next checkpoint has
# 100 steps of time (paced below)
TRAIN = ["--n-layers", "2", "--dim", "32", "--n-heads", "2", "--mlp-dim", "64", "--block-size", "32",
         "--batch-size", "4", "--steps", "400", "--report-every", "1", "--eval-every", "0", "--ckpt-every", "100",
         "--keep", "2", "--balance", "off"]
clusterctl = partial(clirun.clusterctl, timeout=300, own_cache=True)


def test_a_full_disk_on_h2_is_named_once_not_restarted_leaves_nothing_and_resume_takes_it_up(make_cluster, tmp_path,
                                                                                            small_disk):
    cluster = make_cluster(2)
    requires_private_roots(cluster, "h2's workdir on a filesystem of its own")
    project = tmp_path / "project"       # the project run copies: the small disk stays out of it
    project.mkdir()
    cluster.mount_over(2, str(cluster.host_root), str(small_disk.path))      # h2's whole root, its workdir in it
    # each step at least 0.05 s (the trainer's test aid; nothing it computes changes): the 100 steps between a report and
    # the next checkpoint last 5 s however fast the ranks are, and a loaded machine's test reads the lines in time
    job = clirun.start("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--max-restarts", "2",
                       "--restart-delay", "1", *clirun.paced(0.05), "--", *TRAIN, cwd=project, own_cache=True)
    lines = []
    try:
        # the first checkpoint is written on both hosts, then h2's disk fills; named, it is freed and the run
        # goes on; it fills again, for good
        fills = 0
        for line in job.stdout:
            lines.append(line)
            if (CHECKPOINT.search(line) and fills == 0) or ("checkpoint: room again" in line and fills == 1):
                small_disk.fill()
                fills += 1
            elif "warning: no space left on device for the next checkpoint" in line and fills == 1:
                small_disk.free()
            if fills == 2:
                break
        out, _ = job.communicate(timeout=240)
    finally:
        job.kill()
    text = "".join(lines) + out
    assert job.returncode == 1, text[-3000:]
    [failed] = [line for line in text.splitlines() if line.startswith("run ") and " failed: " in line]
    # h2, the path there and the cause, in the one line; rank 0's lost connection follows from it; no restart
    assert "failed: rank 1 on h2 exited 1: error: " in failed and "no space left on device" in failed, failed
    assert f"{cluster.workdir}/runs/" in failed, failed
    assert "followed from it: rank 0 on h1 (RuntimeError: [ring] connection to a peer was lost)" in failed, failed
    assert failed.endswith("; not restarted: a restart would meet the same disk full"), failed
    assert "restart 1 of 2" not in text
    # named as it filled, at a report before a checkpoint; freed, the run went on
    assert fills == 2 and "[rank 1 h2] checkpoint: room again in " in text, text[-3000:]
    assert re.search(r"\[rank 1 h2\] warning: no space left on device for the next checkpoint in "
                     rf"{re.escape(cluster.workdir)}/runs/\S+/checkpoints: 0\.\d MiB free", text), text[-3000:]
    run_id = clirun.TOKEN.search(text).group(1)
    for i in (1, 2):                       # no temporary checkpoint directory on either host
        left = cluster.ssh(i, f"ls -a {cluster.workdir}/runs/{run_id}/checkpoints")
        assert left.returncode == 0 and not [n for n in left.stdout.split() if ".tmp-" in n], left.stdout
        assert "latest" in left.stdout.split()      # the checkpoint before it is still the newest
    summary = json.loads((project / "runs" / run_id / "summary.json").read_text())
    assert summary["exit_code"] == 1 and summary["reason"] == failed.split(" failed: ", 1)[1]

    small_disk.free()       # space freed: --resume latest continues the run from its checkpoint
    again = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--",
                       *TRAIN, "--resume", "latest", cwd=project)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert re.search(r"resumed from \S+/checkpoints/step-000[1-3]00", again.stdout), again.stdout[:3000]
    assert "step 400/400" in again.stdout

    # less free space on h2 than the run's checkpoints need: refused as the ranks start, naming h2, not restarted
    small_disk.fill(leave=2**19)      # 0.5 MiB left: 3 checkpoints of this model need more
    short = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--max-restarts", "1",
                       "--restart-delay", "1", "--", *TRAIN, cwd=project)
    assert short.returncode == 1, short.stdout[-2000:] + short.stderr[-2000:]
    failed = next((line for line in short.stderr.splitlines() if " failed: " in line), short.stderr[-3000:])
    assert re.search(r"failed: rank 1 on h2 exited 1: error: not enough free space for this run's checkpoints in "
                     rf"{re.escape(cluster.workdir)}/runs/\S+/checkpoints: [\d.]+ MiB free, they need about", failed), failed
    assert failed.endswith("; not restarted: a restart would meet the same disk full"), failed
    assert "step 1/" not in short.stdout                    # refused before training



def test_the_data_plane_dropped_between_the_hosts_is_a_stall_that_names_it(make_cluster, tmp_path):
    """SSH stays up (the ranks' heartbeats go on), their ring connections drop: every rank waits in its step's
    collective; the stall line says they wait for each other, points to the data plane, exit 125 as any stall."""
    why = dataplane.available()
    if why:
        pytest.skip(f"the data plane cannot be dropped here: {why}")
    cluster = make_cluster(2)
    project = tmp_path / "project"
    project.mkdir()
    job = clirun.start("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--stall-timeout", "8",
                       # no checkpoint while the link is down: one announces a quiet phase that the verdict waits out
                       "--", *TRAIN, "--steps", "100000", "--ckpt-every", "0", cwd=project, own_cache=True)
    lines, drop = [], None
    try:
        for line in job.stdout:
            lines.append(line)
            if re.search(r"\] step +20/", line):      # between checkpoints (--ckpt-every 0 below)
                run_id = clirun.TOKEN.search("".join(lines)).group(1)
                ranks = project / "runs" / run_id / "ranks.json"
                ranks = ranks if ranks.exists() else next((project / "runs" / run_id).glob("attempt-*/ranks.json"))
                drop = dataplane.DataPlaneDrop(dataplane.endpoints(str(ranks))).__enter__()
                break
        out, _ = job.communicate(timeout=120)
    finally:
        job.kill()
        if drop is not None:
            drop.__exit__(None, None, None)
    text = "".join(lines) + out
    assert drop is not None, text[-3000:]
    assert job.returncode == 125, text[-3000:]
    failed = next(line for line in text.splitlines() if " failed: " in line)
    assert "failed: stalled: no progress from any rank for " in failed, failed
    assert re.search(r"every rank waits (?:at the same place|in one of \d+ collectives) \(.+\): in a collective, for each other, which usually means "
                     r"the link between the hosts \(the data plane\): check it with `clusterctl doctor --data-plane`; "
                     r"the hosts' last heartbeats: h1 \ds ago, h2 \ds ago", failed), failed
