"""What the stall watchdog costs a healthy job, and how soon it explains a stalled one.

    .venv/bin/python benchmarks/bench_stall.py [--repeat 5] [--steps 300] [--stall-timeout 10]

1. Throughput: the bundled trainer (bench_starter's model) on 2 ranks of this machine over ring, `clusterctl
   run --plain` with the watchdog as it is by default (adaptive; the trainer prints its step on every rank at
   most once a second) and with `--stall-timeout 0` (off), interleaved --repeat times. tokens/s: rank 0's
   reports after the first, from metrics.jsonl, median; the ratio's spread is over the side-by-side pairs.
2. Diagnosis: a 2-rank program in which rank 1 sleeps instead of joining the 5th all_sum, under
   `--stall-timeout S`, --repeat times. From the last progress line `run` printed to the diagnosis (the
   `stalled:` line, after every rank's stacks were taken) and to `run`'s exit; what goes beyond S is the
   watchdog's own delay (its 0.2 s poll, taking the stacks, stopping the ranks).
3. `clusterctl stacks latest` against the healthy trainer: the command's wall time, --repeat times.
Writes benchmarks/results/stall.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from bench_starter import FLAGS
from record import write_record

STALL = """
import time
import mlx.core as mx

group = mx.distributed.init()
for i in range(1, 100):
    if i == 5 and group.rank() == 1:
        time.sleep(3600)
    x = mx.distributed.all_sum(mx.ones(4), group=group)
    mx.eval(x)
    print(f"iteration {i}", flush=True)
    time.sleep(0.2)
"""


def clusterctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "clusterctl", *args]


def trainer(steps: int, watchdog: bool) -> float:
    with tempfile.TemporaryDirectory() as cwd:
        flags = [] if watchdog else ["--stall-timeout", "0"]
        subprocess.run(clusterctl("run", "--plain", *flags, "--", *FLAGS, "--steps", str(steps)), cwd=cwd,
                       check=True, capture_output=True, timeout=600)
        [metrics] = glob.glob(os.path.join(cwd, "runs", "*", "metrics.jsonl"))
        rates = [m["tokens_per_s"] for m in map(json.loads, open(metrics)) if "tokens_per_s" in m][1:]
        return statistics.median(rates)


def diagnosis(timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        with open(os.path.join(cwd, "stall.py"), "w") as f:
            f.write(STALL)
        job = subprocess.Popen(clusterctl("run", "--plain", "--stall-timeout", f"{timeout:g}", "stall.py"), cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last, said, seen = None, None, []
        for line in job.stdout:
            now = time.monotonic()
            seen.append(line)
            if "] iteration " in line:
                last = now
            elif line.startswith("stalled:") and said is None:
                said = now
        job.wait()
        ended = time.monotonic()
        if job.returncode != 125 or last is None or said is None:
            raise SystemExit(f"the stall was not diagnosed (exit {job.returncode}):\n{''.join(seen)[-3000:]}")
        return {"to_diagnosis_s": said - last, "to_exit_s": ended - last, "beyond_timeout_s": said - last - timeout}


def stacks_calls(repeat: int, steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as cwd:
        job = subprocess.Popen(clusterctl("run", "--plain", "--", *FLAGS, "--steps", str(steps * 4)), cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for line in job.stdout:
                if re.search(r"\] step +20/", line):
                    break
            else:
                raise SystemExit("the trainer ended before its 20th step")
            times = []
            for _ in range(repeat):
                start = time.monotonic()
                subprocess.run(clusterctl("stacks", "latest"), cwd=cwd, check=True, capture_output=True, timeout=60)
                times.append(time.monotonic() - start)
            return times
        finally:
            job.kill()
            subprocess.run(clusterctl("kill", "latest"), cwd=cwd, capture_output=True, timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--stall-timeout", type=float, default=10.0)
    args = parser.parse_args()
    rates = {"on": [], "off": []}
    for i in range(args.repeat):
        for name in ("on", "off") if i % 2 == 0 else ("off", "on"):
            rates[name].append(trainer(args.steps, watchdog=name == "on"))
        print(f"trainer, round {i + 1}: watchdog on {rates['on'][-1]:,.0f} tok/s, off {rates['off'][-1]:,.0f} tok/s",
              flush=True)
    pairs = [a / b for a, b in zip(rates["on"], rates["off"])]
    stalls = []
    for i in range(args.repeat):
        stalls.append(diagnosis(args.stall_timeout))
        print(f"stall, round {i + 1}: diagnosed {stalls[-1]['to_diagnosis_s']:.2f} s after the last progress, "
              f"exit after {stalls[-1]['to_exit_s']:.2f} s", flush=True)
    stacks = stacks_calls(args.repeat, args.steps)
    results = {
        "tokens_per_s": {"on": statistics.median(rates["on"]), "off": statistics.median(rates["off"]),
                         "runs": rates},
        "ratio": {"median": statistics.median(rates["on"]) / statistics.median(rates["off"]),
                  "pairs_min": min(pairs), "pairs_max": max(pairs)},
        "stall": {"timeout_s": args.stall_timeout, **{k: statistics.median(s[k] for s in stalls) for k in stalls[0]},
                  "runs": stalls},
        "stacks_s": {"median": statistics.median(stacks), "max": max(stacks), "runs": stacks},
    }
    q, s = results["ratio"], results["stall"]
    print(f"tokens/s watchdog on / off: {q['median']:.3f} (pairs {q['pairs_min']:.3f}..{q['pairs_max']:.3f})")
    print(f"stall under --stall-timeout {args.stall_timeout:g}: diagnosed {s['to_diagnosis_s']:.2f} s after the last "
          f"progress ({s['beyond_timeout_s']:.2f} s beyond the timeout), exit after {s['to_exit_s']:.2f} s")
    print(f"clusterctl stacks latest: {results['stacks_s']['median']:.2f} s (max {results['stacks_s']['max']:.2f} s)")
    write_record("stall", steps=args.steps, flags=FLAGS, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
