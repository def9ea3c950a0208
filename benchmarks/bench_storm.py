"""A storm of faults through one training run: how soon each is named, how soon the run trains again, and whether
the model it ends with is the one an undisturbed run makes (issue 53).

    .venv/bin/python benchmarks/bench_storm.py

tests/storm.py's storm, as tests/ssh/test_storm.py runs it but longer: the bundled trainer (2 layers, dim 32, 400
steps where the test's run has 200, a checkpoint every 10) on 3 loopback sshd hosts (tests/sshcluster.py, persistent
roots; h3's root on a 24 MB tmpfs of its own) under `clusterctl run --max-restarts 6 --restart-delay 2
--stall-timeout 8`, while, one after another, each past a checkpoint:
  1. rank 1 (h2) is killed with SIGKILL;
  2. h2 is stopped (its sshd and every session under it) and started again once `run` names it;
  3. the data plane between h1 and h2 (their ranks' ring ports) drops every packet for 60 s (tests/dataplane.py);
  4. rank 2 (h3) is frozen with SIGSTOP (past the 8 s stall timeout);
  5. h1's sshd is restarted (the listener only: the ranks' sessions go on);
  6. h3's disk is filled, then freed when the rank warns that the next checkpoint would not fit.
The same run goes undisturbed on 3 other hosts at the same time. Per fault: detection (from the injection to the
line of `run` that names it: the restart line, or the rank's warning) and recovery (to the first step the run
trains after it; for the disk, to the rank's "room again"), in seconds on this machine. Then the two runs' final
training loss and held-out loss (equal to the last digit when resume is exact). Writes benchmarks/results/storm.json.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

import clirun  # noqa: E402
import dataplane  # noqa: E402
from record import write_record  # noqa: E402
from smalldisk import SmallDisk  # noqa: E402
from sshcluster import SSHCluster  # noqa: E402
from storm import STEPS, TRAIN, Storm, beside  # noqa: E402


def final(run_dir: str) -> dict:
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    train = [r for r in records if "loss" in r]
    held = [r for r in records if "val_loss" in r]
    return {"step": train[-1]["step"], "loss": train[-1]["loss"], "held_out_loss": held[-1]["val_loss"] if held else None}


def main() -> int:
    why = dataplane.available()
    if why:
        raise SystemExit(f"bench_storm: the data plane cannot be dropped here: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        storm_cluster = SSHCluster(os.path.join(tmp, "storm-hosts"), 3, persistent_roots=True).start()
        calm_cluster = SSHCluster(os.path.join(tmp, "calm-hosts"), 3).start()
        disk = SmallDisk(os.path.join(tmp, "h3disk"), "24m")
        try:
            with disk as mounted:
                if mounted is None:
                    raise SystemExit(f"bench_storm: {disk.why}")
                storm_cluster.mount_over(3, str(storm_cluster.host_root), str(mounted.path))
                for name in ("storm", "calm"):
                    os.mkdir(os.path.join(tmp, name))
                calm = clirun.start("run", "--hosts", str(calm_cluster.inventory), "--backend", "ring", "--plain",
                                    "--", *TRAIN, cwd=os.path.join(tmp, "calm"), own_cache=True)
                storm = Storm(storm_cluster, os.path.join(tmp, "storm"), mounted)
                began = time.monotonic()
                code, calm_out = beside(storm, calm, limit=600)
                wall = time.monotonic() - began
                if code != 0 or calm.returncode != 0:
                    raise SystemExit(f"bench_storm: the storm's run exited {code}, the undisturbed one "
                                     f"{calm.returncode}:\n{storm.tail()}")
                got = final(os.path.join(tmp, "storm", "runs", storm.run_id))
                calm_id = clirun.TOKEN.search(calm_out).group(1)
                reference = final(os.path.join(tmp, "calm", "runs", calm_id))
                with open(os.path.join(tmp, "storm", "runs", storm.run_id, "summary.json")) as f:
                    summary = json.load(f)
        finally:
            storm_cluster.stop_all()
            calm_cluster.stop_all()
    rows = [f.row(storm.began) for f in storm.faults]
    print(f"{'fault':<52} {'where':<13} {'at':>6} {'detected':>9} {'recovered':>10}")
    for r in rows:
        def s(v):
            return "-" if v is None else f"{v:.1f} s"
        print(f"{r['fault']:<52} {r['where']:<13} {r['at_s']:>5.0f}s {s(r['detection_s']):>9} {s(r['recovery_s']):>10}")
    same = got == reference
    print(f"final: storm loss {got['loss']:.6f} held-out {got['held_out_loss']}, undisturbed {reference['loss']:.6f} "
          f"held-out {reference['held_out_loss']} ({'equal' if same else 'DIFFERENT'}); {summary['restarts']} restarts; "
          f"{wall:.0f} s")
    write_record("storm", steps=STEPS, restarts=summary["restarts"], wall_s=round(wall, 1), faults=rows,
                 final={"storm": got, "undisturbed": reference, "equal": same},
                 attempts=[{k: a.get(k) for k in ("attempt", "outcome", "cause", "reason", "resumed_from",
                                                   "data_plane_wait_s")} for a in summary["attempts"]])
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
