"""Launch overhead of `clusterctl run` against the raw launcher command it generates, on 4 loopback hosts.

    .venv/bin/python benchmarks/bench_launch.py [--hosts 4] [--repeat 5]

For each backend (mpi: mpirun; ring: mlx.launch) five commands run a tiny MLX job (init + all_sum), in
turn, --repeat times: `clusterctl run --no-sync` as users run it again and again (launching from the plan
cached by the previous run while the pre-flight verifies it beside the job; supervision, per-rank logs);
the same with its default project sync (nothing changed: one rsync round trip per host); `clusterctl
run --no-sync` with no cached plan (the first launch on a cluster: the pre-flight comes first); the exact launcher
argv `run` generated (from its launch.json, bootstrap included); and the plain launcher with the script
alone (no bootstrap). Two more: the manual recipe `run` replaces (one plain `rsync -a -e 'ssh -F <the
cluster's ssh_config>'` per host, in parallel, then the generated argv), and `clusterctl run --no-sync` right
after `clusterctl ssh-close` (no live SSH master: clusterctl's own runs otherwise find one, kept 90 s).
Medians and ratios are from the same interleaved runs.

Then launch's fixed cost (issue 39's target: at most 0.25 s), on its own cluster of --fixed-hosts (3) hosts: a
one-second MPI program (init, all_sum, sleep 1) launched, in turn, by the mpirun line `clusterctl hostfile
--print-command` prints (run by /bin/sh, as a user pastes it), by `clusterctl run` as users type it (its
project copy, nothing changed: one rsync round trip per host, beside the launch; stdin at its default, here
/dev/null), by `run --no-sync` (the copy skipped: what the printed line assumes, the project already there),
and by `run` with an empty pipe for stdin; each warm (run twice before). The figures: each one's median minus the printed
line's. Writes benchmarks/results/launch.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from record import write_record  # noqa: E402
from sshcluster import SSHCluster  # noqa: E402

JOB = """\
import sys
import mlx.core as mx
g = mx.distributed.init(backend=sys.argv[1], strict=True)
mx.eval(mx.distributed.all_sum(mx.ones(4), group=g))
print(g.size())
"""


def timed(argv, env=None, cwd=None, ranks: int = 0) -> float:
    """Seconds `argv` takes; with `ranks`, that many ranks must have printed the world size (mlx.launch
    exits 0 even when its ranks fail, docs/facts/launchers.md#mlx-launch-exit-status: a failed run is not timed)."""
    start = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)
    # every rank prints the world size; ranks' lines may run together on one pipe ("44"), so count digits
    if r.returncode != 0 or r.stdout.count(str(ranks)) < ranks:
        raise RuntimeError(f"{argv[:3]} failed: {r.stdout[-500:]} {r.stderr[-1500:]}")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fixed-hosts", type=int, default=3)
    parser.add_argument("--fixed-repeat", type=int, default=7)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        cluster = SSHCluster(os.path.join(tmp, "cluster"), args.hosts).start()
        try:
            project = os.path.join(tmp, "project")     # what run syncs: the job alone
            os.makedirs(project)
            script = os.path.join(project, "job.py")
            with open(script, "w") as f:
                f.write(JOB)
            for backend in ("mpi", "ring"):
                # ring through mlx.launch: the launcher whose raw argv there is to compare with (run's own rank
                # starter, ring's default since 2026-11-24, has no argv of a launcher a user would type)
                launcher = ["--launcher", "mlx.launch"] if backend == "ring" else []
                synced = [sys.executable, "-m", "clusterctl", "run", script, backend, "--hosts",
                          str(cluster.inventory), "--backend", backend, *launcher, "--runs-dir", os.path.join(tmp, "runs")]
                run = synced + ["--no-sync"]
                cache = {"XDG_CACHE_HOME": os.path.join(tmp, "cache")}
                timed(synced, env=cache, cwd=project)                           # warm-up (host keys, caches)
                runs_dir = os.path.join(tmp, "runs")
                launch = json.load(open(os.path.join(runs_dir, sorted(os.listdir(runs_dir))[-1], "launch.json")))
                raw = launch["argv"]
                plain = raw[: raw.index("--") + 1] + ([cluster_python(), script, backend] if backend == "mpi"
                                                      else [script, backend])
                times = {"clusterctl run": [], "run, no cached plan": [], "run + sync (no change)": [],
                         "generated argv": [], "plain launcher": [], "manual recipe": [], "run, no master": []}
                rsh = ["-e", f"ssh -F {cluster.ssh_config}"]

                def recipe() -> None:
                    procs = [subprocess.Popen(["rsync", "-a", *rsh, project + "/", f"{h.name}:{cluster.workdir}/"],
                                              stdout=subprocess.DEVNULL) for h in cluster.hosts]
                    assert all(p.wait() == 0 for p in procs)
                    subprocess.run(raw, env={**os.environ, **launch["launcher_env"]}, cwd=tmp, check=True,
                                   capture_output=True, timeout=300)
                n = args.hosts
                for _ in range(args.repeat):
                    times["clusterctl run"].append(timed(run, env=cache, cwd=project, ranks=n))
                    times["run + sync (no change)"].append(timed(synced, env=cache, cwd=project, ranks=n))
                    shutil.rmtree(cache["XDG_CACHE_HOME"])
                    times["run, no cached plan"].append(timed(run, env=cache, cwd=project, ranks=n))
                    times["generated argv"].append(timed(raw, env=launch["launcher_env"], cwd=tmp, ranks=n))
                    times["plain launcher"].append(timed(plain, env=launch["launcher_env"], cwd=tmp, ranks=n))
                    start = time.monotonic()
                    recipe()
                    times["manual recipe"].append(time.monotonic() - start)
                    timed([sys.executable, "-m", "clusterctl", "ssh-close"], env=cache)
                    times["run, no master"].append(timed(run, env=cache, cwd=project, ranks=n))
                results[backend] = {k: statistics.median(v) for k, v in times.items()}
        finally:
            cluster.stop_all()
    print(f"{'backend':<8} {'clusterctl run':>14} {'no cached plan':>14} {'run + sync':>14} {'generated argv':>14} "
          f"{'plain launcher':>14} {'run/generated':>13} {'uncached/gen.':>13} {'synced/gen.':>11} {'run/plain':>9}")
    for backend, m in results.items():
        g = m["generated argv"]
        print(f"{backend:<8} {m['clusterctl run']:>13.2f}s {m['run, no cached plan']:>13.2f}s "
              f"{m['run + sync (no change)']:>13.2f}s {g:>13.2f}s {m['plain launcher']:>13.2f}s "
              f"{m['clusterctl run'] / g:>13.2f} {m['run, no cached plan'] / g:>13.2f} "
              f"{m['run + sync (no change)'] / g:>11.2f} {m['clusterctl run'] / m['plain launcher']:>9.2f}")
    for backend, m in results.items():
        print(f"{backend}: run + sync / manual recipe {m['run + sync (no change)'] / m['manual recipe']:.2f} "
              f"({m['manual recipe']:.2f}s); run with no live master {m['run, no master']:.2f}s, "
              f"{m['run, no master'] / m['generated argv']:.2f}x the generated argv")
    fixed = fixed_cost(args.fixed_hosts, args.fixed_repeat)
    print(f"\nlaunch's fixed cost, {args.fixed_hosts} hosts, a one-second mpi program, median of {args.fixed_repeat} "
          f"(seconds over the printed mpirun line, {fixed['mpirun line']:.2f} s abs.):")
    for what, median in fixed.items():
        if what != "mpirun line":
            print(f"  {what:<28} {median - fixed['mpirun line']:+.3f} s   ({median:.2f} s abs.)")
    write_record("launch", hosts=args.hosts, repeat=args.repeat,
                 results={b: {k: round(v, 3) for k, v in m.items()} for b, m in results.items()},
                 fixed_cost={"hosts": args.fixed_hosts, "repeat": args.fixed_repeat,
                             "medians": {k: round(v, 3) for k, v in fixed.items()},
                             "over_printed_line": {k: round(v - fixed["mpirun line"], 3) for k, v in fixed.items()
                                                   if k != "mpirun line"}})


