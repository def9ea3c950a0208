"""Pure parts of `clusterctl bench`: message sizes, bandwidth arithmetic, the worker's result line, tables.

Bandwidths follow nccl-tests' conventions, so figures compare with what users know:
    algbw = bytes / time
    busbw = algbw * 2(N-1)/N   for all_sum (each byte crosses the busiest link 2(N-1)/N times)
    busbw = algbw * (N-1)/N    for all_gather, whose `bytes` is the gathered output (1/N from each rank)
busbw is the figure to compare with a link's speed, and across world sizes.
"""
from __future__ import annotations

import json
import re

from ..errors import BenchError, SizesError

RESULT_MARK = "CLUSTERCTL_BENCH_RESULT "   # rank 0's result line: this + one JSON document

UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
MAX_BYTES = 4 * 1024**3
GB = 1e9


_SIZE = re.compile(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*\Z", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'64M' -> 67108864; K, M, G are binary (KiB, MiB, GiB); a plain number is bytes."""
    m = _SIZE.match(text)
    if not m:
        raise SizesError(f"size {text.strip()!r} is not a number of bytes with an optional K, M or G (e.g. 64M)")
    value = int(m.group(1)) * UNITS[m.group(2).upper()]
    if not 4 <= value <= MAX_BYTES:
        raise SizesError(f"size {text.strip()!r} must be from 4 bytes (one float32) to 4G")
    return value


def parse_sizes(text: str) -> list[int]:
    """'1K..1G' -> every power of two from 1 KiB to 1 GiB; '1K,64M' -> those; both may mix: '1K..1M,64M'.
    Sorted, without repeats."""
    sizes: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            raise SizesError(f"empty size in {text!r}")
        if ".." in part:
            low_text, _, high_text = part.partition("..")
            low, high = parse_size(low_text), parse_size(high_text)
            if low > high:
                raise SizesError(f"range {part.strip()!r} runs backwards")
            size = low
            while size <= high:
                sizes.add(size)
                size *= 2
        else:
            sizes.add(parse_size(part))
    return sorted(sizes)


def format_bytes(n: int) -> str:
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B" if n < 1024 else f"{n / 1024:.1f}K"


def bus_factor(op: str, world: int) -> float:
    if op == "all_sum":
        return 2 * (world - 1) / world
    if op == "all_gather":
        return (world - 1) / world
    raise ValueError(f"unknown collective {op!r}")


def algbw(nbytes: int, seconds: float) -> float:
    """Bytes per second (0 when the time is not positive: a rank reported nothing)."""
    return nbytes / seconds if seconds > 0 else 0.0


def busbw(op: str, nbytes: int, seconds: float, world: int) -> float:
    return algbw(nbytes, seconds) * bus_factor(op, world)


def parse_result(log_text: str) -> dict:
    """The worker's result: the last RESULT_MARK line of rank 0's output (a pty may put text before it)."""
    for line in reversed(log_text.splitlines()):
        at = line.find(RESULT_MARK)
        if at >= 0:
            try:
                result = json.loads(line[at + len(RESULT_MARK):])
            except ValueError as e:
                raise BenchError(f"rank 0 printed a damaged result line ({e})") from None
            if not isinstance(result, dict) or not isinstance(result.get("world"), int):
                raise BenchError("rank 0's result line has no world size")
            return result
    raise BenchError("rank 0 finished without printing a result")


def collective_rows(result: dict) -> list[dict]:
    """One row per (op, impl, size) with time and both bandwidths, in the worker's order."""
    world = result["world"]
    rows = []
    for r in result.get("collectives", []):
        rows.append({**r, "algbw_gbs": algbw(r["bytes"], r["time_s"]) / GB,
                     "busbw_gbs": busbw(r["op"], r["bytes"], r["time_s"], world) / GB})
    return rows


def render_table(rows: list[dict]) -> str:
    """Per op, one line per size: MLX time/algbw/busbw, and mpi4py's busbw and MLX's share of it when
    measured."""
    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        raw = {r["bytes"]: r for r in mine if r["impl"] == "mpi4py"}
        header = f"{'size':>6} {'time/op':>10} {'algbw GB/s':>10} {'busbw GB/s':>10} {'iters':>5}"
        if raw:
            header += f" {'mpi4py busbw':>12} {'mlx/mpi4py':>10}"
        out += [f"{op}:", header]
        for r in mine:
            if r["impl"] != "mlx":
                continue
            line = (f"{format_bytes(r['bytes']):>6} {format_seconds(r['time_s']):>10} {r['algbw_gbs']:>10.3f} "
                    f"{r['busbw_gbs']:>10.3f} {r['iters']:>5}")
            if r["bytes"] in raw:
                other = raw[r["bytes"]]["busbw_gbs"]
                line += f" {other:>12.3f} {r['busbw_gbs'] / other if other else 0.0:>10.2f}"
            out.append(line)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def format_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def p2p_pairs(rank_hosts: list[str], neighbours_only: bool) -> list[tuple[int, int]]:
    """Directed (src rank, dst rank) pairs, one per ordered pair of hosts. Usually every pair, between each
    host's first rank. With `neighbours_only` (MLX's ring sends only to a rank's two neighbours, see
    docs/facts/mlx-distributed.md#ring-sends-to-neighbours-only) the pairs are the ring's own links between hosts
    (the cables a ring of Thunderbolt hosts really uses)."""
    hosts = list(dict.fromkeys(rank_hosts))
    first = {h: rank_hosts.index(h) for h in hosts}
    if not neighbours_only:
        return [(first[a], first[b]) for a in hosts for b in hosts if a != b]
    pairs, seen, n = [], set(), len(rank_hosts)
    for r in range(n):
        for src, dst in ((r, (r + 1) % n), ((r + 1) % n, r)):
            key = (rank_hosts[src], rank_hosts[dst])
            if key[0] != key[1] and key not in seen:
                seen.add(key)
                pairs.append((src, dst))
    return pairs


def p2p_matrix(result: dict, rank_hosts: list[str]) -> dict:
    """{"hosts": [...], "matrix": GB/s [row = sender][column = receiver], None where not measured}."""
    hosts = list(dict.fromkeys(rank_hosts))
    index = {h: i for i, h in enumerate(hosts)}
    matrix: list[list[float | None]] = [[None] * len(hosts) for _ in hosts]
    for p in result.get("p2p", []):
        src, dst = index[rank_hosts[p["src"]]], index[rank_hosts[p["dst"]]]
        matrix[src][dst] = algbw(p["bytes"], p["time_s"]) / GB
    return {"hosts": hosts, "matrix": matrix}


def render_matrix(p2p: dict) -> str:
    hosts, matrix = p2p["hosts"], p2p["matrix"]
    width = max([9] + [len(h) for h in hosts])
    lines = ["GB/s, sender (row) -> receiver (column)",
             " " * width + " " + " ".join(h.rjust(width) for h in hosts)]
    for i, h in enumerate(hosts):
        cells = ["-" if i == j else ("n/a" if v is None else f"{v:.3f}") for j, v in enumerate(matrix[i])]
        lines.append(h.ljust(width) + " " + " ".join(c.rjust(width) for c in cells))
    measured = sorted((v, hosts[i], hosts[j]) for i, row in enumerate(matrix) for j, v in enumerate(row)
                      if i != j and v is not None)
    if len(measured) > 1:
        slow, median = measured[0], measured[len(measured) // 2][0]
        lines.append(f"slowest link: {slow[1]} -> {slow[2]} at {slow[0]:.3f} GB/s "
                     f"({slow[0] / median if median else 0:.2f}x the median link)")
    if any(v is None for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j):
        lines.append("n/a: not a link of the ring (ring ranks send only to their two neighbours; "
                     "--backend mpi measures every pair)")
    return "\n".join(lines) + "\n"
