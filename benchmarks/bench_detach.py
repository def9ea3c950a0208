"""What detaching costs a run: tokens/s of the bundled trainer run detached (run --detach, its supervisor on the
first host) over the same run left attached (its supervisor here), and how soon `run --detach` returns (issue 54).

    .venv/bin/python benchmarks/bench_detach.py [--repeat 2] [--steps 300]

On 3 loopback sshd hosts (tests/sshcluster.py), the bundled trainer (2 layers, dim 64, block 64, batch 8, no
evaluation, a checkpoint every 100 steps) runs --repeat times each way, interleaved (attached, detached,
attached, ...), each with the same seed and world. A detached run is followed to its end with `clusterctl attach`
(which brings its run directory home); its supervisor is `clusterctl run` on h1, beside h1's rank (the hosts'
python is this one's, which has what the supervisor imports). Per run: the
median of the ranks' tokens/s over the steps after the first 20 (metrics.jsonl), and for a detached one the
seconds `run --detach` took to return. The figure: median detached tokens/s / median attached tokens/s (issue 54's
target: at least 0.98), and whether both ways end with the same final loss. Writes benchmarks/results/detach.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

import clirun  # noqa: E402
from record import write_record  # noqa: E402
from sshcluster import SSHCluster  # noqa: E402

SKIP_STEPS = 20


def trainer(steps: int) -> list[str]:
    return ["--n-layers", "2", "--dim", "64", "--n-heads", "2", "--mlp-dim", "128", "--block-size", "64",
            "--batch-size", "8", "--warmup", "5", "--steps", str(steps), "--report-every", "1", "--eval-every", "0",
            "--ckpt-every", "100", "--keep", "1", "--balance", "off"]


def measured(run_dir: str) -> dict:
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    train = [r for r in records if "loss" in r]
    speeds = [r["tokens_per_s"] for r in train if r["step"] > SKIP_STEPS and r.get("tokens_per_s")]
    return {"tokens_per_s": statistics.median(speeds), "final_loss": train[-1]["loss"], "steps": train[-1]["step"]}


def attached(inventory: str, cwd: str, args: list[str]) -> dict:
    r = clirun.clusterctl("run", "--hosts", inventory, "--backend", "ring", "--plain", "--", *args, cwd=cwd,
                          own_cache=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"bench_detach: the attached run exited {r.returncode}: {r.stderr[-2000:]}")
    run_id = clirun.TOKEN.search(r.stderr).group(1)
    return measured(os.path.join(cwd, "runs", run_id))


def detached(inventory: str, cwd: str, args: list[str]) -> dict:
    began = time.monotonic()
    r = clirun.clusterctl("run", "--hosts", inventory, "--backend", "ring", "--detach", "--", *args, cwd=cwd,
                          own_cache=True, timeout=600)
    returned = time.monotonic() - began
    if r.returncode != 0:
        raise SystemExit(f"bench_detach: run --detach exited {r.returncode}: {r.stderr[-2000:]}")
    run_id = r.stdout.strip().splitlines()[-1]
    follow = clirun.clusterctl("attach", run_id, cwd=cwd, own_cache=True, timeout=1800)
    if follow.returncode != 0:
        raise SystemExit(f"bench_detach: the detached run ended {follow.returncode}: {follow.stderr[-2000:]}")
    return {**measured(os.path.join(cwd, "runs", run_id)), "returned_s": round(returned, 2)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    opts = parser.parse_args()
    args = trainer(opts.steps)
    runs: dict[str, list[dict]] = {"attached": [], "detached": []}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = SSHCluster(os.path.join(tmp, "hosts"), 3).start()
        try:
            for i in range(opts.repeat):
                for way, how in (("attached", attached), ("detached", detached)):
                    cwd = os.path.join(tmp, f"{way}-{i}")
                    os.mkdir(cwd)
                    got = how(str(cluster.inventory), cwd, args)
                    runs[way].append(got)
                    print(f"{way} {i + 1}/{opts.repeat}: {got['tokens_per_s']:.0f} tokens/s, final loss "
                          f"{got['final_loss']:.6f}" + (f", returned in {got['returned_s']:.2f} s"
                                                        if "returned_s" in got else ""), flush=True)
        finally:
            cluster.stop_all()
        machine = subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip()
    median = {way: statistics.median(r["tokens_per_s"] for r in rs) for way, rs in runs.items()}
    ratio = median["detached"] / median["attached"]
    same = len({r["final_loss"] for rs in runs.values() for r in rs}) == 1
    print(f"tokens/s detached / attached: {ratio:.3f} (median {median['detached']:.0f} / {median['attached']:.0f}); "
          f"final loss the same every run: {same}")
    write_record("detach", hosts=3, steps=opts.steps, repeat=opts.repeat, trainer=args, kernel=machine,
                 runs=runs, median_tokens_per_s=median, ratio=round(ratio, 4), same_final_loss=same,
                 returned_s=[r["returned_s"] for r in runs["detached"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
