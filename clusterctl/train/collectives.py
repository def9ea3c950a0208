"""Collectives the trainer needs that MLX 0.32.4 lacks on some backends, and the world-size check.

`reduce_scatter(x, group)` sums `x` over the group and returns this rank's 1/N block along axis 0. MLX's
native `mx.distributed.sum_scatter` exists only on nccl/jaccl ("[ring] sum_scatter not supported",
"[mpi] sum_scatter not yet implemented"; see docs/facts/mlx-distributed.md#sum-scatter-missing-on-ring-and-mpi),
so the first call on a group probes, once, which method works and caches it (`reduce_scatter_method(group)`
says which):

    "identity"  the group has one member
    "native"    mx.distributed.sum_scatter (lazy, compiles, uses the communication stream)
    "mpi4py"    MPI_Reduce_scatter_block through mpi4py on a duplicate of the MPI communicator behind the
                group (COMM_WORLD for the world group; `split_group` registers the communicators of split
                groups). Eager: it evaluates its input, so keep it out of mx.compile.
    "all_sum"   (ring; anything else) below SENDRECV_MIN_BYTES all_sum then slice, twice the traffic of a
                real reduce-scatter; from there on `ring_reduce_scatter`, send/recv around the ring (faster
                from about 1 MiB: benchmarks/RESULTS.md#zero3-a-model-bigger-than-one-host-and-the-memory-estimate-2026-11-25)

mpi4py is imported only under an MPI launcher and only after MLX initialised MPI, with
`mpi4py.rc.initialize = rc.finalize = False` (importing it first makes MPI initialise twice; see
docs/facts/mlx-distributed.md#mpi4py-after-mlx). Every probe decision is agreed by all ranks through an MLX all_sum,
so no rank can pick a different method and deadlock the others.
"""
from __future__ import annotations

import atexit
import os

import mlx.core as mx

from clusterctl.errors import WorldSizeMismatch

METHODS = ("identity", "native", "mpi4py", "all_sum")
SENDRECV_MIN_BYTES = 1 << 20

# id(group) -> (group, method, mpi communicator or None). The group is held so its id stays unique.
_PROBED: dict[int, tuple] = {}
# id(split group) -> (group, mpi4py communicator) registered by split_group, probed later.
_SPLIT_COMMS: dict[int, tuple] = {}
_WORLD: list = []
_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
_MPI_TYPE_NAMES = {mx.float32: "FLOAT", mx.float64: "DOUBLE", mx.int32: "INT32_T", mx.int64: "INT64_T",
                   mx.uint32: "UINT32_T", mx.uint64: "UINT64_T"}
_BUFFER_FORMATS = {mx.float32: "f", mx.float64: "d", mx.int32: "i", mx.int64: "q", mx.uint32: "I",
                   mx.uint64: "Q"}


def init_world(backend: str = "any", expected: int | None = None) -> mx.distributed.Group:
    """`mx.distributed.init(backend)`, failing loudly unless its size is the launcher's world size.

    `expected` defaults to CLUSTERCTL_WORLD_SIZE (set by `clusterctl run`); with neither, any size goes.
    Under mpirun, MLX quietly returns a group of one on every rank when it cannot load libmpi, and each
    rank would train alone; this is the check that catches it (docs/facts/mlx-distributed.md#world-of-one-fallback).
    """
    if expected is None and os.environ.get("CLUSTERCTL_WORLD_SIZE"):
        try:
            expected = int(os.environ["CLUSTERCTL_WORLD_SIZE"])
        except ValueError:
            raise WorldSizeMismatch(f"CLUSTERCTL_WORLD_SIZE={os.environ['CLUSTERCTL_WORLD_SIZE']!r} "
                                    "is not an integer") from None
    # MLX finds libmpi through MLX_MPI_LIBNAME or the loader's path (docs/facts/mlx-distributed.md#mlx-mpi-libname).
    hint = (" (under mpirun MLX could not load libmpi: set MLX_MPI_LIBNAME or LD_LIBRARY_PATH/"
            "DYLD_FALLBACK_LIBRARY_PATH; `clusterctl doctor` checks it)")
    try:    # strict: raise instead of falling back to a world of one (docs/facts/mlx-distributed.md#strict-init-raises)
        group = mx.distributed.init(backend=backend, strict=expected is not None and expected > 1)
    except RuntimeError as e:
        raise WorldSizeMismatch(f"mx.distributed.init(backend={backend!r}) could not form the world of "
                                f"{expected} the launcher started: {e}{hint if _under_mpirun() else ''}") from None
    if expected is not None and group.size() != expected:
        raise WorldSizeMismatch(f"mx.distributed.init(backend={backend!r}) gave a world of {group.size()}, "
                                f"the launcher started {expected}{hint if group.size() == 1 else ''}")
    _WORLD[:] = [group]
    return group


