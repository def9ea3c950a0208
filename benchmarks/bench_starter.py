"""Who starts the ranks: trainer throughput under `clusterctl run` (clusterctl's rank starter, and mlx.launch
as `--launcher mlx.launch`) against the same ranks started directly, and the CPU the supervisor and the
launcher use while the job trains.

    .venv/bin/python benchmarks/bench_starter.py [--repeat 3] [--steps 200] [--hosts-too]

Three ways to run the bundled trainer on 2 ranks over MLX's ring backend, interleaved, --repeat times:
`clusterctl run` (this machine, no inventory), the same with `--launcher mlx.launch`, and the two ranks
started directly with MLX_RANK and MLX_HOSTFILE (what MLX needs and nothing else: the floor). With
--hosts-too, the same three on 2 loopback sshd hosts (tests/sshcluster.py), the direct ranks started with
plain `ssh -F <the cluster's ssh_config>`.

Throughput is rank 0's tokens/s as it prints them, the median over its reports after the first (which
includes compilation). CPU: /proc is sampled every second for the `clusterctl` process (the supervisor)
and the launcher under it (hosts/scripts/ranks.py, or mlx.launch); the figure is their CPU seconds per
second of wall time between the first sample 5 s into the job and the last one before it ends: the
steady run. Writes benchmarks/results/starter.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from record import write_record  # noqa: E402
from sshcluster import descendants  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
FLAGS = ["--n-layers", "2", "--dim", "64", "--mlp-dim", "128", "--block-size", "64", "--batch-size", "8",
         "--lr", "3e-3", "--warmup", "20", "--report-every", "20", "--eval-every", "0", "--ckpt-every", "0"]


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK      # utime + stime
    except (OSError, IndexError, ValueError):
        return None


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_launcher(pid: int) -> bool:
    c = cmdline(pid)
    return "ranks.py" in c and "clusterctl-run-" not in c or "mlx.launch" in c or "_distributed_utils" in c


class Sampler(threading.Thread):
    """CPU of the supervisor (the root pid) and of the launcher below it, sampled every second."""

    def __init__(self, root: int | None):
        super().__init__(daemon=True)
        self.root, self.samples, self.done = root, [], threading.Event()

    def run(self):
        start, last = time.monotonic(), {}      # pid -> its last CPU reading (a launcher that ended keeps it)
        while not self.done.wait(1.0):
            if self.root is None:
                continue
            for pid in [self.root] + [p for p in descendants(self.root) if is_launcher(p)]:
                seconds = cpu_seconds(pid)
                if seconds is not None:
                    last[pid] = seconds
            if cpu_seconds(self.root) is None:
                break
            self.samples.append((time.monotonic() - start, sum(last.values())))

    def steady_share(self) -> float | None:
        steady = [s for s in self.samples if s[0] >= 5.0]
        if len(steady) < 3:
            return None
        (t0, c0), (t1, c1) = steady[0], steady[-1]
        return (c1 - c0) / (t1 - t0)


RATE = re.compile(r"step\s+\d+/\d+ \|.*\| ([\d,]+) tok/s")


def rank0_tokens_per_s(output: str) -> float:
    """The median of rank 0's reported tokens/s after its first report (which includes compilation)."""
    rates = [float(m.group(1).replace(",", "")) for m in RATE.finditer(output)][1:]
    if not rates:
        raise SystemExit(f"no tokens/s reported:\n{output[-2000:]}")
    return statistics.median(rates)


def timed(argv, *, cwd, env=None, sample: bool):
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid if sample else None)
    sampler.start()
    out = proc.communicate(timeout=1800)[0]
    sampler.done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed ({proc.returncode}):\n{out[-3000:]}")
    return time.monotonic() - start, sampler.steady_share(), out


def via_clusterctl(steps: int, launcher: str | None, inventory: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        argv = [sys.executable, "-m", "clusterctl", "run"]
        if inventory:
            argv += ["--hosts", inventory, "--backend", "ring"]
        if launcher:
            argv += ["--launcher", launcher]
        wall, cpu, out = timed([*argv, "--", *FLAGS, "--steps", str(steps)], cwd=cwd, sample=True)
        return {"wall_s": wall, "tokens_per_s": rank0_tokens_per_s(out), "supervisor_launcher_cpu": cpu}


def direct_here(steps: int) -> dict:
    """Two ranks on this machine with exactly what MLX's ring backend reads."""
    from clusterctl.launch.backends.rankstarter import free_port_block
    with tempfile.TemporaryDirectory() as cwd:
        port = free_port_block(2)
        hostfile = os.path.join(cwd, "ring.json")
        with open(hostfile, "w") as f:
            json.dump([[f"127.0.0.1:{port}"], [f"127.0.0.1:{port + 1}"]], f)
        out = os.path.join(cwd, "out")
        start = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-m", "clusterctl.train", "--out", out, *FLAGS, "--steps", str(steps)],
                                  cwd=cwd, env={**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": hostfile},
                                  stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, text=True) for r in range(2)]
        return _finish(procs, start)


