"""Every byte of a write to a pipe, whatever signals arrive: a piece of the rank bootstrap (tagged.py) and of the
rank starter (ranks.py), both of which hold Python signal handlers while they pass on long lines.

A write(2) to a pipe that is full blocks; a signal whose handler runs then ends it early, returning the count
written so far. CPython 3.11's BufferedWriter (sys.stdout.buffer, a Popen's stdin) can drop the rest of such a
write: a 2 MiB line passed on as 64 KiB pieces lost whole pipe pages when a rank exited mid-stream and its
SIGCHLD reached the rank starter (docs/facts/launchers.md#buffered-writes-and-signals). So these programs write
with os.write in a loop, which takes the count as it is and writes the rest."""
import os
import select


def write_all(fd, data):
    """Every byte of `data` to `fd`, in order: a short write (a signal mid-write, a pipe someone made
    non-blocking) is followed by the rest."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])
        except InterruptedError:
            pass
