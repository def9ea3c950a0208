"""A run's rank logs (runs/<id>/rank-N.log), one rank or all of them merged in time order, and following
a live run as `tail -f` would until the run ends.

    lines, timed = read_logs(info, rank=None, pattern=re.compile("loss"))
    for line in follow_logs(info): ...        # the lines so far, then new ones until the run has ended

The logs carry no timestamps (the supervisor writes each line as it arrives, as the rank printed it). The
time of a line comes from log-times.jsonl (record.py): samples of every rank log's size taken while the run
ran; a line is dated by the first sample whose size covers its end, so the merge is right to within
record.SAMPLE_S. Lines of one sample are ordered by rank, each rank's lines keep their file order. A run
made before log-times.jsonl existed is shown rank after rank (`timed` is False). Following needs no dates:
new lines are shown as they arrive.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from .record import LOG_TIMES, SUMMARY
from .runs import RunInfo, run_alive

POLL_S = 0.2


@dataclass(frozen=True)
class LogLine:
    rank: int
    host: str
    text: str
    t: float | None = None        # seconds since the epoch, to within record.SAMPLE_S; None: unknown


def rank_hosts(run_dir: str) -> dict[int, str]:
    """rank -> host, from launch.json; without one, every rank-N.log there with host '?'."""
    try:
        with open(os.path.join(run_dir, "launch.json"), encoding="utf-8", errors="replace") as f:
            hosts = json.load(f).get("rank_hosts") or []
        if isinstance(hosts, list) and hosts:       # a damaged launch.json is read as if it were not there
            return {r: h if isinstance(h, str) else "?" for r, h in enumerate(hosts)}
    except (OSError, ValueError, AttributeError):
        pass
    ranks = sorted(int(m.group(1)) for n in os.listdir(run_dir) if (m := re.fullmatch(r"rank-(\d+)\.log", n)))
    return {r: "?" for r in ranks}


def split_lines(data: bytes) -> tuple[list[tuple[int, str]], int]:
    """Complete lines of `data` as (offset just past the line's newline, text), and the length of what they
    cover (a partial last line is left for later). Pure."""
    lines, start = [], 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            return lines, start
        lines.append((end + 1, data[start:end].decode("utf-8", errors="replace")))
        start = end + 1


def read_samples(run_dir: str) -> list[tuple[float, list[int]]]:
    samples = []
    try:
        with open(os.path.join(run_dir, LOG_TIMES), encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    record = json.loads(line)
                    samples.append((float(record["t"]), [int(s) for s in record["sizes"]]))
                except (ValueError, KeyError, TypeError, OverflowError):
                    continue
    except OSError:
        pass
    return samples


def merge(per_rank: dict[int, list[tuple[int, str]]], hosts: dict[int, str],
          samples: list[tuple[float, list[int]]]) -> list[LogLine]:
    """Every rank's (end offset, text) lines in time order, dated by the size samples (pure). A line no
    sample covers (written after the last) sorts last, undated."""
    dated = []
    for rank, lines in per_rank.items():
        k = 0
        for index, (end, text) in enumerate(lines):
            while k < len(samples) and (rank >= len(samples[k][1]) or samples[k][1][rank] < end):
                k += 1
            t = samples[k][0] if k < len(samples) else None
            dated.append((float("inf") if t is None else t, rank, index, LogLine(rank, hosts.get(rank, "?"), text, t)))
    dated.sort(key=lambda d: d[:3])
    return [d[3] for d in dated]


def _read_rank(run_dir: str, rank: int) -> list[tuple[int, str]]:
    try:
        with open(os.path.join(run_dir, f"rank-{rank}.log"), "rb") as f:
            return split_lines(f.read())[0]
    except FileNotFoundError:
        return []


def read_logs(info: RunInfo, rank: int | None = None, pattern: re.Pattern | None = None) -> tuple[list[LogLine], bool]:
    """(the lines of one rank, or of every rank merged in time order; whether they are dated)."""
    hosts = rank_hosts(info.dir)
    ranks = [rank] if rank is not None else sorted(hosts)
    samples = read_samples(info.dir)
    lines = merge({r: _read_rank(info.dir, r) for r in ranks}, hosts, samples)
    if pattern is not None:
        lines = [line for line in lines if pattern.search(line.text)]
    return lines, bool(samples)


def run_ended(run_dir: str) -> bool:
    """summary.json is there, or the `clusterctl run` process is gone (None, unknown, counts as running)."""
    return os.path.exists(os.path.join(run_dir, SUMMARY)) or run_alive(run_dir) is False


def follow_logs(info: RunInfo, rank: int | None = None, pattern: re.Pattern | None = None, *,
                poll_s: float = POLL_S, ended: Callable[[str], bool] = run_ended) -> Iterator[LogLine]:
    """The lines so far (merged as read_logs merges them), then every new complete line as it arrives,
    until the run has ended and its logs are read to the end."""
    hosts = rank_hosts(info.dir)
    ranks = [rank] if rank is not None else sorted(hosts)
    offsets = {r: 0 for r in ranks}

    def new_lines() -> dict[int, list[tuple[int, str]]]:
        found = {}
        for r in ranks:
            try:
                with open(os.path.join(info.dir, f"rank-{r}.log"), "rb") as f:
                    f.seek(offsets[r])
                    lines, used = split_lines(f.read())
            except FileNotFoundError:
                continue
            found[r] = [(offsets[r] + end, text) for end, text in lines]
            offsets[r] += used
        return found

    first = merge(new_lines(), hosts, read_samples(info.dir))
    yield from (line for line in first if pattern is None or pattern.search(line.text))
    while True:
        over = ended(info.dir)          # asked before reading: what was written before the end is read
        for r, lines in new_lines().items():
            for _, text in lines:
                if pattern is None or pattern.search(text):
                    yield LogLine(r, hosts.get(r, "?"), text, time.time())
        if over:
            return
        time.sleep(poll_s)
