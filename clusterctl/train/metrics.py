"""What rank 0 prints and logs: one line per report interval, the same fields in <out>/metrics.jsonl.

Every rank takes part in a report (the peak-memory maximum is a collective), so all ranks call `report`
at the same steps; only rank 0 prints and writes. Under `clusterctl run` (CLUSTERCTL_RUN_ID set) every rank
also prints a metrics line (progress.py) with its own tokens/s and peak memory, for run's live panel.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

import mlx.core as mx

from ..atomic import write_text
from ..progress import report as live_report
from ..trainer_contract import report_line


def max_over_ranks(value: float, group) -> float:
    """The largest `value` on any rank, reduced on the CPU stream (no GPU work is queued behind it)."""
    if group.size() == 1:
        return value
    return mx.distributed.all_max(mx.array(value, dtype=mx.float32), group=group, stream=mx.cpu).item()


class Reporter:
    def __init__(self, out_dir: str, group, tokens_per_step, start_step: int):
        self.group = group
        self.is_main = group.rank() == 0
        self.path = os.path.join(out_dir, "metrics.jsonl")
        # global: batch x block x accum x world, or a function of the step (a fine-tune's records differ in length)
        self.tokens_per_step = tokens_per_step
        self.losses: list[mx.array] = []
        self.norms: list[mx.array] = []
        self.last_step = start_step
        self.last_time = time.perf_counter()
        self.live = bool(os.environ.get("CLUSTERCTL_RUN_ID"))
        self.shares: list[int] | None = None         # balancing on: rows of the global batch per rank
        if self.is_main:
            os.makedirs(out_dir, exist_ok=True)
            self._forget_after(start_step)

    def _forget_after(self, step: int) -> None:
        """On resume, drop lines a killed run logged past its checkpoint, so the file is one curve."""
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8") as f:
            kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
        write_text(self.path, "".join(kept))

    def add(self, loss: mx.array, grad_norm: mx.array) -> None:
        self.losses.append(loss)
        self.norms.append(grad_norm)

    def report(self, step: int, total_steps: int, lr: float) -> dict:
        """Mean loss and grad norm over the steps since the last report; global tokens/s over that span."""
        elapsed = time.perf_counter() - self.last_time
        own_peak_mb = mx.get_peak_memory() / 2**20
        peak_mb = max_over_ranks(own_peak_mb, self.group)
        record = {
            "step": step,
            "loss": mx.stack(self.losses).mean().item(),
            "lr": lr,
            "tokens_per_s": self.tokens(self.last_step, step) / max(elapsed, 1e-9),
            "peak_mem_mb": peak_mb,
            "grad_norm": mx.stack(self.norms).mean().item(),
        }
        if self.shares is not None:
            record["shares"] = list(self.shares)
        self.losses, self.norms = [], []
        self.last_step, self.last_time = step, time.perf_counter()
        if self.is_main:
            print(report_line(step, total_steps, loss=record["loss"], lr=lr, tokens_per_s=record["tokens_per_s"],
                              peak_mb=peak_mb, grad_norm=record["grad_norm"]), flush=True)
            self.write(record)
        if self.live:
            share = self.shares[self.group.rank()] / sum(self.shares) if self.shares else 1 / self.group.size()
            live_report(step=step, total_steps=total_steps, loss=record["loss"],
                        tokens_per_s=record["tokens_per_s"] * share, peak_mem_mb=own_peak_mb, share=share)
        return record

    def tokens(self, after: int, upto: int) -> int:
        """Every rank's tokens in optimizer steps after+1 .. upto."""
        if callable(self.tokens_per_step):
            return sum(self.tokens_per_step(s) for s in range(after, upto))
        return self.tokens_per_step * (upto - after)

    def evaluation(self, step: int, val_loss: float) -> None:
        if self.is_main:
            print(f"step {step} | held-out loss {val_loss:.4f}", flush=True)
            self.write({"step": step, "val_loss": val_loss})
            if self.live:       # the dashboard's held-out curve (runs/<id>/rank-metrics.jsonl)
                live_report(step=step, val_loss=val_loss)

    @contextmanager
    def paused(self):
        """Time spent inside (evaluation, checkpoints) does not count against training throughput."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.last_time += time.perf_counter() - start

    def write(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
