"""The stdin relay for an mpi job's ranks on one host: `python -c PROGRAM FOLDER TAG RANK...`.

mpirun gives its stdin to rank 0 alone (docs/facts/launchers.md#mpirun-stdin-all), so `run` starts this on
every host of an mpi job, behind the watchdog with the controller's stdin (watchdog.sh): it makes a
FIFO FOLDER/rank-R.TAG.stdin for each rank R of this host (TAG: the attempt's, so that no rank opens a FIFO
an earlier attempt left), says `ready`, and copies its own stdin to every FIFO,
the same bytes to each, holding in memory what a rank has not taken yet; each rank's bootstrap opens its
FIFO as its stdin (bootstrap.py) and gets EOF when the data ends. A FIFO is removed once its rank opened it,
and the rest when the relay is stopped (the watchdog's SIGTERM). Standard library only.
"""
import os
import signal
import sys
import threading

from .contract import READY
from .stdinpump import Buffered, fifo_path


class Fifo(Buffered):
    """One rank's FIFO: opened for writing in a thread (that blocks until the rank opens it), fed in order."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.thread = threading.Thread(target=self.feed, daemon=True)
        self.thread.start()

    def feed(self):
        fd = os.open(self.path, os.O_WRONLY)
        remove(self.path)
        self.write_to(fd)


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def main(argv):
    folder, tag = os.path.expanduser(argv[1]), argv[2]
    os.makedirs(folder, exist_ok=True)
    paths = [fifo_path(folder, rank, tag) for rank in argv[3:]]
    signal.signal(signal.SIGTERM, lambda *_: [remove(p) for p in paths] + [os._exit(128 + signal.SIGTERM)])
    for path in paths:
        os.mkfifo(path + ".new", 0o600)   # then renamed: a rank waiting for the name opens a FIFO whole
        os.rename(path + ".new", path)
    fifos = [Fifo(path) for path in paths]
    print(READY, flush=True)
    while True:
        try:
            data = os.read(0, 65536)
        except OSError:
            data = b""
        for fifo in fifos:
            fifo.put(data)
        if not data:
            break
    for fifo in fifos:
        fifo.thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
