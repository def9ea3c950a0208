"""A run's ranks alive on this host, from the pid files their bootstraps keep (stackdump.py): a piece of
stacks.py (stacks for `clusterctl stacks` and the stall watchdog) and stopranks.py (a stop with the work kept).
A pid is counted only while that process still carries the run id on its command line: a pid file a killed
rank left, its pid since reused by another process, is not. Standard library only."""
import os
import re
import subprocess

from .contract import RUN_TOKEN


def carries_run(pid, run_id):
    try:
        os.kill(pid, 0)
        command = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return (RUN_TOKEN + run_id) in command


def live_ranks(folder, run_id):
    """{rank: pid} of this run's ranks alive on this host."""
    found = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    for name in names:
        m = re.match(r"^rank-(\d+)\.pid$", name)
        if not m:
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if carries_run(pid, run_id):
            found[int(m.group(1))] = pid
    return found