def _finish(procs, start) -> dict:
    text = procs[0].communicate(timeout=1800)[0]
    codes = [p.wait(timeout=1800) for p in procs]
    if codes != [0] * len(procs):
        raise SystemExit(f"direct ranks exited {codes}")
    return {"wall_s": time.monotonic() - start, "tokens_per_s": rank0_tokens_per_s(text)}


def direct_hosts(cluster, steps: int) -> dict:
    """Two ranks on two loopback hosts, each started with plain ssh and exactly what MLX reads."""
    from clusterctl.hosts.openssh import ssh_options
    from clusterctl.inventory import load
    inv = load(str(cluster.inventory))
    options = ssh_options(inv)
    ring = json.dumps([[f"{h.address}:{32323 + i}"] for i, h in enumerate(inv.hosts)])
    with tempfile.TemporaryDirectory() as cwd:
        out = os.path.join(cwd, "out")
        start = time.monotonic()
        procs = []
        for rank, host in enumerate(inv.hosts):
            script = (f"f=$(mktemp) && printf %s {shlex.quote(ring)} > \"$f\" && MLX_RANK={rank} MLX_HOSTFILE=\"$f\" "
                      f"exec {shlex.quote(host.python)} -m clusterctl.train --out {shlex.quote(out)} "
                      + shlex.join([*FLAGS, "--steps", str(steps)]))
            procs.append(subprocess.Popen(["ssh", *options, "--", host.name, script], text=True,
                                          stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL))
        return _finish(procs, start)


def summarize(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for name, rows in runs.items():
        cpu = [r["supervisor_launcher_cpu"] for r in rows if r.get("supervisor_launcher_cpu") is not None]
        out[name] = {"wall_s": statistics.median(r["wall_s"] for r in rows),
                     "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
                     "supervisor_launcher_cpu": statistics.median(cpu) if cpu else None, "runs": rows}
    floor = out["direct"]["tokens_per_s"]
    for name in out:
        out[name]["tokens_vs_direct"] = out[name]["tokens_per_s"] / floor
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hosts-too", action="store_true", help="also on 2 loopback sshd hosts")
    args = parser.parse_args()
    here = {"clusterctl": [], "mlx.launch": [], "direct": []}
    for i in range(args.repeat):
        here["clusterctl"].append(via_clusterctl(args.steps, None))
        here["mlx.launch"].append(via_clusterctl(args.steps, "mlx.launch"))
        here["direct"].append(direct_here(args.steps))
        print(f"this machine, round {i + 1}: " + ", ".join(f"{k} {v[-1]['tokens_per_s']:,.0f} tok/s" for k, v in here.items()),
              flush=True)
    record = {"steps": args.steps, "flags": FLAGS, "this_machine": summarize(here)}
    if args.hosts_too:
        from sshcluster import SSHCluster
        with tempfile.TemporaryDirectory(prefix="bench-starter-") as tmp:
            cluster = SSHCluster(os.path.join(tmp, "cluster"), 2).start()
            inventory = str(cluster.inventory)
            hosts = {"clusterctl": [], "mlx.launch": [], "direct": []}
            via_clusterctl(10, None, inventory)            # warm: the plan cache and the SSH masters
            for i in range(args.repeat):
                hosts["clusterctl"].append(via_clusterctl(args.steps, None, inventory))
                hosts["mlx.launch"].append(via_clusterctl(args.steps, "mlx.launch", inventory))
                hosts["direct"].append(direct_hosts(cluster, args.steps))
                print(f"2 loopback hosts, round {i + 1}: " +
                      ", ".join(f"{k} {v[-1]['tokens_per_s']:,.0f} tok/s" for k, v in hosts.items()), flush=True)
            record["two_hosts"] = summarize(hosts)
            cluster.stop_all()
    for where in ("this_machine", "two_hosts"):
        for name, row in record.get(where, {}).items():
            cpu = row["supervisor_launcher_cpu"]
            print(f"{where} {name}: {row['tokens_per_s']:,.0f} tok/s ({row['tokens_vs_direct']:.2f}x direct), "
                  f"wall {row['wall_s']:.1f} s" + (f", supervisor+launcher CPU {cpu * 100:.1f}% of a core" if cpu is not None else ""))
    write_record("starter", **record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
