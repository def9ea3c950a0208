"""Drop the data plane between test hosts while SSH goes on: the fault of a Thunderbolt cable pulled between two
Macs whose Wi-Fi (and so SSH) still works.

Every test host is a loopback address of this machine (tests/sshcluster.py), so the ranks' ring connections are
loopback TCP between those addresses and the ports of the run's ring hostfile (runs/<id>/attempt-K/ranks.json).
Linux's policy routing drops them: a rule per rank endpoint sends packets to (address, port), and packets from
it (the other direction), to a routing table whose only route is a blackhole. Loopback traffic is routed
by the `local` table, which the kernel consults first (rule 0), so while a drop is on that rule moves after
ours (to preference LOCAL_PREF) and comes back once no drop is left. Established connections are dropped as new
ones are (TCP retransmits until the rules go, then carries on), and nothing else is touched: sshd's port, the
other tests' hosts. Needs root and `ip` (iproute2); `available()` says whether this machine allows it.

    with DataPlaneDrop([("127.3.4.11", 32323), ("127.3.4.12", 32324)]):
        ...                 # the ranks' collectives wait; ssh to either host still works
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
import tempfile

LOCK = os.path.join(tempfile.gettempdir(), "clusterctl-tests-dataplane.lock")
OWNERS = os.path.join(tempfile.gettempdir(), "clusterctl-tests-dataplane.json")   # table -> [pid, prefs]
RULE_PREFS = range(100, 200)      # our rules' preferences, before LOCAL_PREF
LOCAL_PREF = 200


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def available() -> str | None:
    """None when this machine lets the tests change its routing rules, else why not."""
    try:
        r = _ip("rule", "show", check=False)
    except FileNotFoundError:
        return "no `ip` command (iproute2)"
    if r.returncode != 0:
        return f"`ip rule show` failed: {r.stderr.strip()}"
    if os.geteuid() != 0:
        return "changing routing rules needs root"
    return None


def endpoints(ranks_json: str) -> list[tuple[str, int]]:
    """Each rank's ring (address, port), from an attempt's ranks.json (the MLX_HOSTFILE every rank is given)."""
    with open(ranks_json, encoding="utf-8") as f:
        ranks = json.load(f)["ranks"]
    hostfile = json.loads(ranks[0]["mlx"]["MLX_HOSTFILE"])
    out = []
    for entry in hostfile:
        for spec in entry:
            address, port = spec.rsplit(":", 1)
            out.append((address, int(port)))
    return out


class DataPlaneDrop:
    def __init__(self, points: list[tuple[str, int]]):
        self.points = points
        self.table = random.randint(1000, 30000)
        self.prefs: list[int] = []

    def __enter__(self) -> "DataPlaneDrop":
        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _clear_orphans()
            _ip("route", "add", "blackhole", "0.0.0.0/0", "table", str(self.table))
            taken = _prefs_in_use()
            free = iter(p for p in RULE_PREFS if p not in taken)
            try:
                for address, port in self.points:
                    for selector in (["to", address, "dport", str(port)], ["from", address, "sport", str(port)]):
                        pref = next(free)
                        _ip("rule", "add", *selector, "table", str(self.table), "pref", str(pref))
                        self.prefs.append(pref)
                if LOCAL_PREF not in taken:        # loopback is routed by `local` first: it goes after ours
                    _ip("rule", "add", "pref", str(LOCAL_PREF), "table", "local")
                    _ip("rule", "del", "pref", "0", check=False)
            except BaseException:
                self._undo()
                raise
            owners = _owners()
            owners[str(self.table)] = [os.getpid(), self.prefs]
            _write_owners(owners)
        return self

    def __exit__(self, *exc) -> None:
        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._undo()

    def _undo(self) -> None:
        _remove(self.table, self.prefs)
        self.prefs = []


def _remove(table: int, prefs: list[int]) -> None:
    for pref in prefs:
        _ip("rule", "del", "pref", str(pref), check=False)
    _ip("route", "flush", "table", str(table), check=False)
    owners = _owners()
    owners.pop(str(table), None)
    _write_owners(owners)
    if not any(p in RULE_PREFS for p in _prefs_in_use()):      # no drop left: `local` first again
        if 0 not in _prefs_in_use():
            _ip("rule", "add", "pref", "0", "table", "local")
        _ip("rule", "del", "pref", str(LOCAL_PREF), check=False)


def _owners() -> dict:
    try:
        with open(OWNERS, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_owners(owners: dict) -> None:
    with open(OWNERS, "w", encoding="utf-8") as f:
        json.dump(owners, f)


def _clear_orphans() -> None:
    """The rules of a drop whose process was killed before it could take them away (a test timed out)."""
    for table, (pid, prefs) in _owners().items():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(int(table), prefs)
        except PermissionError:
            pass


def _prefs_in_use() -> set[int]:
    out = _ip("rule", "show").stdout
    return {int(line.split(":", 1)[0]) for line in out.splitlines() if line.split(":", 1)[0].isdigit()}