ONE_SECOND = """\
import time
import mlx.core as mx
g = mx.distributed.init(backend="mpi", strict=True)
mx.eval(mx.distributed.all_sum(mx.ones(4), group=g))
time.sleep(1)
print("world", g.size())
"""


def fixed_cost(hosts: int, repeat: int) -> dict[str, float]:
    """Medians (s) of the printed mpirun line and of `clusterctl run` three ways, interleaved (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as tmp:
        cluster = SSHCluster(os.path.join(tmp, "cluster"), hosts).start()
        try:
            project = os.path.join(tmp, "project")
            os.makedirs(project)
            with open(os.path.join(project, "job.py"), "w") as f:
                f.write(ONE_SECOND)
            env = {"XDG_CACHE_HOME": os.path.join(tmp, "cache")}
            clusterctl = [sys.executable, "-m", "clusterctl"]
            run = clusterctl + ["run", "--hosts", str(cluster.inventory), "--backend", "mpi", "job.py"]

            def timed_run(argv, stdin=subprocess.DEVNULL) -> float:
                start = time.monotonic()
                r = subprocess.run(argv, stdin=stdin, capture_output=True, text=True, cwd=project,
                                   env={**os.environ, **env}, timeout=300)
                if r.returncode != 0 or r.stdout.count(f"world {hosts}") < hosts:
                    raise RuntimeError(f"{argv[:4]} failed: {r.stdout[-500:]} {r.stderr[-1500:]}")
                return time.monotonic() - start

            def piped() -> float:       # an empty pipe for stdin: the writer is gone before run looks
                read_end, write_end = os.pipe()
                os.close(write_end)
                try:
                    return timed_run(run, stdin=read_end)
                finally:
                    os.close(read_end)

            printed = subprocess.run(clusterctl + ["hostfile", "--hosts", str(cluster.inventory), "--print-command",
                                                   "-o", os.path.join(project, "hostfile"), "job.py"],
                                     capture_output=True, text=True, cwd=project, env={**os.environ, **env}, check=True)
            line = [x for x in printed.stdout.splitlines() if "mpirun" in x][-1]
            timed_run(run)
            timed_run(run)             # warm: the plan cached, the SSH masters up, nothing left to copy
            ways = {"mpirun line": lambda: timed_run(["/bin/sh", "-c", line]),
                    "run": lambda: timed_run(run),
                    "run --no-sync": lambda: timed_run(run[:4] + ["--no-sync"] + run[4:]),
                    "run, stdin an empty pipe": piped}
            times: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(repeat):
                for what, way in ways.items():
                    times[what].append(way())
            return {k: statistics.median(v) for k, v in times.items()}
        finally:
            cluster.stop_all()


def cluster_python() -> str:
    return sys.executable


if __name__ == "__main__":
    main()
