"""A process's start time as `ps -o lstart=` gives it (the same on procps and BSD ps), to tell a pid from a later
process of the same pid: a piece of detach.py and follow.py (hosts/scripts/__init__.py program() inlines it)."""
import subprocess


def start_time(pid):
    """The start time of `pid`, one line, or None (no such process, or ps did not answer)."""
    try:
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return " ".join(out.split()) or None
