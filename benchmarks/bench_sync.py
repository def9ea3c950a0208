"""`clusterctl sync` against four parallel `rsync -a` runs: a 2,000-file tree to 4 loopback hosts.

    .venv/bin/python benchmarks/bench_sync.py [--hosts 4] [--files 2000] [--repeat 3]

Each repeat, interleaved: a first sync into an empty directory and a no-change re-sync, by
  - `clusterctl sync TREE --hosts INV --dest b-K` (the command line, end to end),
  - `sync_tree()` in this process (the same work without starting Python and importing clusterctl),
  - N parallel `rsync -a -e 'ssh -F <the cluster's ssh_config>' TREE/ hI:WORKDIR/r-K/` (the baseline: the
    manual recipe, plain OpenSSH with the user's own config, no multiplexing).
clusterctl's own runs find a live SSH master per host (its connections are reused for 90 s: see
docs/inventory.md#how-a-hosts-ssh-settings-are-decided); the
no-change re-sync is also timed right after `clusterctl ssh-close` ("cli again, no master"), to show what
the reuse buys. Medians and ratios come from the same run. Writes benchmarks/results/sync.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from sshcluster import SSHCluster  # noqa: E402

from clusterctl.hosts.openssh import close_masters  # noqa: E402
from clusterctl.hosts.connector import Connector  # noqa: E402
from clusterctl.inventory import load  # noqa: E402
from clusterctl.transfer.sync import SyncOptions, plan_sync, sync_tree  # noqa: E402


def make_tree(root: str, files: int) -> int:
    """files small source-like files in 50 directories; returns the total size."""
    rng = random.Random(0)
    words = ["def", "return", "import", "self", "x", "model", "loss", "batch", "for", "in", "if", "else"]
    total = 0
    for i in range(files):
        d = os.path.join(root, f"pkg{i % 50:02d}", f"sub{i % 7}")
        os.makedirs(d, exist_ok=True)
        text = "\n".join(" ".join(rng.choice(words) for _ in range(10)) for _ in range(rng.randint(5, 80))) + "\n"
        with open(os.path.join(d, f"mod{i}.py"), "w") as f:
            f.write(text)
        total += len(text)
    return total


def timed(fn) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def run(argv) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed: {r.stdout[-500:]} {r.stderr[-1500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {k: [] for k in (
        "cli first", "cli again", "cli again, no master", "core first", "core again", "rsync first", "rsync again")}
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        tree = os.path.join(tmp, "tree")
        size = make_tree(tree, args.files)
        cluster = SSHCluster(os.path.join(tmp, "cluster"), args.hosts).start()
        try:
            inv = load(cluster.inventory)
            rsh = shlex.join(["ssh", "-F", str(cluster.ssh_config)])
            for h in range(1, args.hosts + 1):                          # warm-up: host keys, workdir
                assert cluster.ssh(h, f"mkdir -p {cluster.workdir}").returncode == 0
            cli = [sys.executable, "-m", "clusterctl", "sync", tree, "--hosts", str(cluster.inventory)]
            run(cli + ["--dest", "warm"])
            plan = plan_sync(tree)

            def rsync_all(dest: str) -> None:
                with ThreadPoolExecutor(args.hosts) as pool:
                    list(pool.map(run, [["rsync", "-a", "-e", rsh, tree + "/", f"{h.name}:{cluster.workdir}/{dest}/"]
                                        for h in cluster.hosts]))

            def core(dest: str) -> None:
                group = sync_tree(Connector(inv, lazy=True), plan_sync(tree), SyncOptions(dest=dest))
                assert group.all_ok, {n: o.error for n, o in group.items()}

            for k in range(args.repeat):
                times["rsync first"].append(timed(lambda: rsync_all(f"r-{k}")))
                times["cli first"].append(timed(lambda: run(cli + ["--dest", f"b-{k}"])))
                times["core first"].append(timed(lambda: core(f"c-{k}")))
                times["rsync again"].append(timed(lambda: rsync_all(f"r-{k}")))
                times["cli again"].append(timed(lambda: run(cli + ["--dest", f"b-{k}"])))
                times["core again"].append(timed(lambda: core(f"c-{k}")))
                close_masters(inv)
                times["cli again, no master"].append(timed(lambda: run(cli + ["--dest", f"b-{k}"])))
            files = len(plan.entries)
        finally:
            cluster.stop_all()
    m = {k: statistics.median(v) for k, v in times.items()}
    ratios = {"first: cli / rsync": m["cli first"] / m["rsync first"],
              "again: cli / rsync": m["cli again"] / m["rsync again"],
              "again, no master: cli / rsync": m["cli again, no master"] / m["rsync again"],
              "first: core / rsync": m["core first"] / m["rsync first"],
              "again: core / rsync": m["core again"] / m["rsync again"]}
    print(f"{files} files ({size / 1024:.0f} KiB) to {args.hosts} hosts, median of {args.repeat}")
    print(f"{'':<8} {'clusterctl sync':>15} {'sync_tree()':>12} {'4x rsync -a':>12} {'cli/rsync':>10} {'core/rsync':>10}")
    for phase in ("first", "again"):
        print(f"{phase:<8} {m['cli ' + phase]:>14.2f}s {m['core ' + phase]:>11.2f}s {m['rsync ' + phase]:>11.2f}s "
              f"{m['cli ' + phase] / m['rsync ' + phase]:>10.2f} {m['core ' + phase] / m['rsync ' + phase]:>10.2f}")
    print(f"again, no live master: clusterctl sync {m['cli again, no master']:.2f}s, "
          f"{m['cli again, no master'] / m['rsync again']:.2f}x rsync")
    record = {"benchmark": "sync", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}", "hosts": args.hosts,
              "files": files, "bytes": size, "repeat": args.repeat,
              "median_s": {k: round(v, 3) for k, v in m.items()}, "ratios": {k: round(v, 3) for k, v in ratios.items()},
              "raw_s": {k: [round(x, 3) for x in v] for k, v in times.items()}}
    out = os.path.join(HERE, "results", "sync.json")
    with open(out + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(out + ".tmp", out)
    print(f"wrote {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
