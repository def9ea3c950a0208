"""Ask one run's ranks on this host for their Python stacks and print them as JSON (launch/stacks.py reads it):
`python -c PROGRAM FOLDER RUN_ID TIMEOUT NATIVE`. FOLDER is <workdir>/.clusterctl/runs/<run id>, where every
rank's bootstrap keeps rank-N.pid and rank-N.stacks (stackdump.py). A pid is signalled only when that process
still carries the run id on its command line (a pid file a killed rank left, its pid since reused, is not);
each rank's new dump is read once it has stopped growing. Every frame's source line is read here, where the
file is, and each file is sorted: "program", "library" (site-packages), "python" (the standard library) or
"bootstrap". NATIVE "1" adds `py-spy dump --native` where py-spy is installed. Standard library only."""
import linecache
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time

from .contract import reply
from .rankpids import live_ranks
from .stackdump import STACKS_SIGNAL

FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in ')
SETTLE_S = 0.3          # a dump is whole when its file has not grown for this long


def size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def kind_of(path):
    if path.startswith("<"):
        return "bootstrap" if path == "<string>" else "python"      # <frozen runpy> and the like
    path = os.path.realpath(path)
    paths = sysconfig.get_paths()
    for key, kind in (("purelib", "library"), ("platlib", "library"), ("stdlib", "python"), ("platstdlib", "python")):
        root = paths.get(key)
        if root and path.startswith(os.path.realpath(root) + os.sep):
            return kind
    return "library" if os.sep + "site-packages" + os.sep in path else "program"


# what a process's state letter (ps -o stat=, the same on Linux's procps and macOS's BSD ps) says of one that did
# not answer the signal asking for its stacks
STATES = {"T": "it is stopped (process state T: SIGSTOP, Ctrl-Z or a debugger holds it; SIGCONT resumes it)",
          "D": "it is stuck in the kernel (process state D: waiting on a disk or a network file system)",
          "U": "it is stuck in the kernel (process state U: waiting on a disk or a network file system)",
          "Z": "it has exited (process state Z)"}


def state(pid):
    """Why a process did not answer, by its state, or None (running or sleeping: only slow, or its signal is blocked)."""
    try:
        done = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    letter = done.stdout.strip()[:1]
    return STATES.get(letter)


def py_spy(pid):
    found = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(found):
        return None, "py-spy is not installed on this host (pip install py-spy, into the python the ranks run)"
    try:
        done = subprocess.run([found, "dump", "--native", "--pid", str(pid)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return None, "py-spy failed: %s" % e
    if done.returncode != 0:
        return None, "py-spy failed: " + (done.stdout.strip().splitlines() or ["status %d" % done.returncode])[-1]
    text = done.stdout
    at = text.find("\nPython v")     # py-spy's first line is the command line: the rank's is the whole bootstrap
    return ("Process %d\n" % pid + text[at + 1:]) if at >= 0 else text, None


def main(argv):
    folder, run_id, timeout, native = argv[1], argv[2], float(argv[3]), argv[4] == "1"
    folder = os.path.expanduser(folder)
    ranks = live_ranks(folder, run_id)
    paths = {r: os.path.join(folder, "rank-%d.stacks" % r) for r in ranks}
    before = {r: size(paths[r]) for r in ranks}
    asked = {}
    for r, pid in ranks.items():
        try:
            os.kill(pid, STACKS_SIGNAL)
            asked[r] = time.monotonic()
        except OSError:
            pass
    grown, settled = {}, {}
    deadline = time.monotonic() + timeout
    while len(settled) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.05)
        now = time.monotonic()
        for r in asked:
            if r in settled:
                continue
            n = size(paths[r])
            if n != grown.get(r, (before[r], 0))[0]:
                grown[r] = (n, now)
            elif r in grown and now - grown[r][1] >= SETTLE_S:
                settled[r] = n
    out = []
    for r, pid in sorted(ranks.items()):
        entry = {"rank": r, "pid": pid, "text": "", "error": None, "source": {}, "kinds": {}, "native": None,
                 "native_error": None}
        try:
            with open(paths[r], "rb") as f:
                header = f.readline()
                f.seek(before[r])
                entry["text"] = (header + f.read()).decode("utf-8", "replace")
        except OSError as e:
            entry["error"] = "could not read its stacks: %s" % e
        if r not in asked:
            entry["error"] = "could not be signalled"
        elif r not in settled:
            entry["error"] = "did not answer within %gs (its dump, if any, is incomplete)" % timeout
            why = state(pid)
            if why:
                entry["error"] = "did not answer within %gs: %s" % (timeout, why)
        for line in entry["text"].splitlines():
            m = FRAME.match(line)
            if m:
                path, number = m.group(1), int(m.group(2))
                entry["source"]["%s:%d" % (path, number)] = linecache.getline(path, number).strip()
                entry["kinds"][path] = kind_of(path)
        if native:
            entry["native"], entry["native_error"] = py_spy(pid)
        out.append(entry)
    reply(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
