"""Doctor's wall time on 2, 4, 8 and 16 loopback hosts (tests/sshcluster.py), against the floor this
machine puts under any all-to-all check: N*(N-1) concurrent OpenSSH logins started directly.

    .venv/bin/python benchmarks/bench_doctor.py [--sizes 2,4,8,16] [--repeat 3] [--stock]

Prints a table and writes benchmarks/results/doctor.json. Every figure is a median of --repeat runs after
one warm-up run per size (which records host keys). doctor runs with a 10 s connect timeout at every size:
on a healthy cluster the timeout never changes the wall time, but 240 logins on two shared cores can keep
one banner waiting past the default 5 s. All hosts share this machine's CPU, so the work of an
all-to-all check grows as N^2 here, where on real hosts each machine does its own N-1 in parallel.

--stock: the hosts run sshd with OpenSSH's defaults (its post-quantum key exchange) and nothing helps the
client (tests/sshcluster.py stock_sshd: only the inventory says how to connect); the floor's logins then read
the hosts' own rendering of the inventory, as doctor's do. Writes benchmarks/results/doctor-stock.json.
"""
from __future__ import annotations

import argparse
import os
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

from clusterctl.doctor import DoctorOptions, run_doctor  # noqa: E402
from clusterctl.hosts.connector import Connector  # noqa: E402
from clusterctl.hosts.openssh import host_config_text, write_config  # noqa: E402
from clusterctl.inventory import load  # noqa: E402

CONNECT_TIMEOUT_S = 10.0


def raw_all_to_all(cluster: SSHCluster) -> float:
    """N*(N-1) `ssh hJ true` started at once from this machine with the cluster's ssh_config (stock: with
    the hosts' rendering of the inventory, no connection sharing)."""
    if cluster.stock_sshd:
        inv = load(cluster.inventory)
        config, names = write_config(host_config_text(inv, inv.hosts[0])), [h.name for h in inv.hosts]
    else:
        config, names = str(cluster.ssh_config), [h.name for h in cluster.hosts]
    start = time.monotonic()
    procs = [subprocess.Popen(["ssh", "-F", config, "-o", "ControlMaster=no", dst, "true"], stdin=subprocess.DEVNULL,
                              env=cluster.client_env())
             for src in names for dst in names if dst != src]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"raw ssh failed: {codes}")
    return time.monotonic() - start


def measure(size: int, repeat: int, stock: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-doctor-{size}-") as tmp:
        cluster = SSHCluster(tmp, size, stock_sshd=stock).start()
        os.environ.update(cluster.client_env())
        try:
            inventory = load(cluster.inventory)
            run_doctor(Connector(inventory, connect_timeout=CONNECT_TIMEOUT_S), DoctorOptions(deep=False))          # warm-up: host keys, page cache
            runs = {"shallow": [], "deep": [], "raw": []}
            phases = []
            for _ in range(repeat):
                r = run_doctor(Connector(inventory, connect_timeout=CONNECT_TIMEOUT_S), DoctorOptions(deep=False))
                assert r.ok, [f.detail for f in r.findings if f.status != "pass"]
                runs["shallow"].append(r.elapsed_s)
                phases.append(r.phases)
                r = run_doctor(Connector(inventory, connect_timeout=CONNECT_TIMEOUT_S), DoctorOptions(deep=True))
                assert r.ok, [f.detail for f in r.findings if f.status != "pass"]
                runs["deep"].append(r.elapsed_s)
                runs["raw"].append(raw_all_to_all(cluster))
            med = {k: statistics.median(v) for k, v in runs.items()}
            med["probe"] = statistics.median(p["probe"] for p in phases)
            med["data-plane"] = statistics.median(p["data-plane"] for p in phases)
            med["checks"] = len(r.findings)
            return med
        finally:
            cluster.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stock", action="store_true", help="a stock sshd, only the inventory to go by")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    home = os.environ.get("HOME")
    results = {size: measure(size, args.repeat, args.stock) for size in sizes}
    if home:
        os.environ["HOME"] = home
    base = results[sizes[0]]
    print(f"{'hosts':>5} {'checks':>6} {'doctor':>8} {'probe':>7} {'dataplane':>9} {'deep':>7} "
          f"{'raw N(N-1) ssh':>14} {'doctor/raw':>10} {f'vs {sizes[0]} hosts':>11}")
    for size, m in results.items():
        print(f"{size:>5} {m['checks']:>6} {m['shallow']:>7.2f}s {m['probe']:>6.2f}s {m['data-plane']:>8.2f}s "
              f"{m['deep']:>6.2f}s {m['raw']:>13.2f}s {m['shallow'] / m['raw']:>10.2f} "
              f"{m['shallow'] / base['shallow']:>10.2f}x")
    write_record("doctor-stock" if args.stock else "doctor", repeat=args.repeat, connect_timeout_s=CONNECT_TIMEOUT_S,
                 results={str(k): {kk: round(vv, 3) for kk, vv in v.items()} for k, v in results.items()})


if __name__ == "__main__":
    main()
