"""What each test costs in CPU, its processes' included: the suite is bound by the CPU (CONTRIBUTING.md#running-side-by-side),
so that is the figure to cut. With CLUSTERCTL_TEST_CPU_LOG=FILE each pytest process (each xdist worker) moves itself
into a control group of its own, which every process it starts stays in: the ranks of the simulated hosts too (sshd
is the worker's child, and its sessions are sshd's), detached supervisors included. After each test it appends one
JSON line to FILE: {"id", "cpu" (seconds of CPU the group used during the test's setup, call and teardown), "wall",
"worker"}. What a module's shared fixture leaves running (a serve, a cluster's sshd) is counted to the tests it runs
beside. Needs root and cgroup v1's cpuacct or cgroup v2; elsewhere it says so once and records nothing.

    CLUSTERCTL_TEST_CPU_LOG=/tmp/cpu.jsonl bash tests/run.sh
    python3 tests/cpuledger.py /tmp/cpu.jsonl        # the modules and the tests that cost most
"""
import json
import os
import sys
import time

V1 = "/sys/fs/cgroup/cpuacct"
V2 = "/sys/fs/cgroup"


class Ledger:
    def __init__(self, path: str, name: str):
        self.path, self.group, self.usage = path, None, None
        why = "neither cgroup v1's cpuacct nor cgroup v2 is mounted"
        for root, read in ((V1, self._v1), (V2, self._v2)):
            if not os.path.exists(os.path.join(root, "cpuacct.usage" if root == V1 else "cgroup.controllers")):
                continue
            try:
                group = os.path.join(root, name)
                os.makedirs(group, exist_ok=True)
                with open(os.path.join(group, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                self.group, self.usage = group, read
                read()
                return
            except (OSError, KeyError, ValueError) as e:
                self.group, self.usage, why = None, None, f"{root}: {e}"
        print(f"tests/cpuledger.py: no control group to count CPU in ({why}): nothing recorded", file=sys.stderr)

    def _v1(self) -> float:
        with open(os.path.join(self.group, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9

    def _v2(self) -> float:
        with open(os.path.join(self.group, "cpu.stat")) as f:
            return int(dict(line.split() for line in f)["usage_usec"]) / 1e6

    def close(self) -> None:
        """Back to the parent group, and this one removed if nothing is left in it (best effort)."""
        if self.group is None:
            return
        try:
            with open(os.path.join(os.path.dirname(self.group), "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            os.rmdir(self.group)
        except OSError:
            pass

    def record(self, nodeid: str, cpu0: float, wall0: float) -> None:
        row = {"id": nodeid, "cpu": round(self.usage() - cpu0, 2), "wall": round(time.time() - wall0, 2),
               "worker": os.environ.get("PYTEST_XDIST_WORKER", "master")}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def summary(path: str, top: int = 25) -> str:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    modules: dict[str, list[float]] = {}
    for r in rows:
        m = modules.setdefault(r["id"].split("::")[0], [0.0, 0])
        m[0] += r["cpu"]
        m[1] += 1
    total = sum(r["cpu"] for r in rows)
    lines = [f"{len(rows)} tests, {total:.0f} CPU-s", "", "CPU-s  share  tests  module"]
    lines += [f"{cpu:6.0f} {100 * cpu / total:5.1f}% {n:6d}  {name}"
              for name, (cpu, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]]
    lines += ["", "CPU-s  wall-s  test"]
    lines += [f"{r['cpu']:6.1f} {r['wall']:7.1f}  {r['id']}" for r in sorted(rows, key=lambda r: -r["cpu"])[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tests/cpuledger.py FILE (a log written with CLUSTERCTL_TEST_CPU_LOG=FILE)")
    try:
        print(summary(sys.argv[1]))
    except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
        sys.exit(f"tests/cpuledger.py: {sys.argv[1]}: not a CPU log ({type(e).__name__}: {e})")
