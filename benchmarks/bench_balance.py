"""Mixed Macs: what balanced data parallelism gains when one rank is slower, and what check-sync costs.

    .venv/bin/python benchmarks/bench_balance.py [--repeat 2] [--steps 150]

Two loopback sshd hosts (tests/sshcluster.py), the second slowed 2x by the trainer's test aid
(CLUSTERCTL_TRAIN_SLOWDOWN=2 in its inventory `env`: it sleeps as long again as it computed, each step). The
bundled trainer over ring, `clusterctl run --plain`, interleaved --repeat times: `--balance off` (even shares),
`--balance auto` (the default), the best split 16 rows a step allow for a 2:1 speed ratio given as fixed weights
(`--balance 11,5`: what auto should reach, issue 43) and auto with `--check-sync 10` (the default is every 100
steps: ten times as many checks). 16 rows a step (--batch-size 8 on 2 ranks) of 256 tokens each (--block-size
256), so that a step's computation, which grows with the tokens, outweighs its fixed costs, which grow with the
parameters (the all_sum of the gradients, the optimizer, Python), as on a Mac training a real model. tokens/s: the global rate rank 0 reports (metrics.jsonl), median of its reports over
the run's second half (auto moves the shares after a few steps); final loss: the last report's, at the same global
batch and steps. Writes benchmarks/results/balance.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_starter import FLAGS  # noqa: E402
from record import run_trainer, write_record  # noqa: E402

from clusterctl.inventory_edit import set_host_setting  # noqa: E402

VARIANTS = {"off": ["--balance", "off"], "auto": ["--balance", "auto"], "best split": ["--balance", "11,5"],
            "auto, check-sync 10": ["--balance", "auto", "--check-sync", "10"]}
# bench_starter's model, 16 rows a step (--batch-size 8 on 2 ranks: the issue's case, where rounding the speeds'
# proportions gave 10:6 and the best split is 11:5), rows of 256 tokens so a step's computation outweighs its fixed costs
MODEL = [*FLAGS, "--block-size", "256", "--batch-size", "8"]


def one(inventory: str, steps: int, extra: list[str]) -> dict:
    wall, records, summary = run_trainer(inventory, "ring", [*MODEL, "--steps", str(steps), *extra])
    reports = [x for x in records if "tokens_per_s" in x]
    steady = [x["tokens_per_s"] for x in reports if x["step"] > steps // 2] or [x["tokens_per_s"] for x in reports]
    return {"wall_s": wall, "tokens_per_s": statistics.median(steady),
            "final_loss": reports[-1]["loss"], "shares": reports[-1].get("shares"),
            "trainer": summary.get("trainer")}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    from sshcluster import SSHCluster
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-balance-") as tmp:
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 2).start()
        try:
            text = set_host_setting(cluster.inventory.read_text(), "h2", "env", '{CLUSTERCTL_TRAIN_SLOWDOWN: "2"}')
            cluster.inventory.write_text(text)
            inventory = str(cluster.inventory)
            one(inventory, 10, ["--balance", "off"])                 # warm: the plan cache, the SSH masters
            for i in range(args.repeat):
                for name, extra in VARIANTS.items():
                    runs[name].append(one(inventory, args.steps, extra))
                print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]['tokens_per_s']:,.0f} tok/s" for k, v in runs.items()),
                      flush=True)
        finally:
            cluster.stop_all()
    med = {name: {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                  "wall_s": statistics.median(r["wall_s"] for r in rs),
                  "final_loss": statistics.median(r["final_loss"] for r in rs),
                  "shares": rs[-1]["shares"]} for name, rs in runs.items()}
    pairs = [a["tokens_per_s"] / o["tokens_per_s"] for a, o in zip(runs["auto"], runs["off"])]
    best = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["auto"], runs["best split"])]
    sync = [c["tokens_per_s"] / a["tokens_per_s"] for c, a in zip(runs["auto, check-sync 10"], runs["auto"])]
    record = {"steps": args.steps, "flags": MODEL, "slowdown": {"h2": 2}, "runs": runs, "median": med,
              "auto_over_off": {"median": statistics.median(pairs), "pairs_min": min(pairs), "pairs_max": max(pairs)},
              "auto_over_best": {"median": statistics.median(best), "pairs_min": min(best), "pairs_max": max(best)},
              "loss_auto_vs_off": med["auto"]["final_loss"] / med["off"]["final_loss"] - 1,
              "check_sync_10_over_100": {"median": statistics.median(sync), "pairs_min": min(sync), "pairs_max": max(sync)}}
    for name, m in med.items():
        print(f"{name}: {m['tokens_per_s']:,.0f} tok/s, wall {m['wall_s']:.1f} s, final loss {m['final_loss']:.4f}, "
              f"shares {m['shares']}")
    print(f"auto / best split 11:5: {record['auto_over_best']['median']:.3f} (pairs {min(best):.3f}..{max(best):.3f})")
    print(f"auto / off: {record['auto_over_off']['median']:.2f} (pairs {min(pairs):.2f}..{max(pairs):.2f}); final loss "
          f"{record['loss_auto_vs_off'] * 100:+.2f}%; check-sync 10 / 100: {record['check_sync_10_over_100']['median']:.3f}")
    write_record("balance", **record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