def world_group() -> mx.distributed.Group:
    """The world group, created once (init() makes a new Python object per call; caches key on it)."""
    if not _WORLD:
        _WORLD.append(mx.distributed.init())
    return _WORLD[0]


def split_group(group: mx.distributed.Group, color: int, key: int = -1) -> mx.distributed.Group:
    """`group.split(color, key)` that also splits the MPI communicator behind `group` when there is one,
    so the split group can use MPI's reduce-scatter. Collective over `group`, like the split itself.
    (Only the mpi backend can split in MLX 0.32.4; ring raises "[ring] Group split not supported": see
    docs/facts/mlx-distributed.md#group-split-mpi-only.)"""
    sub = group.split(color, key)
    method, comm = _probe(group)
    if method == "mpi4py":
        sub_comm = comm.Split(color, group.rank() if key < 0 else key)
        _SPLIT_COMMS[id(sub)] = (sub, sub_comm)
    return sub


def reduce_scatter_method(group: mx.distributed.Group | None = None) -> str:
    """Which of METHODS `reduce_scatter` uses on `group` (probing it on first use)."""
    return _probe(group if group is not None else world_group())[0]


def reduce_scatter(x: mx.array, group: mx.distributed.Group | None = None, stream=None) -> mx.array:
    """Sum `x` over `group` and return this rank's block: rows [r*k, (r+1)*k) with k = x.shape[0] / N.

    x.shape[0] must be divisible by the group size. Float16/bfloat16 go through MPI as float32 (MPI has
    no half types) and come back in their own dtype.
    """
    group = group if group is not None else world_group()
    n = group.size()
    if x.ndim == 0 or x.shape[0] % n:
        raise ValueError(f"reduce_scatter: first dimension of shape {tuple(x.shape)} is not divisible by "
                         f"the group size {n}")
    method, comm = _probe(group)
    if method == "identity":
        return x
    if method == "native":
        return mx.distributed.sum_scatter(x, group=group, stream=stream)
    if method == "mpi4py":
        return _mpi_reduce_scatter(x, comm, n)
    if x.nbytes >= SENDRECV_MIN_BYTES:
        return ring_reduce_scatter(x, group)
    rows = x.shape[0] // n
    r = group.rank()
    return mx.distributed.all_sum(x, group=group, stream=stream)[r * rows:(r + 1) * rows]


def ring_reduce_scatter(x: mx.array, group) -> mx.array:
    """Reduce-scatter around the ring with send/recv: N - 1 steps, each rank passing a running sum of one
    block to the next rank and adding its own block to what the previous rank passed; each link carries
    (N - 1)/N of x once, against all_sum's twice, and no rank ever holds the summed whole. Even ranks send
    before they receive and odd ones receive first, so no two neighbours both wait on a send (measured: both
    sending first hangs the ring backend). Evaluates as it goes (one step at a time)."""
    n, r = group.size(), group.rank()
    # x first, on every rank: a collective inside its lazy graph (zero3's gather) would otherwise run on a
    # rank while its odd neighbour already waits in recv for it, and neither would return (measured: a hang)
    mx.eval(x)
    rows = x.shape[0] // n
    block = [x[i * rows:(i + 1) * rows] for i in range(n)]
    after, before = (r + 1) % n, (r - 1) % n
    running = block[before]
    for step in range(n - 1):
        if r % 2 == 0:
            mx.eval(mx.distributed.send(running, after, group=group))
            got = mx.distributed.recv_like(running, before, group=group)
            mx.eval(got)
        else:
            got = mx.distributed.recv_like(running, before, group=group)
            mx.eval(got)
            mx.eval(mx.distributed.send(running, after, group=group))
        running = got + block[(r - step - 2) % n]
    return running


