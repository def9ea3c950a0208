"""The README's main job, timed: the one place its figures come from (README's Quickstart A and docs/trainer.md quote
benchmarks/results/main_job.json; tests/unit/test_docs.py checks that they quote this record).

    .venv/bin/python benchmarks/bench_main_job.py [--repeat 3]

The main job is a bare `clusterctl run` in an empty directory, as Quickstart A runs it after the install: the
bundled trainer on 2 ring ranks of this machine at the preset it picks for this device (`tiny` on a CPU, 400
steps). Each repeat: wall time from the command to its exit (what a user waits at the prompt, Python's start
included), the first step's loss, the last step's and the final held-out loss, from the run's metrics.jsonl.
Absolute times are this machine's (2 cores here; `uptime`'s load is recorded beside them, since a shared machine's
other work stretches them).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from record import write_record  # noqa: E402


def one() -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        load = os.getloadavg()[0]
        began = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "clusterctl", "run"], cwd=cwd, capture_output=True, text=True,
                           timeout=1800, stdin=subprocess.DEVNULL)
        wall = time.monotonic() - began
        if r.returncode != 0:
            raise SystemExit(f"clusterctl run failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        [path] = glob.glob(os.path.join(cwd, "runs", "*", "metrics.jsonl"))
        records = [json.loads(line) for line in open(path) if line.strip()]
    losses = [m for m in records if "loss" in m]
    held_out = [m["val_loss"] for m in records if "val_loss" in m]
    return {"wall_s": round(wall, 2), "load_before": round(load, 2), "steps": losses[-1]["step"],
            "first_loss": round(losses[0]["loss"], 2), "last_loss": round(losses[-1]["loss"], 2),
            "held_out": round(held_out[-1], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for i in range(args.repeat):
        runs.append(one())
        print(f"  run {i + 1}/{args.repeat}: {runs[-1]}", flush=True)
    walls = [r["wall_s"] for r in runs]
    summary = {"wall_s": {"min": min(walls), "median": statistics.median(walls), "max": max(walls)},
               "steps": runs[-1]["steps"], "first_loss": runs[-1]["first_loss"], "last_loss": runs[-1]["last_loss"],
               "held_out": runs[-1]["held_out"]}
    print(f"main job: {summary['wall_s']['min']:.0f}-{summary['wall_s']['max']:.0f} s wall (median "
          f"{summary['wall_s']['median']:.0f} s), loss {summary['first_loss']} -> {summary['last_loss']} at step "
          f"{summary['steps']}, held-out {summary['held_out']}")
    write_record("main_job", cores=os.cpu_count(), repeat=args.repeat, summary=summary, runs=runs)


if __name__ == "__main__":
    main()
