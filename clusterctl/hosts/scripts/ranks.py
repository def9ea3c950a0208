"""clusterctl's rank starter for MLX's ring and jaccl backends: `python ranks.py SPEC.json`.

Standard library only: it runs on this machine or, for a launch from the first host, on that host with its
own python. SPEC.json (written by clusterctl/launch/backends/rankstarter.py) lists every rank with the argv that starts
it: `/bin/sh -c` of a watchdog-wrapped script for a rank on this machine, `ssh -F <rendering> -- HOST
<the same script>` for a rank elsewhere (docs/facts/launchers.md#our-rank-starter).

What it does, and why it is not mlx.launch (docs/facts/launchers.md#mlx-launch-spins-a-core):
  - starts every rank at once, each with a stdin pipe it writes the rank's environment to first (the
    spec's "stdin": never on a command line, where `ps` shows it) and never closes until the rank should
    stop: the rank's watchdog (watchdog.sh) reads that pipe and kills the rank's process
    tree when it ends, so a rank never outlives this process, even after SIGKILL;
  - copies its own stdin to every rank, the same bytes to each, in frames (frames.py) on that pipe, then
    the end frame when its stdin ends: the rank's stdin ends, its pipe stays open (docs/run.md#standard-input).
    A rank that does not read holds its bytes here, never the other ranks or the output relay;
  - relays every complete line of every rank's stdout and stderr to its own, in one thread, blocked in
    select() until a pipe has data or a child exits (SIGCHLD through a wake-up pipe): an idle job costs
    nothing but the ranks' one heartbeat a second;
  - pulses every rank started over ssh with a spec "alive" (rankstarter.py) every "alive" / 6 seconds once its
    stdin has ended, the first at once (frames.py PULSE): its watchdog, armed by the first, stops it when the
    pulses stop for "alive" seconds, as when
    its pipe closes, so a rank does not outlive this process even when this process's host vanishes without
    closing its connections (a power cut; docs/run.md#close-the-lid-detached-runs);
  - when a rank exits non-zero (or ssh could not start it), says so on stderr, stops the others (closes
    their pipes, SIGKILL after a grace period) and exits with that rank's status; SIGTERM, SIGINT and SIGHUP
    stop every rank the same way (exit 128 + the signal);
  - when a rank that failed before anything was stopped never reported its own exit (killed outright, its
    host gone), says so with a tagged `lost <status>` line: the supervisor then names that rank as the
    cause, not the ranks that failed after losing it (launch/supervise.py).
"""
import json
import os
import selectors
import signal
import subprocess
import sys
import time

from .frames import PULSE, STDIN_END, stdin_frames
from .writeall import write_all

GRACE_S = 2.0           # after closing a rank's pipe, how long before its starter process is killed
DRAIN_S = 2.0           # after every rank exited, how long a pipe a grandchild still holds is read


