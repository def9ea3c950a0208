"""What run's live panel costs the job: trainer throughput with the panel drawn against `--plain`, both in
a real terminal (tmux), and the CPU of the `clusterctl` process that draws it.

    .venv/bin/python benchmarks/bench_panel.py [--repeat 5] [--steps 300]

The bundled trainer (bench_starter's model) on 2 ranks of this machine over ring, `clusterctl run` in a
160x50 tmux pane, with the panel and with `--plain`, interleaved --repeat times. Throughput is rank 0's
tokens/s from metrics.jsonl, the median over its reports after the first (which includes compilation).
CPU: the `clusterctl` process and the rank starter under it, sampled as bench_starter.py samples them
(share of a core in the steady run), and the `clusterctl` process's own CPU seconds over the whole run.
Then the worst case for the panel, a chatty program: 2 ranks printing CHATTY_LINES lines each (100 at a
time, 10 bursts a second), the `clusterctl` process's CPU seconds with and without the panel.
Writes benchmarks/results/panel.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from bench_starter import FLAGS, Sampler, cpu_seconds
from record import write_record

TMUX = ["tmux", "-L", f"bench-panel-{os.getpid()}"]
SOCKET = os.path.join(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}", TMUX[-1])
CHATTY_LINES = 6000
CHATTY = f"""import time
for i in range({CHATTY_LINES}):
    print(f"line {{i}} " + "x" * 60, flush=True)
    if i % 100 == 99:
        time.sleep(0.1)
"""


def tmux(*args) -> str:
    return subprocess.run([*TMUX, *args], capture_output=True, text=True, timeout=10, check=True).stdout


def in_tmux(cwd: str, program: list[str], plain: bool) -> dict:
    """`clusterctl run [--plain] PROGRAM` in a tmux pane, to its end: wall, CPU, what the screen shows."""
    argv = [sys.executable, "-m", "clusterctl", "run", *(["--plain"] if plain else []), *program]
    tmux("new-session", "-d", "-s", "job", "-x", "160", "-y", "50", f"cd {shlex.quote(cwd)} && exec {shlex.join(argv)}")
    tmux("set-option", "-t", "job", "remain-on-exit", "on")
    pid = int(tmux("display", "-p", "-t", "job", "#{pane_pid}"))
    sampler = Sampler(pid)
    sampler.start()
    start, cpu = time.monotonic(), 0.0
    while time.monotonic() - start < 600:
        seconds = cpu_seconds(pid)      # its own CPU, read until it is gone (the last 50 ms are not seen)
        if seconds is None or tmux("display", "-p", "-t", "job", "#{pane_dead}").strip() == "1":
            break
        cpu = seconds
        time.sleep(0.05)
    wall = time.monotonic() - start
    sampler.done.set()
    sampler.join()
    screen = tmux("capture-pane", "-p", "-t", "job")
    tmux("kill-session", "-t", "job")
    drawn = "job: elapsed" in screen
    if drawn == plain:
        raise SystemExit(f"the panel was {'drawn' if drawn else 'not drawn'} with plain={plain}:\n{screen}")
    return {"wall_s": wall, "clusterctl_cpu_s": cpu, "clusterctl_cpu": sampler.steady_share(), "screen": screen}


def trainer_run(steps: int, plain: bool) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        r = in_tmux(cwd, ["--", *FLAGS, "--steps", str(steps)], plain)
        [metrics] = glob.glob(os.path.join(cwd, "runs", "*", "metrics.jsonl"))
        rates = [m["tokens_per_s"] for m in map(json.loads, open(metrics)) if "tokens_per_s" in m][1:]
        if not rates:
            raise SystemExit(f"no tokens/s in {metrics}:\n{r['screen']}")
        return {"tokens_per_s": statistics.median(rates), **{k: v for k, v in r.items() if k != "screen"}}


def chatty_run(plain: bool) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        with open(os.path.join(cwd, "chatty.py"), "w") as f:
            f.write(CHATTY)
        r = in_tmux(cwd, ["chatty.py"], plain)
        return {"wall_s": r["wall_s"], "clusterctl_cpu_s": r["clusterctl_cpu_s"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    runs = {"panel": [], "plain": []}
    chatty = {"panel": [], "plain": []}
    try:
        for i in range(args.repeat):
            for name in ("panel", "plain") if i % 2 == 0 else ("plain", "panel"):
                runs[name].append(trainer_run(args.steps, plain=name == "plain"))
            print(f"trainer, round {i + 1}: " + ", ".join(f"{k} {v[-1]['tokens_per_s']:,.0f} tok/s"
                                                          for k, v in runs.items()), flush=True)
        for i in range(3):
            for name in ("panel", "plain"):
                chatty[name].append(chatty_run(plain=name == "plain"))
            print(f"chatty, round {i + 1}: " + ", ".join(f"{k} {v[-1]['clusterctl_cpu_s']:.2f} CPU s"
                                                         for k, v in chatty.items()), flush=True)
    finally:
        subprocess.run([*TMUX, "kill-server"], capture_output=True)
        if os.path.exists(SOCKET):     # the server leaves its socket file behind
            os.unlink(SOCKET)
    results = {}
    for name, rows in runs.items():
        share = [r["clusterctl_cpu"] for r in rows if r["clusterctl_cpu"] is not None]
        results[name] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
                         "wall_s": statistics.median(r["wall_s"] for r in rows),
                         "clusterctl_cpu": statistics.median(share) if share else None,
                         "clusterctl_cpu_s": statistics.median(r["clusterctl_cpu_s"] for r in rows), "runs": rows}
    ratios = [p["tokens_per_s"] / q["tokens_per_s"] for p, q in zip(runs["panel"], runs["plain"])]
    results["ratio"] = {"median": results["panel"]["tokens_per_s"] / results["plain"]["tokens_per_s"],
                        "pairs_min": min(ratios), "pairs_max": max(ratios)}
    results["chatty"] = {"lines": 2 * CHATTY_LINES, **{
        name: {"clusterctl_cpu_s": statistics.median(r["clusterctl_cpu_s"] for r in rows), "runs": rows}
        for name, rows in chatty.items()}}
    for name in ("panel", "plain"):
        r = results[name]
        share = r["clusterctl_cpu"]
        print(f"trainer {name}: {r['tokens_per_s']:,.0f} tok/s, wall {r['wall_s']:.1f} s, clusterctl "
              f"{r['clusterctl_cpu_s']:.2f} CPU s" + (f" ({share * 100:.1f}% of a core with the starter)" if share is not None else ""))
    q = results["ratio"]
    print(f"panel / plain tokens/s: {q['median']:.3f} (pairs {q['pairs_min']:.3f}..{q['pairs_max']:.3f})")
    c = results["chatty"]
    print(f"chatty ({c['lines']} lines): clusterctl {c['panel']['clusterctl_cpu_s']:.2f} CPU s with the panel, "
          f"{c['plain']['clusterctl_cpu_s']:.2f} with --plain")
    write_record("panel", steps=args.steps, flags=FLAGS, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
