"""The few lines every rank runs before the user's script: `python -c "#clusterctl-run-<id>\\n"PROGRAM
WORKDIR HEARTBEAT SCRIPT ARGS...`, PROGRAM being this file with its sibling imports inlined (scripts.program),
the run id first, where `pgrep -f` sees it (docs/facts/macos.md#pgrep-2048-bytes). The launcher's side (the argv,
the tagged lines read back) is launch/bootstrap.py.

It needs nothing but the standard library (hosts need not have clusterctl installed) and sits between the
launcher and the script without a shell (macOS SIP would strip DYLD_* through /bin/sh, see
docs/facts/macos.md#sip-strips-dyld). It:
  - re-emits every line the rank writes on fd 1 and 2 tagged with rank and stream (tagged.py), so one parser
    serves every launcher (the rank: OMPI_COMM_WORLD_RANK or MLX_RANK, see
    docs/facts/launchers.md#mlx-launch-rank-environment), `\\r` redraws as `bar` lines (lines.py), and a heartbeat
    every HEARTBEAT seconds;
  - changes to its host's working directory (one per rank when the hosts' workdirs differ; ~ expanded on
    the host; created if missing), puts <workdir>/.clusterctl/lib (where `run` ships clusterctl itself for
    the bundled trainer) on sys.path when it exists, waits for the project's copy to its host when the launch
    started beside it (wait_for_copy), runs the script as __main__ with its arguments (or, when
    the script is "-m", the module named by the first argument, as `python -m` would, with the working
    directory first on sys.path), and reports the exit code (the launcher's own cannot be trusted:
    docs/facts/launchers.md#mlx-launch-exit-status);
  - writes the files MLX reads by path (envfiles.py, docs/facts/launchers.md#our-rank-starter), and removes them;
  - dumps every thread's Python stack into a file when asked with a signal (stackdump.py, for `clusterctl
    stacks` and the stall watchdog);
  - under mpi, reads its stdin from its host's stdin relay (stdinrelay.py): mpirun gives its own to rank 0
    alone (docs/facts/launchers.md#mpirun-stdin-all); and drains its stdin as it comes, so a program that
    never reads it cannot block the watchdog writing to it (stdinpump.py, docs/run.md#standard-input);
  - raises the open-file soft limit (nofile.py), keeps a Mac awake while the rank lives (awake.py), reports
    the world MLX formed (worldwatch.py, docs/facts/mlx-distributed.md#world-check), finalises an MPI world of one
    (mpiworld.py).
Line format: MARK + "<rank> <kind> <payload>", kind in start | out | err | bar | world | hb | exit;
`bar`'s payload is "<out|err> <text>", `world`'s "<size> <backend the program asked for>", `exit`'s
"<code> <1 if the rank left anything in its run directory, else 0>".
"""
import json
import os
import runpy
import socket
import sys
import time
import traceback

from .awake import keep_awake, let_sleep
from .envfiles import env_files
# contract after envfiles: envfiles' program brings it, where its one copy then sits
from .contract import COPY_GATE_ENV, HOST_ENV, RELAY_ENV
from .mpiworld import finalize_world_of_one
from .nofile import raise_nofile
from .stackdump import arm_stacks, disarm_stacks, rank_paths
from .stdinpump import drain_stdin, fifo_path
from .tagged import Tagged
from .worldwatch import watch_world

RELAY_WAIT_S = 30.0      # how long a rank waits for its host's stdin relay to make its FIFO (launch/stdinrelay.py)


def run_script(workdir, script, args, made):
    """Run the script (or "-m" module) as __main__ in `workdir`; its exit code. The files env_files() wrote
    are added to `made`."""
    try:
        made.extend(env_files())
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
            return e.code
        if e.code is not None:
            print(e.code, file=sys.stderr)
            return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def left_files():
    """Whether this rank left anything in its run directory: rank 0's answer spares `run` a pointless fetch."""
    try:
        return any(True for _ in os.scandir(os.environ.get("CLUSTERCTL_RUN_DIR") or "/nonexistent"))
    except OSError:
        return False


def host_env(rank):
    """This rank's host's own inventory `env`, where it differs from the first host's (which the launcher gave
    every rank): CLUSTERCTL_HOST_ENV maps a rank to the values to set (None: remove the name)."""
    for name, value in json.loads(os.environ.pop(HOST_ENV, "{}")).get(rank, {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def relayed_stdin(workdir, rank, wait=RELAY_WAIT_S):
    """Under mpi, which gives its stdin to rank 0 alone, this rank's stdin is its FIFO from the host's stdin
    relay (stdinrelay.py, started by `run` beside the launcher when CLUSTERCTL_STDIN_RELAY holds the
    attempt's tag): opened in place of fd 0 once the relay has made it."""
    tag = os.environ.pop(RELAY_ENV, "")
    if not tag:
        return
    path = fifo_path(rank_paths(workdir, os.environ.get("CLUSTERCTL_RUN_ID", ""), rank)[0], rank, tag)
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
            break
        except FileNotFoundError as e:
            if time.monotonic() > deadline:
                print("clusterctl: no stdin for rank %s (%s): it reads /dev/null" % (rank, e), file=sys.stderr)
                return
            time.sleep(0.01)
        except OSError as e:
            print("clusterctl: no stdin for rank %s (%s): it reads /dev/null" % (rank, e), file=sys.stderr)
            return
    os.dup2(fd, 0)
    os.close(fd)


def wait_for_copy(workdir):
    """A launch that started beside the project's copy (run's warm launch, docs/run.md#the-project-copy) gives
    its ranks the copy's token in CLUSTERCTL_COPY_GATE: the program starts once the copy to this host has
    ended, which `run` marks by an empty file of that name in <workdir>/.clusterctl/copies/
    (transfer/stage.py project_copy). No deadline of its own: `run` stops the job if the copy fails, and the
    watchdog if `run` goes."""
    token = os.environ.pop(COPY_GATE_ENV, "")
    if not token:
        return
    path = os.path.join(os.path.expanduser(workdir), ".clusterctl", "copies", token)
    while not os.path.exists(path):
        time.sleep(0.01)


def main(argv):
    workdir, beat, script, *args = argv[1:]     # the run id is the comment on our first line
    raise_nofile()
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("MLX_RANK") or "0"
    host_env(rank)
    if workdir.startswith("["):
        workdir = json.loads(workdir)[int(rank)]
    relayed_stdin(workdir, rank)
    drain_stdin()
    stacks = arm_stacks(workdir, os.environ.get("CLUSTERCTL_RUN_ID"), rank)
    out = Tagged(rank)
    out.emit("start", socket.gethostname().encode())
    out.capture()
    out.heartbeat(float(beat))
    wait_for_copy(workdir)
    watch_world(lambda size, backend: out.emit("world", ("%d %s" % (size, backend)).encode()))
    awake, why_not = keep_awake(os.getpid())      # before the program: no fork once MPI is up
    if why_not:
        print(why_not, file=sys.stderr)
    made = []
    code = run_script(workdir, script, args, made)
    sys.stdout.flush()
    sys.stderr.flush()
    for path in made:
        try:
            os.unlink(path)
        except OSError:
            pass
    out.release()
    disarm_stacks(stacks)
    let_sleep(awake)
    finalize_world_of_one()
    out.emit("exit", ("%d %d" % (code, left_files())).encode())
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))   # a normal exit: atexit handlers run and MLX finalises MPI (mpirun aborts ranks that do not)
