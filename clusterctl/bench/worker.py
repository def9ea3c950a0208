"""What every rank of `clusterctl bench` runs: `python -m clusterctl.bench.worker SPEC_JSON`.

Needs only the standard library and mlx (and mpi4py for the raw-MPI comparison under mpirun), so it runs
wherever a rank can import it. Rank 0 prints the measurements as one line, RESULT_MARK + JSON; the
controller (clusterctl.bench.measure) computes bandwidths from it.

SPEC_JSON: {"backend": "mpi"|"ring", "ops": ["all_sum", "all_gather"], "sizes": [bytes, ...],
            "mpi4py": bool, "budget_s": seconds per size and implementation, "max_iters": int,
            "deadline_s": the rank exits 124 if it is still running then (a tune candidate whose
                          interface leads nowhere must not hang the tuning),
            "p2p": null | {"bytes": int, "pairs": [[src_rank, dst_rank], ...], "iters": int}}

Timing, as nccl-tests does it: ops run back to back (mx.eval blocks until each collective is done) in
loops timed as a whole after a warm-up op; a size's time per op is the median of SAMPLES loops, from the
slowest rank; MLX's and mpi4py's loops alternate. How many ops a loop holds adapts to the size (the budget)
and is agreed by all ranks (all_max of each rank's estimate), so no rank waits in a collective the others skipped.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time

import mlx.core as mx

from clusterctl.bench.report import RESULT_MARK
from clusterctl.errors import EXIT_TIMEOUT

WARMUP = 1
SAMPLES = 3


def init(backend: str):
    # strict: MLX raises instead of quietly giving every rank a world of one (docs/facts/mlx-distributed.md#strict-
    # init-raises, #world-of-one-fallback); the size check catches a launcher and MLX that disagree anyway
    try:
        group = mx.distributed.init(backend=backend, strict=True)
    except RuntimeError as e:
        sys.exit(f"bench: MLX could not start its {backend} backend: {e} (under mpirun: MLX could not load "
                 "libmpi; `clusterctl doctor` checks it)")
    expected = os.environ.get("CLUSTERCTL_WORLD_SIZE")
    if expected and group.size() != int(expected):
        sys.exit(f"bench: MLX formed a world of {group.size()}, the launcher started {expected} "
                 "(`clusterctl doctor` checks the hosts)")
    return group


def agree_max(value: float, group) -> float:
    out = mx.distributed.all_max(mx.array([value], dtype=mx.float32), group=group)
    return out.item()


def barrier(group) -> None:
    mx.eval(mx.distributed.all_sum(mx.zeros((1,)), group=group))


def mlx_op(op: str, x, group):
    if op == "all_sum":
        return lambda: mx.eval(mx.distributed.all_sum(x, group=group))
    return lambda: mx.eval(mx.distributed.all_gather(x, group=group))


def mpi4py_op(op: str, x, comm, world: int):
    from mpi4py import MPI

    send = memoryview(x)                     # the very buffer MLX reduces: no copy, same bytes
    if op == "all_sum":
        recv = bytearray(x.nbytes)
        return lambda: comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
    recv = bytearray(x.nbytes * world)
    return lambda: comm.Allgather([send, MPI.FLOAT], [recv, MPI.FLOAT])


def loop_length(run, group, budget_s: float, max_iters: int) -> int:
    """Ops per timed loop, from a warm-up op; agreed by all ranks (the largest estimate wins)."""
    start = time.perf_counter()
    for _ in range(WARMUP):
        run()
    estimate = (time.perf_counter() - start) / WARMUP
    per_loop = int(min(max_iters, max(1, budget_s / SAMPLES / max(estimate, 1e-6))))
    return int(agree_max(float(per_loop), group))


def timed_loop(run, group, length: int) -> float:
    barrier(group)
    t = time.perf_counter()
    for _ in range(length):
        run()
    return (time.perf_counter() - t) / length


def timed(impls: list, group, budget_s: float, max_iters: int) -> list[tuple[float, int]]:
    """Per implementation (seconds per op, ops timed): SAMPLES loops of back-to-back ops, each loop's time
    over its length; the median loop, from the slowest rank. The implementations' loops alternate, so a
    burst of load on this shared machine hits both sides of a comparison alike."""
    lengths = [loop_length(run, group, budget_s, max_iters) for run in impls]
    samples: list[list[float]] = [[] for _ in impls]
    for _ in range(SAMPLES):
        for k, run in enumerate(impls):
            samples[k].append(timed_loop(run, group, lengths[k]))
    return [(agree_max(statistics.median(samples[k]), group), SAMPLES * lengths[k]) for k in range(len(impls))]


def collectives(spec: dict, group, comm) -> list[dict]:
    world = group.size()
    rows = []
    for op in spec["ops"]:
        for size in spec["sizes"]:
            # all_sum reduces `size` bytes; all_gather's `size` is its output, 1/world from each rank
            elems = max(1, size // 4) if op == "all_sum" else max(1, size // 4 // world)
            x = mx.ones((elems,), dtype=mx.float32)
            mx.eval(x)
            nbytes = x.nbytes if op == "all_sum" else x.nbytes * world
            impls = {"mlx": mlx_op(op, x, group)}
            if comm is not None:
                impls["mpi4py"] = mpi4py_op(op, x, comm, world)
            for impl, (seconds, iters) in zip(impls, timed(list(impls.values()), group, spec["budget_s"],
                                                          spec["max_iters"])):
                rows.append({"op": op, "impl": impl, "bytes": nbytes, "iters": iters, "time_s": seconds})
            if group.rank() == 0:
                print(f"{op} {nbytes} bytes done", file=sys.stderr, flush=True)
    return rows


def point_to_point(spec: dict, group) -> list[dict]:
    """One directed pair at a time, every other rank idle at the barrier: src sends `iters` buffers to
    dst, dst times them. Every rank's figures meet in one all_sum at the end."""
    p2p = spec["p2p"]
    me, pairs = group.rank(), p2p["pairs"]
    x = mx.ones((max(1, p2p["bytes"] // 4),), dtype=mx.float32)
    mx.eval(x)
    seconds = [0.0] * len(pairs)
    for k, (src, dst) in enumerate(pairs):
        barrier(group)
        if me == src:
            mx.eval(mx.distributed.send(x, dst, group=group))       # warm-up: the connection, the buffers
            for _ in range(p2p["iters"]):
                mx.eval(mx.distributed.send(x, dst, group=group))
        elif me == dst:
            mx.eval(mx.distributed.recv_like(x, src, group=group))
            t = time.perf_counter()
            for _ in range(p2p["iters"]):
                mx.eval(mx.distributed.recv_like(x, src, group=group))
            seconds[k] = time.perf_counter() - t
    total = mx.distributed.all_sum(mx.array(seconds or [0.0], dtype=mx.float32), group=group).tolist()
    return [{"src": src, "dst": dst, "bytes": x.nbytes * p2p["iters"], "time_s": total[k]}
            for k, (src, dst) in enumerate(pairs)]


def watchdog(seconds: float) -> None:
    def expire():
        time.sleep(seconds)
        print(f"bench: still running after {seconds:g}s; giving up", file=sys.stderr, flush=True)
        # MLX has no timeout of its own (docs/facts/mlx-distributed.md#ring-all-sum-can-deadlock)
        os._exit(EXIT_TIMEOUT)     # a rank stuck in a collective cannot be unwound; the launcher stops the rest

    threading.Thread(target=expire, daemon=True).start()


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    if spec.get("deadline_s"):
        watchdog(float(spec["deadline_s"]))
    group = init(spec["backend"])
    comm = None
    # the spec asks for mpi4py only on a backend that can time it (launch/backends/: a Backend's mpi4py_reference)
    if spec.get("mpi4py") and group.size() > 1:
        # after MLX initialised MPI, and told not to initialise (or finalise) it again: see
        # docs/facts/mlx-distributed.md#mpi4py-after-mlx
        import mpi4py
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        from mpi4py import MPI
        comm = MPI.COMM_WORLD.Dup()
    result = {"world": group.size(), "backend": spec["backend"], "hostname": os.uname().nodename}
    if spec.get("p2p"):
        result["p2p"] = point_to_point(spec, group)
    else:
        result["collectives"] = collectives(spec, group, comm)
    if comm is not None:
        comm.Free()
    if group.rank() == 0:
        print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
