"""A rank's stdin drained as it comes; part of the rank bootstrap (bootstrap.py) and of the stdin relay
(stdinrelay.py). Behind the watchdog (watchdog.sh), a rank's stdin is a pipe the watchdog writes the
data from the controller into, and the same shell process reads the channel to notice the controller going
away: a program that never reads its stdin would leave the watchdog blocked on a full pipe, deaf to the
channel closing. So the bootstrap takes the pipe over: a thread reads it as it comes into memory, another
writes that to a new pipe on fd 0, the one the program (and whatever it starts) reads; its EOF when the
data ends (docs/run.md#standard-input)."""
import os
import stat
import threading


def fifo_path(folder, rank, tag):
    """Rank `rank`'s FIFO from its host's stdin relay in the attempt `tag` (stdinrelay.py makes it, the
    bootstrap opens it)."""
    return os.path.join(folder, "rank-%s.%s.stdin" % (rank, tag))


class Buffered:
    """Bytes held in memory in order, and written to an fd by write_to() in its own thread as the reader
    takes them; put(b"") is the end. A reader that closes its end drops the rest, never blocks the writer."""

    def __init__(self):
        self.chunks, self.more, self.ended = [], threading.Condition(), False

    def put(self, data):
        with self.more:
            if data:
                self.chunks.append(data)
            else:
                self.ended = True
            self.more.notify()

    def write_to(self, fd):
        reading = True
        while True:
            with self.more:
                while not self.chunks and not self.ended:
                    self.more.wait()
                if not self.chunks:
                    break
                data = self.chunks.pop(0)
            while reading and data:
                try:
                    data = data[os.write(fd, data):]
                except OSError:
                    reading = False
        os.close(fd)


def drain_stdin():
    """Put an unbounded buffer between fd 0, when it is a pipe, and the program. Returns at once."""
    try:
        if not stat.S_ISFIFO(os.fstat(0).st_mode):
            return
    except OSError:
        return
    source = os.dup(0)                       # not inherited by the program's children (Python's default)
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)                     # inherited, as a stdin is
    os.close(read_end)
    held = Buffered()

    def take():
        while True:
            try:
                data = os.read(source, 65536)
            except OSError:
                data = b""
            held.put(data)
            if not data:
                os.close(source)
                return

    threading.Thread(target=take, name="clusterctl-stdin", daemon=True).start()
    threading.Thread(target=held.write_to, args=(write_end,), name="clusterctl-stdin", daemon=True).start()
