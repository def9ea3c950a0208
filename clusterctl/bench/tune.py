"""`clusterctl bench --tune`: find the transport settings with the highest all_sum bus bandwidth.

    mpi   btl_tcp_links in {1, 2, 4, 8} on the current interface (the plan's subnet, or MPI's own choice),
          then the best count on every other subnet all hosts share (distinct addresses, not loopback):
          a coordinate search, 4 + (subnets - 1) launches instead of their product.
    ring  connections_per_ip in {1, 2, 4, 8}. The ring's addresses are the hosts' `address:` keys, one per
          host; tuning does not rewrite those.

A candidate that fails is reported, not fatal: an interface that leads nowhere makes MPI hang
(docs/facts/launchers.md#btl-tcp-if-include), and so does Open MPI 4.1.4's TCP btl with btl_tcp_links 8 here
(measured, from 256 KiB up; cf. ompi#4963; docs/facts/launchers.md#btl-tcp-links-8-hangs), so each launch
carries a deadline (4x the first healthy candidate's wall time, at least 15 s) after which its ranks give
up. With --write the winner is stored in the inventory by inventory_edit, which
changes that one value and nothing else.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import BenchAborted, BenchError
from ..hosts.facts import shared_subnets
from ..inventory_edit import write_setting
from ..launch import backends
from .measure import Bench

COUNTS = (1, 2, 4, 8)
MIN_DEADLINE_S = 15.0
TUNE_DEADLINE_S = 60.0   # per candidate: Open MPI 4.1's TCP btl can hang with many links (ompi#4963)


@dataclass
class Trial:
    setting: dict            # {"btl_tcp_links": 4, "if_include": "10.0.0.0/24"} or {"connections_per_ip": 2}
    busbw_gbs: float | None = None
    time_s: float | None = None
    error: str | None = None


def candidate_subnets(bench: Bench) -> list[str | None]:
    current = bench.plan.if_include
    group = bench.connector.run_everywhere("ip -o -4 addr show 2>/dev/null || ifconfig -a 2>/dev/null", 30)
    found = shared_subnets([o.value.stdout.splitlines() for o in group.values() if o.ok]) \
        if not group.failed else []
    return [current] + [s for s in found if s != current]


def tune(bench: Bench, nbytes: int, progress=lambda trial: None) -> tuple[list[Trial], Trial]:
    """Measure every candidate; (all trials in order, the winner). Raises BenchError if none ran."""
    cluster, backend = bench.cluster, backends.get(bench.backend)
    tuning = backend.tuning
    trials: list[Trial] = []
    deadline = [TUNE_DEADLINE_S]

    def measure(setting: dict) -> Trial:
        trial = Trial(setting)
        candidate = tuning.applied(cluster, setting)
        started = time.monotonic()
        try:
            result = bench.collectives([nbytes], ["all_sum"], mpi4py=False, cluster=candidate,
                                       if_include=setting.get("if_include"), deadline_s=deadline[0])
            row = result["rows"][0]
            trial.busbw_gbs, trial.time_s = row["busbw_gbs"], row["time_s"]
            if deadline[0] == TUNE_DEADLINE_S:
                # a healthy candidate's wall time sets the others' deadline: a hang costs seconds, not a minute
                deadline[0] = max(MIN_DEADLINE_S, 4 * (time.monotonic() - started))
        except BenchAborted:
            raise
        except BenchError as e:
            trial.error = str(e)
        trials.append(trial)
        progress(trial)
        return trial

    if tuning is None:
        raise BenchError(f"--tune has nothing to vary on the {backend.name} backend")
    key = tuning.count
    conflict = tuning.conflict(cluster)
    if conflict:
        raise BenchError(conflict)
    if tuning.subnets:
        subnets = candidate_subnets(bench)
        for count in COUNTS:
            measure({key: count, "if_include": subnets[0]})
        best = _best(trials)
        for subnet in subnets[1:]:
            measure({key: best.setting[key], "if_include": subnet})
    else:
        for count in COUNTS:
            measure({key: count})
    return trials, _best(trials)


def _best(trials: list[Trial]) -> Trial:
    ran = [t for t in trials if t.busbw_gbs is not None]
    if not ran:
        raise BenchError(f"every candidate failed; the first: {trials[0].error}")
    return max(ran, key=lambda t: t.busbw_gbs)


def describe(setting: dict) -> str:
    parts = []
    for key, value in setting.items():
        if key == "if_include":
            parts.append(f"if_include={value or '(MPI chooses)'}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def store(inventory_path: str, bench: Bench, winner: Trial) -> list[str]:
    """Write the winner into the inventory; returns what changed, as `section.key=value` strings."""
    changed = []
    for section, key, value in backends.get(bench.backend).tuning.inventory_lines(winner.setting, bench.plan):
        if write_setting(inventory_path, section, key, value):
            changed.append(f"{section}.{key}={value.strip(chr(34))}")
    return changed