class Rank:
    def __init__(self, spec):
        self.rank, self.host = spec["rank"], spec["host"]
        self.proc = subprocess.Popen(spec["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        # the rank's environment, read by its shell before anything else (never on its command line)
        try:
            self.proc.stdin.write(spec.get("stdin", "").encode())
            self.proc.stdin.flush()
        except OSError:
            pass      # ssh already gone: its exit status says why
        os.set_blocking(self.proc.stdin.fileno(), False)
        self.pending = b""             # frames of our stdin not yet taken by the rank's pipe
        self.pulse_s = spec.get("alive", 0) / 6.0    # its watchdog's ALIVE, pulsed six times within it (0: none)
        self.ended = False             # its stdin's end frame was given: pulses may follow
        self.code = None
        self.open = 2                  # stdout and stderr not yet at EOF
        self.rest = {}                 # fd -> a partial line
        self.exit_tag = ("\x1eclusterctl %d exit " % self.rank).encode()   # the bootstrap's exit line
        self.reported = False          # that line went by
        self.first = False             # it failed before any rank was stopped: a cause, not a casualty
        self.told = False              # its `lost` line was written

    def give(self, data, sel):
        """Queue `data` for the rank's stdin and write what its pipe takes now (the rest when it is writable)."""
        if self.proc.stdin.closed:
            return
        was = bool(self.pending)
        self.pending += data
        self.ended = self.ended or data.endswith(STDIN_END)
        self.flush()
        if self.pending and not was:
            sel.register(self.proc.stdin.fileno(), selectors.EVENT_WRITE, self)

    def flush(self):
        try:
            while self.pending:
                self.pending = self.pending[os.write(self.proc.stdin.fileno(), self.pending):]
        except BlockingIOError:
            pass
        except OSError:
            self.pending = b""        # the rank (or its ssh) is gone: its exit says why

    def stop(self):
        self.pending = b""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


def read_all(fd):
    chunks = []
    try:
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            chunks.append(chunk)
    except OSError:
        pass
    return b"".join(chunks)


def describe(rank, code):
    if code < 0:
        return "rank %d on %s was killed by signal %d" % (rank.rank, rank.host, -code)
    if code == 255:
        return "rank %d on %s: its ssh exited 255 (could not connect or log in, see the lines above)" % (
            rank.rank, rank.host)
    return "rank %d on %s exited %d" % (rank.rank, rank.host, code)


class Starter:
    """Every rank started at once, their output relayed, and the first failure (or a signal) stopping them all."""

    def __init__(self, entries):
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        self.received = []
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda s, frame: self.received.append(s))
        signal.signal(signal.SIGCHLD, lambda s, frame: None)   # only to wake select() through the pipe

        self.sel = selectors.DefaultSelector()
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.ranks = []
        for entry in entries:
            r = Rank(entry)
            self.ranks.append(r)
            for stream, out in ((r.proc.stdout, 1), (r.proc.stderr, 2)):      # fds: write_all, not a BufferedWriter
                self.sel.register(stream.fileno(), selectors.EVENT_READ, (r, out))
        try:
            self.sel.register(0, selectors.EVENT_READ, "stdin")
        except (OSError, ValueError):       # a file, /dev/null (epoll takes neither) or none at all: read it now
            data = read_all(0)
            for r in self.ranks:
                r.give(stdin_frames(data) + STDIN_END, self.sel)
        self.status = 0
        self.stopping_since = None
        self.drain_since = None
        self.pulse_s = min([r.pulse_s for r in self.ranks if r.pulse_s] or [0])
        self.next_pulse = time.monotonic()     # the first at once: a watchdog counts only once one came

    def stop_all(self):
        self.stopping_since = time.monotonic()
        for r in self.ranks:
            if r.pending and not r.proc.stdin.closed:
                self.sel.unregister(r.proc.stdin.fileno())
            r.stop()

    def run(self):
        while True:
            timeout = None
            if self.stopping_since is not None or self.drain_since is not None:
                timeout = 0.2
            elif self.pulse_s:
                timeout = max(0.0, self.next_pulse - time.monotonic())
            for key, _ in self.sel.select(timeout):
                self.relay(key)
            if self.pulse_s and self.stopping_since is None and time.monotonic() >= self.next_pulse:
                self.next_pulse = time.monotonic() + self.pulse_s
                for r in self.ranks:
                    if r.pulse_s and r.ended and not r.pending:     # never between the frames of a chunk
                        r.give(PULSE, self.sel)
            if self.received and self.stopping_since is None:
                self.status = self.status or 128 + self.received[0]
                self.stop_all()
            for r in self.ranks:
                self.reap(r)
            if self.done(time.monotonic()):
                return self.status

    def relay(self, key):
        """Drain the wake-up pipe, copy our stdin to every rank, write a rank's pending stdin, or pass on a
        rank's complete lines (its partial line at EOF)."""
        if isinstance(key.data, Rank):
            key.data.flush()
            if not key.data.pending or key.data.proc.stdin.closed:
                self.sel.unregister(key.fd)
            return
        if key.data == "stdin":
            try:
                data = os.read(0, 65536)
            except OSError:
                data = b""
            if not data:
                self.sel.unregister(0)
            for r in self.ranks:
                r.give(stdin_frames(data) if data else STDIN_END, self.sel)
            return
        if key.data is None:
            try:
                while os.read(self.wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            return
        r, out = key.data
        fd = key.fd
        data = os.read(fd, 65536)
        if not data:
            self.sel.unregister(fd)
            tail = r.rest.pop(fd, b"")
            if tail:
                write_all(out, tail + b"\n")
            r.open -= 1
            return
        *lines, r.rest[fd] = (r.rest.get(fd, b"") + data).split(b"\n")
        if lines:
            text = b"\n".join(lines) + b"\n"
            r.reported = r.reported or r.exit_tag in text
            write_all(out, text)

    def reap(self, r):
        """Note a rank that exited; the first failure stops the others, and is told `lost` if it never reported."""
        if r.code is None and r.proc.poll() is not None:
            r.code = r.proc.returncode
            if r.code != 0 and self.stopping_since is None:
                r.first = True
                write_all(2, (describe(r, r.code) + "; stopping every rank\n").encode())
                self.status = r.code if 0 < r.code < 256 else 1
                self.stop_all()
        if r.first and r.open == 0 and not r.reported and not r.told:    # its output is all read
            r.told = True
            write_all(1, b"\x1eclusterctl %d lost %d\n" % (r.rank, r.code))

    def done(self, now):
        """Kill what outlived the grace period; True once every rank exited and its pipes are read (or drained)."""
        if self.stopping_since is not None and now - self.stopping_since > GRACE_S:
            for r in self.ranks:
                if r.code is None:
                    r.proc.kill()
        if all(r.code is not None for r in self.ranks):
            if all(r.open == 0 for r in self.ranks):
                return True
            self.drain_since = self.drain_since or now
            if now - self.drain_since > DRAIN_S:      # a grandchild holds a pipe: the ranks are done
                return True
        return False


def main(argv):
    with open(argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    return Starter(spec["ranks"]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
