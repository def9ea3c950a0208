"""A process's start time as `ps -o lstart=` gives it (the same on procps and BSD ps), to tell a pid from a later
process of the same pid: a piece of detach.py and follow.py (hosts/scripts/__init__.py program() inlines it)."""
import subprocess


def start_time(pid):
    """The start time of `pid`, one line, or None (no such process, one that has ended and waits to be reaped,
    or ps did not answer). A process killed with its parent stays a zombie until init reaps it, a moment or
    longer: it has ended all the same."""
    try:
        out = subprocess.run(["ps", "-o", "stat=", "-o", "lstart=", "-p", str(pid)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    words = out.split()
    if not words or words[0].startswith("Z"):
        return None
    return " ".join(words[1:]) or None
