"""The few lines every rank runs before the user's script, passed as `python -c BOOTSTRAP ...`.

It needs nothing but the standard library (hosts need not have clusterctl installed) and sits between the
launcher and the script without a shell (macOS SIP would strip DYLD_* through /bin/sh, see
docs/macos.md#sip-strips-dyld). It:
  - re-emits every line the rank writes on fd 1 and 2 (C extensions included) tagged with rank and stream,
    so one parser serves mpirun and mlx.launch alike (the rank: OMPI_COMM_WORLD_RANK or MLX_RANK, see
    docs/launchers.md#mlx-launch-rank-environment);
  - sends a heartbeat every HEARTBEAT seconds from a thread of the rank itself: a stopped or wedged process
    stops beating, a busy one does not (nor one blocked in a collective, see
    docs/mlx-distributed.md#ring-all-sum-can-deadlock);
  - changes to its host's working directory (one per rank when the hosts' workdirs differ; ~ expanded on
    the host; created if missing), puts <workdir>/.clusterctl/lib (where `run` ships clusterctl itself for
    the bundled trainer) on sys.path when it exists, runs the script as
    __main__ with its arguments (or, when the script is "-m", the module named by the first argument, as
    `python -m` would, with the working directory first on sys.path), and reports the exit code (the
    launcher's own cannot be trusted: docs/launchers.md#mlx-launch-exit-status);
  - writes the files MLX reads by path (MLX_HOSTFILE, MLX_IBV_DEVICES) from CLUSTERCTL_ENV_FILES, a JSON
    object of variable -> file text that clusterctl's rank starter sets, into private temporary files it
    removes at the end, and points each variable at its file (docs/launchers.md#our-rank-starter);
  - under `mpirun -np 1`, finalises MPI, which MLX initialised but will not finalise
    (docs/mlx-distributed.md#mpi-world-of-one-not-finalized), through the libmpi MLX already loaded
    (MLX_MPI_LIBNAME or the default name: docs/mlx-distributed.md#mlx-mpi-libname).
Line format: MARK + "<rank> <kind> <payload>", kind in start | out | err | hb | exit.
"""

MARK = "\x1eclusterctl "

# The files MLX reads by path (MLX_HOSTFILE, MLX_IBV_DEVICES), written on the rank's host from
# CLUSTERCTL_ENV_FILES (variable -> text) into private temporary files; returns their paths, which the
# caller removes when the program is done. Shared by BOOTSTRAP and doctor's smoke program.
ENV_FILES = r'''
def env_files():
    import json, os, tempfile
    made = []
    for name, text in json.loads(os.environ.pop("CLUSTERCTL_ENV_FILES", "{}")).items():
        fd, path = tempfile.mkstemp(prefix="clusterctl-%s-" % name.lower())
        made.append(path)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.environ[name] = path
    return made
'''

BOOTSTRAP = ENV_FILES + r'''
import json, os, runpy, socket, sys, threading, time, traceback
run_id, workdir, beat, script, *args = sys.argv[1:]
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("MLX_RANK") or "0"
if workdir.startswith("["):
    workdir = json.loads(workdir)[int(rank)]
tag = ("\x1eclusterctl %s " % rank).encode()
real_out = os.fdopen(os.dup(1), "wb", buffering=0)
lock = threading.Lock()
def emit(kind, payload=b""):
    with lock:
        real_out.write(tag + kind.encode() + b" " + payload.replace(b"\r", b"") + b"\n")
emit("start", socket.gethostname().encode())
def pump(fd, kind):
    rest = b""
    with os.fdopen(fd, "rb", buffering=0) as f:
        for chunk in iter(lambda: f.read(65536), b""):
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                emit(kind, line)
    if rest:
        emit(kind, rest)
saved, pumps = {}, []
for fd, kind in ((1, "out"), (2, "err")):
    r, w = os.pipe()
    saved[fd] = os.dup(fd)
    os.dup2(w, fd)
    os.close(w)
    t = threading.Thread(target=pump, args=(r, kind), daemon=True)
    t.start()
    pumps.append(t)
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)
def heartbeat():
    while True:
        time.sleep(float(beat))
        emit("hb")
threading.Thread(target=heartbeat, daemon=True).start()
code = 0
made = []
try:
    made = env_files()
    wd = os.path.expanduser(workdir)
    os.makedirs(wd, exist_ok=True)
    os.chdir(wd)
    if not os.path.isabs(os.environ.get("CLUSTERCTL_RUN_DIR", "/")):
        os.environ["CLUSTERCTL_RUN_DIR"] = os.path.join(wd, os.environ["CLUSTERCTL_RUN_DIR"])
    lib = os.path.join(wd, ".clusterctl", "lib")
    if os.path.isdir(lib):
        sys.path.insert(0, lib)
    if script == "-m":
        module, *args = args
        sys.argv = [module, *args]
        sys.path.insert(0, wd)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        path = os.path.abspath(os.path.expanduser(script))
        sys.argv = [path, *args]
        sys.path.insert(0, os.path.dirname(path))
        runpy.run_path(path, run_name="__main__")
except SystemExit as e:
    if isinstance(e.code, int):
        code = e.code
    elif e.code is not None:
        print(e.code, file=sys.stderr)
        code = 1
except BaseException:
    traceback.print_exc()
    code = 1
sys.stdout.flush()
sys.stderr.flush()
for path in made:
    try:
        os.unlink(path)
    except OSError:
        pass
for fd, orig in saved.items():
    os.dup2(orig, fd)
for t in pumps:
    t.join(2)
if os.environ.get("OMPI_COMM_WORLD_SIZE") == "1":
    # MLX 0.32 leaves an MPI world of one initialised but never finalises it, and mpirun then fails the
    # job ("exiting improperly"). Finalise it here, through the libmpi MLX already loaded (never another).
    import ctypes
    for name in (os.environ.get("MLX_MPI_LIBNAME"), "libmpi.so.40", "libmpi.so", "libmpi.40.dylib", "libmpi.dylib"):
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD) if name else None
        except OSError:
            continue
        if lib is not None:
            up, down = ctypes.c_int(0), ctypes.c_int(0)
            lib.MPI_Initialized(ctypes.byref(up))
            lib.MPI_Finalized(ctypes.byref(down))
            if up.value and not down.value:
                lib.MPI_Finalize()
            break
# and whether this rank left anything in its run directory: rank 0's answer spares `run` a pointless fetch
try:
    wrote = any(True for _ in os.scandir(os.environ.get("CLUSTERCTL_RUN_DIR") or "/nonexistent"))
except OSError:
    wrote = False
emit("exit", ("%d %d" % (code, wrote)).encode())
sys.exit(code)   # a normal exit: atexit handlers run and MLX finalises MPI (mpirun aborts ranks that do not)
'''


def parse_line(line: str) -> tuple[int, str, str] | None:
    """(rank, kind, payload) for a tagged line, None for anything else (the launcher's own output).
    A pty (mlx.launch's ssh -tt) may put text or \\r before the mark: the mark is searched for (see
    docs/launchers.md#mlx-launch-runs-ssh-tt)."""
    at = line.find(MARK)
    if at < 0:
        return None
    rank, _, rest = line[at + len(MARK):].rstrip("\r\n").partition(" ")
    kind, _, payload = rest.partition(" ")
    try:
        return int(rank), kind, payload
    except ValueError:
        return None