def _probe(group) -> tuple:
    cached = _PROBED.get(id(group))
    if cached is not None and cached[0] is group:
        return cached[1], cached[2]
    method, comm = _choose(group)
    _PROBED[id(group)] = (group, method, comm)
    return method, comm


def _choose(group) -> tuple:
    n = group.size()
    if n == 1:
        return "identity", None
    # Every rank sends 1..n; rank r must get back n*(r+1). That also catches a communicator whose rank
    # order differs from the MLX group's.
    probe = mx.arange(1, n + 1, dtype=mx.float32)
    expected = float(n * (group.rank() + 1))
    try:
        got = mx.distributed.sum_scatter(probe, group=group)
        mx.eval(got)
        native_ok = got.shape == (1,) and got.item() == expected
    except RuntimeError:    # "[ring] sum_scatter not supported", "[mpi] sum_scatter not yet implemented"
        native_ok = False
    if _everyone(group, native_ok):
        return "native", None
    comm = _candidate_comm(group)
    if _everyone(group, comm is not None):
        comm = comm.Dup()       # our own context: MPI collectives never interleave with MLX's
        try:
            ok = _mpi_reduce_scatter(probe, comm, n).item() == expected
        except Exception:       # noqa: BLE001 — any MPI failure means "not this method"; agreed below
            ok = False
        if _everyone(group, ok):
            return "mpi4py", comm
        comm.Free()
    return "all_sum", None


def _everyone(group, flag: bool) -> bool:
    return mx.distributed.all_sum(mx.array(int(flag)), group=group).item() == group.size()


def _mpi():
    """mpi4py's MPI module when MLX has initialised MPI in this process, else None (never initialises
    MPI itself, and never loads libmpi outside an MPI launch)."""
    if not _under_mpirun():
        return None
    try:
        import mpi4py
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI if MPI.Is_initialized() and not MPI.Is_finalized() else None


def _under_mpirun() -> bool:
    return any(v in os.environ for v in _MPI_LAUNCHER_VARS)


def _candidate_comm(group):
    registered = _SPLIT_COMMS.get(id(group))
    if registered is not None and registered[0] is group:
        return registered[1]
    MPI = _mpi()
    if MPI is None or MPI.COMM_WORLD.Get_size() != group.size() or MPI.COMM_WORLD.Get_rank() != group.rank():
        return None
    return MPI.COMM_WORLD


def _mpi_reduce_scatter(x: mx.array, comm, n: int) -> mx.array:
    from mpi4py import MPI
    dtype = x.dtype
    work = x.astype(mx.float32) if dtype in (mx.float16, mx.bfloat16) else x
    if work.dtype not in _MPI_TYPE_NAMES:
        raise ValueError(f"reduce_scatter over MPI: unsupported dtype {dtype}")
    work = mx.contiguous(work)
    mx.eval(work)
    mpi_type = getattr(MPI, _MPI_TYPE_NAMES[work.dtype])
    received = bytearray(work.nbytes // n)
    comm.Reduce_scatter_block([memoryview(work).cast("B"), mpi_type], [received, mpi_type], op=MPI.SUM)
    out = mx.array(memoryview(received).cast(_BUFFER_FORMATS[work.dtype]))
    return out.reshape((x.shape[0] // n,) + tuple(x.shape[1:])).astype(dtype)


@atexit.register
def _release():
    # MLX finalises MPI at exit; a split group or a communicator still alive then makes every rank abort
    # with "MPI_Comm_free() was called after MPI_FINALIZE" (measured, mlx 0.32.4). Python's atexit runs
    # before that, so drop them here (docs/facts/mlx-distributed.md#free-mpi-objects-before-exit).
    for _group, method, comm in list(_PROBED.values()):
        if method == "mpi4py":
            comm.Free()
    for _group, comm in list(_SPLIT_COMMS.values()):
        comm.Free()
    _PROBED.clear()
    _SPLIT_COMMS.clear()
    _WORLD.clear()
