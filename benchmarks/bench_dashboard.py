"""What watching costs a run: the bundled trainer's tokens/s with `clusterctl dashboard` open in a browser, and with
`clusterctl top` running, against the same run with neither, side by side.

    .venv/bin/python benchmarks/bench_dashboard.py [--repeat 3] [--steps 300]

Two loopback sshd hosts (tests/sshcluster.py), the bundled trainer over ring (`clusterctl run --plain`, bench_starter's
model), interleaved --repeat times: alone; with `clusterctl dashboard --hosts` serving a page that headless chromium
(selenium) keeps open the whole run (the page's event stream every 2 s, each host's probe printing a sample every
5 s over SSH, the run's curves read as they grow, the charts redrawn); with `clusterctl top --hosts` sampling every
3 s to a pipe (each at its default interval).
tokens/s: the global rate rank 0 reports (metrics.jsonl), median of its reports over the run's second half. This is
the pessimistic case: here the hosts, the browser and the probes share this machine's cores, where on a real
cluster the browser and the dashboard run on the laptop and only the probe runs on each Mac.
Writes benchmarks/results/dashboard.json.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_starter import FLAGS  # noqa: E402
from record import run_trainer, write_record  # noqa: E402

URL = re.compile(r"dashboard: (http://\S+)")


class Watcher:
    """A `clusterctl` command in the background for the length of one run (and, for the dashboard, a browser on its
    page), stopped after it."""

    def __init__(self, args: list[str], browse: bool, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "clusterctl", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.driver = None
        if browse:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
            url = self._url()
            options = webdriver.ChromeOptions()
            for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--window-size=1280,1400"):
                options.add_argument(arg)
            self.driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
            self.driver.get(url)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def _url(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := URL.search(line):
                    return m.group(1)
            time.sleep(0.1)
        raise SystemExit("the dashboard printed no URL:\n" + "".join(self.lines))

    def check(self) -> str:
        """What the page showed at the run's end (it must have followed the run), or top's last lines."""
        if self.driver is not None:
            deadline = time.monotonic() + 15          # the page hears of the end at its next update (every 2 s)
            while self.driver.find_element("id", "run-status").text == "running" and time.monotonic() < deadline:
                time.sleep(0.5)
            return self.driver.find_element("id", "run-status").text
        return "".join(self.lines[-3:])

    def stop(self):
        if self.driver is not None:
            self.driver.quit()
        self.proc.terminate()
        self.proc.wait(30)


def one(inventory: str, steps: int, watch: list[str] | None, browse: bool, env: dict) -> dict:
    watcher = Watcher([*watch, "--hosts", inventory], browse, env) if watch else None
    try:
        with tempfile.TemporaryDirectory(prefix="run-") as cwd:      # kept until the page has seen the run's end
            wall, records, _ = run_trainer(inventory, "ring", [*FLAGS, "--steps", str(steps)], cwd=cwd)
            seen = watcher.check() if watcher else None
    finally:
        if watcher:
            watcher.stop()
    reports = [x for x in records if "tokens_per_s" in x]
    steady = [x["tokens_per_s"] for x in reports if x["step"] > steps // 2]
    return {"wall_s": wall, "tokens_per_s": statistics.median(steady), "seen": seen}


def ratio(a: list[dict], b: list[dict]) -> dict:
    pairs = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(a, b)]
    return {"median": statistics.median(pairs), "pairs_min": min(pairs), "pairs_max": max(pairs)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    from sshcluster import SSHCluster
    variants = {"alone": (None, False), "dashboard open": (["dashboard"], True),
                "top": (["top", "--interval", "3"], False)}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")    # the runs index the page reads: these runs only
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 2).start()
        env = cluster.client_env()
        try:
            inventory = str(cluster.inventory)
            one(inventory, 20, None, False, env)                  # warm: the plan cache, the SSH masters
            for i in range(args.repeat):
                for name, (watch, browse) in variants.items():
                    runs[name].append(one(inventory, args.steps, watch, browse, env))
                print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]['tokens_per_s']:,.0f} tok/s" for k, v in runs.items()),
                      flush=True)
        finally:
            cluster.stop_all()
    seen = {r["seen"] for r in runs["dashboard open"]}
    if seen != {"finished"}:
        raise SystemExit(f"the page did not follow every run to its end: {seen}")
    record = {"steps": args.steps, "flags": FLAGS, "runs": runs,
              "median_tokens_per_s": {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()},
              "dashboard_over_alone": ratio(runs["dashboard open"], runs["alone"]),
              "top_over_alone": ratio(runs["top"], runs["alone"])}
    for name in ("dashboard_over_alone", "top_over_alone"):
        r = record[name]
        print(f"{name}: {r['median']:.3f} (pairs {r['pairs_min']:.3f}..{r['pairs_max']:.3f})")
    write_record("dashboard", **record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
