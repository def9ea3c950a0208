"""Mixed Macs: what balanced data parallelism gains when one rank is slower, and what check-sync costs.

    .venv/bin/python benchmarks/bench_balance.py [--repeat 3] [--steps 120] [--own-cores]

Two loopback sshd hosts (tests/sshcluster.py), the second slowed 2x by the trainer's test aid
(CLUSTERCTL_TRAIN_SLOWDOWN=2 in its inventory `env`: after its forward and backward passes, the rank sleeps as long
again as they took; the gradients' all_sum, AdamW and the loop's Python are not slowed, as they do not grow with the
rows). The bundled trainer over ring, `clusterctl run --plain`, interleaved --repeat times: `--balance off` (even
shares), `--balance auto` (the default), the best split 16 rows a step allow for a 2:1 speed ratio given as fixed
weights (`--balance 11,5`: what auto should reach, issue 43) and auto with `--check-sync 10` (the default is every
100 steps: ten times as many checks). 16 rows a step (--batch-size 8 on 2 ranks) of 256 tokens each (--block-size
256, bench_starter's model otherwise), as before: what a step costs whatever its rows is small here (measured: the
gradients' all_sum and AdamW ~2 ms, the stop poll's all_max under 1 ms, the loop's Python a few ms, against ~70 ms
of forward and backward per row), so longer rows would not move the ratio; what held the best split near 1.36x the
even split (16/12 = 1.33 predicted) was the fast rank's 11 rows computed as two micro-batches of 6, one row of padding
each step (12 rows of work for 11), which the trainer no longer does (rowshares.micro_batches: 6 + 5).

--own-cores pins host k's sshd, and so everything it starts (its rank and the rank's threads), to core k of this
machine, as two machines would each have their own; by default the ranks share this machine's cores (each rank
computes on one thread; the one waiting in a collective busy-polls its ring socket). tokens/s: the global rate rank 0
reports (metrics.jsonl, every 10 steps), median of its reports over the run's second half (6 reports at 120 steps;
auto moves the shares after a few steps); final loss: the last report's, at the same global batch and steps. Writes
benchmarks/results/balance.json.
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
# proportions gave 10:6 and the best split is 11:5), rows of 256 tokens; a report every 10 steps, so that the second
# half's median is taken over 6 of them
MODEL = [*FLAGS, "--block-size", "256", "--batch-size", "8", "--report-every", "10"]


def place(cluster, own_cores: bool) -> list[set[int]]:
    """Host k's sshd and everything under it (sessions, ranks, their threads) on core k of this machine
    (own_cores), or on all of them; new sessions inherit it. Returns each host's cores."""
    from sshcluster import descendants
    cores = sorted(os.sched_getaffinity(0))
    masks = [{cores[k % len(cores)]} if own_cores else set(cores) for k in range(len(cluster.hosts))]
    for host, mask in zip(cluster.hosts, masks):
        for pid in [host.pid, *descendants(host.pid)]:
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    os.sched_setaffinity(int(tid), mask)
            except (FileNotFoundError, ProcessLookupError):
                pass                                   # gone meanwhile
    return masks


def one(inventory: str, steps: int, extra: list[str]) -> dict:
    load = os.getloadavg()[0]
    wall, records, summary = run_trainer(inventory, "ring", [*MODEL, "--steps", str(steps), *extra])
    reports = [x for x in records if "tokens_per_s" in x]
    steady = [x["tokens_per_s"] for x in reports if x["step"] > steps // 2] or [x["tokens_per_s"] for x in reports]
    return {"wall_s": wall, "tokens_per_s": statistics.median(steady), "load_before": load,
            "final_loss": reports[-1]["loss"], "shares": reports[-1].get("shares"),
            "trainer": summary.get("trainer")}


def ratio(runs: dict[str, list[dict]], top: str, bottom: str) -> dict:
    pairs = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[top], runs[bottom])]
    return {"median": statistics.median(pairs), "pairs_min": min(pairs), "pairs_max": max(pairs), "pairs": pairs}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--own-cores", action="store_true", help="host k's processes on core k of this machine")
    args = parser.parse_args()
    from sshcluster import SSHCluster
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-balance-") as tmp:
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 2).start()
        try:
            text = set_host_setting(cluster.inventory.read_text(), "h2", "env", '{CLUSTERCTL_TRAIN_SLOWDOWN: "2"}')
            cluster.inventory.write_text(text)
            inventory = str(cluster.inventory)
            cores = place(cluster, args.own_cores)
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
    record = {"steps": args.steps, "flags": MODEL, "slowdown": {"h2": 2},
              "cores": [sorted(c) for c in cores], "own_cores": args.own_cores,
              "runs": runs, "median": med,
              "auto_over_off": ratio(runs, "auto", "off"), "auto_over_best": ratio(runs, "auto", "best split"),
              "best_over_off": ratio(runs, "best split", "off"),
              "loss_auto_vs_off": med["auto"]["final_loss"] / med["off"]["final_loss"] - 1,
              "check_sync_10_over_100": ratio(runs, "auto, check-sync 10", "auto")}
    for name, m in med.items():
        print(f"{name}: {m['tokens_per_s']:,.0f} tok/s, wall {m['wall_s']:.1f} s, final loss {m['final_loss']:.4f}, "
              f"shares {m['shares']}")

    def said(key: str, r: dict, digits: int = 3) -> str:
        return f"{key} {r['median']:.{digits}f} (pairs {r['pairs_min']:.{digits}f}..{r['pairs_max']:.{digits}f})"

    print("; ".join([said("auto / off", record["auto_over_off"], 2),
                     said("auto / best split 11:5", record["auto_over_best"]),
                     said("best split / off", record["best_over_off"], 2)]))
    print(f"final loss {record['loss_auto_vs_off'] * 100:+.2f}%; "
          + said("check-sync 10 / 100", record["check_sync_10_over_100"]))
    write_record("balance", **record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
