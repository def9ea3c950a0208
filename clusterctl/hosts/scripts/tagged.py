"""A rank's output as tagged lines on its real stdout; part of the rank bootstrap (bootstrap.py). Every line the
rank writes on fd 1 and 2 (C extensions included) goes out as MARK + "<rank> <out|err> <text>", a progress bar's
redraws as `bar` lines (lines.py), and a heartbeat from a thread of the rank itself: a stopped or wedged process
stops beating, a busy one does not (nor one blocked in a collective: docs/facts/mlx-distributed.md#ring-all-sum-can-deadlock)."""
import os
import sys
import threading
import time

from .lines import BAR_EVERY_S, Lines
from .writeall import write_all


class Tagged:
    def __init__(self, rank):
        self.tag = ("\x1eclusterctl %s " % rank).encode()
        self.out_fd = os.dup(1)
        self.lock = threading.Lock()
        self.split_lock = threading.Lock()  # feed / tick and their emits in order: a bar update never trails its line
        self.splitters = {}
        self.saved = {}                     # fd -> a duplicate of what it was before capture()
        self.pumps = []

    def emit(self, kind, payload=b""):
        with self.lock:
            write_all(self.out_fd, self.tag + kind.encode() + b" " + payload.replace(b"\r", b"") + b"\n")

    def send(self, kind, items):
        for what, text in items:
            if what == "line":
                self.emit(kind, text)
            else:
                self.emit("bar", kind.encode() + b" " + text)

    def pump(self, fd, kind):
        lines = self.splitters[kind] = Lines(BAR_EVERY_S)
        with os.fdopen(fd, "rb", buffering=0) as f:
            for chunk in iter(lambda: f.read(65536), b""):
                with self.split_lock:
                    self.send(kind, lines.feed(chunk, time.monotonic()))
        with self.split_lock:
            self.send(kind, lines.end())

    def capture(self):
        """fd 1 and 2 into pipes, each read by a thread that tags its lines."""
        for fd, kind in ((1, "out"), (2, "err")):
            r, w = os.pipe()
            self.saved[fd] = os.dup(fd)
            os.dup2(w, fd)
            os.close(w)
            t = threading.Thread(target=self.pump, args=(r, kind), daemon=True)
            t.start()
            self.pumps.append(t)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)

    def heartbeat(self, every):
        """A `hb` line every `every` seconds, and a stalled bar's latest state, from a daemon thread."""
        def beat():
            while True:
                time.sleep(every)
                self.emit("hb")
                with self.split_lock:
                    for kind, lines in list(self.splitters.items()):
                        self.send(kind, lines.tick(time.monotonic()))
        threading.Thread(target=beat, daemon=True).start()

    def release(self):
        """fd 1 and 2 back as they were; the pumps get a moment to send what the pipes still hold."""
        for fd, orig in self.saved.items():
            os.dup2(orig, fd)
        for t in self.pumps:
            t.join(2)
