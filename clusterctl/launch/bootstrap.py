"""The few lines every rank runs before the user's script, passed as `python -c "#clusterctl-run-<id>\\n"BOOTSTRAP
WORKDIR HEARTBEAT SCRIPT ARGS...` (the run id first, where `pgrep -f` sees it: docs/macos.md#pgrep-2048-bytes).

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
  - raises the open-file soft limit towards the hard one (a Mac's sshd session starts at 256:
    docs/macos.md#open-file-limit-256);
  - on a Mac, keeps the host awake while the rank lives: `caffeinate -i -s -w <its pid>` (AWAKE below,
    docs/macos.md#caffeinate-keeps-ranks-awake), started before the program and stopped when it ends;
  - under `mpirun -np 1`, finalises MPI, which MLX initialised but will not finalise
    (docs/mlx-distributed.md#mpi-world-of-one-not-finalized), through the libmpi MLX already loaded
    (MLX_MPI_LIBNAME or the default name: docs/mlx-distributed.md#mlx-mpi-libname).
  - treats `\r` as a line redraw (progress bars, LINES below): a redrawn line's updates go out as `bar`
    lines at most once a second per stream, and its final state as an ordinary line when it ends;
  - reports the world MLX formed, from the program's first `mx.distributed.init()` (WORLD below), for the
    supervisor's world check (docs/mlx-distributed.md#world-check).
Line format: MARK + "<rank> <kind> <payload>", kind in start | out | err | bar | world | hb | exit;
`bar`'s payload is "<out|err> <text>", `world`'s "<size> <backend the program asked for>".
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

BAR_EVERY_S = 1.0   # at most one progress-bar update a second per stream per rank

# A stream's bytes -> complete lines and progress-bar redraws, as a terminal would show them. A \r that
# something other than \n follows makes the line a bar: each \r starts a redraw, the last non-blank state
# is what the line shows. feed() and end() return ("line", text) for every line that ended (a bar's final
# state; \r\n counts as \n) and ("bar", text) for the current bar's latest state, at most once every
# `every` seconds (tick() too, called from the heartbeat, so a stalled bar still shows its latest state).
# Memory stays bounded: of a bar only its last complete state and the redraw in progress are kept.
# Pure (time is passed in), tested by exec'ing this text: tests/unit/test_bootstrap.py.
LINES = r'''
class Lines:
    def __init__(self, every):
        self.every = every
        self.rest = b""         # the current line since its last \r (a trailing \r waits: \r\n or a redraw?)
        self.state = None       # a bar's last complete non-blank state (b"" before one); None: not a bar
        self.shown = b""        # the update last shown of the current line
        self.shown_at = None    # when the last update was shown (any line of this stream)

    def feed(self, data, now):
        *ended, partial = (self.rest + data).split(b"\n")
        out = []
        for line in ended:
            self.rest = line[:-1] if line.endswith(b"\r") else line
            out.append(("line", self._final()))
        self.rest = partial
        self._absorb()
        return out + self.tick(now)

    def end(self):
        return [("line", self._final())] if self.rest or self.state is not None else []

    def tick(self, now):
        if self.state is None:
            return []
        drawing = self.rest.rstrip(b"\r")
        latest = drawing if drawing.strip() else self.state
        if not latest.strip() or latest == self.shown:
            return []
        if self.shown_at is not None and now - self.shown_at < self.every:
            return []
        self.shown, self.shown_at = latest, now
        return [("bar", latest)]

    def _absorb(self):
        body, held = (self.rest[:-1], b"\r") if self.rest.endswith(b"\r") else (self.rest, b"")
        *states, drawing = body.split(b"\r")
        for state in states:
            if state.strip() or self.state is None:
                self.state = state
        self.rest = drawing + held

    def _final(self):
        text = self.rest
        if self.state is not None or b"\r" in text:
            text = next((s for s in reversed(text.split(b"\r")) if s.strip()), self.state or b"")
        self.rest, self.state, self.shown = b"", None, b""
        return text
'''

# Report the world MLX forms, without forcing a backend or changing what the program gets: a one-shot
# sys.meta_path finder waits for `mlx.core` to be imported (a program that never imports it pays nothing)
# and, once the extension is loaded, replaces `mlx.core.distributed.init` with a wrapper that returns
# exactly the group MLX returned and calls report(size, backend asked) after the first call that returns
# one. Patched before the import statement completes, so `mx.distributed.init(...)` and
# `from mlx.core.distributed import init` both get the wrapper. Limits: docs/mlx-distributed.md#world-check.
WORLD = r'''
def watch_world(report):
    import sys, threading

    def wrap(core):
        real = getattr(getattr(core, "distributed", None), "init", None)
        if real is None:
            return
        once = threading.Lock()

        def init(*args, **kwargs):
            group = real(*args, **kwargs)
            if once.acquire(blocking=False):
                report(group.size(), kwargs.get("backend", args[1] if len(args) > 1 else "any"))
            return group

        init.__name__ = init.__qualname__ = "init"
        init.__module__, init.__doc__, init.__wrapped__ = "mlx.core.distributed", real.__doc__, real
        core.distributed.init = init

    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name != "mlx.core":
                return None
            sys.meta_path.remove(self)
            import importlib.util
            spec = importlib.util.find_spec(name)
            loader = getattr(spec, "loader", None)
            if loader is not None and hasattr(loader, "exec_module"):
                load = loader.exec_module      # this spec's own loader object: nothing else is touched

                def exec_module(module):
                    load(module)
                    wrap(module)
                loader.exec_module = exec_module
            return spec

    if "mlx.core" in sys.modules:
        wrap(sys.modules["mlx.core"])
    else:
        sys.meta_path.insert(0, Finder())
'''

# Keep a Mac awake for as long as this rank lives (docs/macos.md#caffeinate-keeps-ranks-awake): caffeinate(8)
# -i holds off idle sleep, -s system sleep (on AC power only), and -w ends caffeinate when the rank's pid is
# gone, however it ends (kill -9 included), so nothing is left behind without carrying the run id. A Mac is
# what `uname -s` calls Darwin, asked only when a caffeinate is on PATH (the probe asks uname too). The
# decision is pure (caffeinate_argv), tested by exec'ing this text: tests/unit/test_bootstrap.py.
AWAKE = r'''
def caffeinate_argv(system, caffeinate, pid):
    if system != "Darwin" or not caffeinate:
        return None
    return [caffeinate, "-i", "-s", "-w", str(pid)]

def keep_awake(pid):
    """(the caffeinate process or None, why it could not start or None)."""
    import shutil, subprocess
    caffeinate = shutil.which("caffeinate")
    if caffeinate is None:
        return None, None
    quiet = subprocess.DEVNULL      # never the rank's pipes: its output must end when the rank does
    try:
        system = subprocess.run(["uname", "-s"], stdin=quiet, stdout=subprocess.PIPE, stderr=quiet,
                                text=True, timeout=10).stdout.strip()
        argv = caffeinate_argv(system, caffeinate, pid)
        return (subprocess.Popen(argv, stdin=quiet, stdout=quiet, stderr=quiet) if argv else None), None
    except (OSError, subprocess.SubprocessError) as e:
        return None, "clusterctl: could not start caffeinate, this Mac may sleep during the job: %s" % e

def let_sleep(proc):
    import subprocess
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:      # it would not end on TERM
        proc.kill()
        proc.wait()
'''

BOOTSTRAP = ENV_FILES + LINES + WORLD + AWAKE + r'''
import json, os, runpy, socket, sys, threading, time, traceback
workdir, beat, script, *args = sys.argv[1:]     # the run id is the comment on our first line
def raise_nofile():
    # launchd gives a Mac's sshd sessions 256 open files; Open MPI's btl_tcp_links 8 x 31 peers needs ~250
    # sockets (docs/macos.md#open-file-limit-256). Towards the hard limit; macOS refuses more than
    # kern.maxfilesperproc (often 10240) even under an unlimited hard limit, hence the smaller tries.
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):      # no such limit here: nothing to raise
        return
    for want in (65536, 10240, 4096):
        want = want if hard == resource.RLIM_INFINITY else min(hard, want)
        if soft != resource.RLIM_INFINITY and soft >= want:
            return
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return
        except (OSError, ValueError):               # above what the kernel allows: try a smaller one
            continue
raise_nofile()     # the run id is the comment on our first line
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
split_lock = threading.Lock()    # feed / tick and their emits in order: a bar update never trails its line
splitters = {}
def send(kind, items):
    for what, text in items:
        if what == "line":
            emit(kind, text)
        else:
            emit("bar", kind.encode() + b" " + text)
def pump(fd, kind):
    lines = splitters[kind] = Lines(%BAR_EVERY_S%)
    with os.fdopen(fd, "rb", buffering=0) as f:
        for chunk in iter(lambda: f.read(65536), b""):
            with split_lock:
                send(kind, lines.feed(chunk, time.monotonic()))
    with split_lock:
        send(kind, lines.end())
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
        with split_lock:
            for kind, lines in list(splitters.items()):
                send(kind, lines.tick(time.monotonic()))
threading.Thread(target=heartbeat, daemon=True).start()
watch_world(lambda size, backend: emit("world", ("%d %s" % (size, backend)).encode()))
awake, why_not = keep_awake(os.getpid())      # before the program: no fork once MPI is up
if why_not:
    print(why_not, file=sys.stderr)
code = 0
made = []
try:
    made = env_files()
    wd = os.path.expanduser(workdir)
    os.makedirs(wd, exist_ok=True)
    os.chdir(wd)
    for name in ("CLUSTERCTL_RUN_DIR", "CLUSTERCTL_RESUME_DIR"):
        if not os.path.isabs(os.environ.get(name, "/")):
            os.environ[name] = os.path.join(wd, os.environ[name])
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
let_sleep(awake)
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
'''.replace("%BAR_EVERY_S%", repr(BAR_EVERY_S))


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
