"""Every thread's Python stack on demand; part of the rank bootstrap (bootstrap.py). faulthandler dumps them
from a C-level handler of STACKS_SIGNAL, so a rank answers even while its main thread waits inside native code
(a collective), where no Python signal handler would ever run; no ptrace, so no sudo on macOS
(docs/run.md#stacks). The rank keeps two files in <workdir>/.clusterctl/runs/<run id>/:
  rank-N.pid      its pid, written last (atomically): the rank can be asked
  rank-N.stacks   a header line naming the main thread, then each dump, appended
which hosts/scripts/stacks.py reads over SSH. Both go when the rank ends (a killed rank's are removed by the
sweep). A program that installs its own STACKS_SIGNAL handler replaces this one."""
import os
import signal

STACKS_SIGNAL = signal.SIGUSR2
RANK_FILES = os.path.join(".clusterctl", "runs")     # under the workdir (hosts/connector.py: the same place)


def rank_paths(workdir, run_id, rank):
    folder = os.path.join(os.path.expanduser(workdir), RANK_FILES, run_id)
    return folder, os.path.join(folder, "rank-%s.pid" % rank), os.path.join(folder, "rank-%s.stacks" % rank)


def arm_stacks(workdir, run_id, rank):
    """Register the dump; a handle for disarm_stacks, or None when it cannot be (no run id, unwritable)."""
    import faulthandler
    import threading
    if not run_id:
        return None
    folder, pid_path, stacks_path = rank_paths(workdir, run_id, rank)
    try:
        os.makedirs(folder, exist_ok=True)
        out = open(stacks_path, "a", encoding="utf-8")
        out.write("# clusterctl rank %s pid %d main thread 0x%016x\n" % (rank, os.getpid(), threading.get_ident()))
        out.flush()
        faulthandler.register(STACKS_SIGNAL, file=out, all_threads=True, chain=False)
        partial = pid_path + ".partial"
        with open(partial, "w", encoding="utf-8") as f:
            f.write("%d\n" % os.getpid())
        os.replace(partial, pid_path)
    except (OSError, ValueError, RuntimeError):
        return None
    return out, folder, pid_path, stacks_path


def disarm_stacks(handle):
    import faulthandler
    if handle is None:
        return
    out, folder, pid_path, stacks_path = handle
    for path in (pid_path, stacks_path):       # the pid file first: nobody new asks
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        faulthandler.unregister(STACKS_SIGNAL)
        # one who read the pid file just before may still ask: the signal's default action would kill the
        # rank as it finishes, so it is ignored from here to the end
        signal.signal(STACKS_SIGNAL, signal.SIG_IGN)
    except (ValueError, RuntimeError, OSError):
        pass
    out.close()
    for empty in (folder, os.path.dirname(folder), os.path.dirname(os.path.dirname(folder))):
        try:
            os.rmdir(empty)        # the last rank of the run on this host leaves no empty folder behind
        except OSError:
            break
