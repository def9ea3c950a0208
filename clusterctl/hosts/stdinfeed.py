"""This machine's standard input, read once for a whole run and handed to its attempts in order
(docs/run.md#standard-input).

    feed = StdinFeed.of(sys.stdin.buffer)  # None for /dev/null or an empty file: EOF at once, nothing to carry
    feed.attach(send)                      # this attempt's commands get the bytes no earlier attempt was sent

One reader thread takes the source as it comes (a terminal only while this process is in the foreground) into
memory, at most LIMIT bytes ahead of the attempt that sends them on. Each attempt's pump sends the chunks, as
frames (hosts/scripts/frames.py), through its `send`, then the end frame once the source has ended. A chunk whose
send fails (the attempt's commands are gone) goes back to the front, so the next attempt starts with it: a
restart reads on from where the attempt before it stopped, with no byte lost, repeated or reordered across the
two. Attaching a new pump retires the one before it first, and waits for the chunk it may be sending.
"""
from __future__ import annotations

import collections
import os
import select
import stat
import threading
import time
from typing import BinaryIO, Callable, Iterator

from .scripts.frames import STDIN_END, stdin_frames

LIMIT = 16 * 2**20           # bytes read ahead of the attempt that takes them (a pipe's writer waits beyond it)
RETIRE_WAIT_S = 10.0         # how long a new attempt waits for the old pump's last send to end


class StdinFeed:
    """A run's stdin: one reader, one pump at a time."""

    def __init__(self, source: BinaryIO, limit: int = LIMIT):
        self.source, self.limit = source, limit
        self._cond = threading.Condition()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._ended = False
        self._reader: threading.Thread | None = None
        self._pump: _Pump | None = None

    @classmethod
    def of(cls, source: BinaryIO | None) -> StdinFeed | None:
        """A feed of `source`; None where it holds nothing to send (None, /dev/null, an empty regular file, a
        pipe or socket already at its end): every rank then gets EOF at once, with no relay or frames started
        for it. A pipe whose writer has written, or not yet, is a feed (what was read to look stays first)."""
        if source is None:
            return None
        first = b""
        try:
            fd = source.fileno()
            st = os.fstat(fd)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.stat(os.devnull).st_rdev:
                return None
            if stat.S_ISREG(st.st_mode) and st.st_size <= os.lseek(fd, 0, os.SEEK_CUR):
                return None
            if (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)) and select.select([fd], [], [], 0)[0]:
                first = os.read(fd, 65536)     # ready now: the writer has written, or closed its end
                if not first:
                    return None                # `true | clusterctl run`, `clusterctl run <&-`-like: nothing, ever
        except (AttributeError, OSError, ValueError):
            pass                 # not a file of the system's (click's test runner): read it
        feed = cls(source)
        if first:
            feed._chunks.append(first)
            feed._held = len(first)
        return feed

    def attach(self, send: Callable[[bytes], None]) -> threading.Thread:
        """Retire the earlier attempt's pump, then start this attempt's: it sends what the earlier ones did
        not, then STDIN_END when the source has ended; it ends when `send` raises (OSError, ValueError,
        EOFError: the attempt's commands are gone) or when the next attempt attaches."""
        with self._cond:
            old, self._pump = self._pump, None
            if old is not None:
                old.retired = True
                self._cond.notify_all()
        if old is not None:
            old.thread.join(RETIRE_WAIT_S)
            with self._cond:
                old.abandoned = old.thread.is_alive()   # stuck in a send: whatever it held is that attempt's
        with self._cond:
            if self._reader is None:
                self._reader = threading.Thread(target=self._read, name="clusterctl-stdin-reader", daemon=True)
                self._reader.start()
            pump = self._pump = _Pump(self, send)
        pump.thread.start()
        return pump.thread

    def _read(self) -> None:
        chunks = _chunks(self.source)
        try:
            while True:
                with self._cond:          # nothing more is read while LIMIT bytes wait to be sent
                    while self._held >= self.limit:
                        self._cond.wait()
                chunk = next(chunks, None)
                if chunk is None:
                    break
                with self._cond:
                    self._chunks.append(chunk)
                    self._held += len(chunk)
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass         # the source was closed under us: its end
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def _take(self, pump: _Pump) -> tuple[bool, bytes | None]:
        """(go on, the next chunk or None for the end); (False, None) once `pump` is retired."""
        with self._cond:
            while not pump.retired and not self._chunks and not self._ended:
                self._cond.wait()
            if pump.retired:
                return False, None
            if not self._chunks:
                return True, None
            chunk = self._chunks.popleft()
            self._held -= len(chunk)
            self._cond.notify_all()
            return True, chunk

    def _give_back(self, pump: _Pump, chunk: bytes) -> None:
        with self._cond:
            if pump.abandoned:
                return
            self._chunks.appendleft(chunk)
            self._held += len(chunk)
            self._cond.notify_all()


class _Pump:
    def __init__(self, feed: StdinFeed, send: Callable[[bytes], None]):
        self.feed, self.send = feed, send
        self.retired = self.abandoned = False
        self.thread = threading.Thread(target=self._run, name="clusterctl-stdin", daemon=True)

    def _run(self) -> None:
        while True:
            go_on, chunk = self.feed._take(self)
            if not go_on:
                return
            try:
                self.send(STDIN_END if chunk is None else stdin_frames(chunk))
            except (OSError, ValueError, EOFError):
                if chunk is not None:
                    self.feed._give_back(self, chunk)
                return
            if chunk is None:
                return


def _chunks(source: BinaryIO) -> Iterator[bytes]:
    """What `source` gives, as it comes (a line typed is sent when typed, not when a buffer fills). A terminal
    is read only while this process is in its foreground process group: in the background it would be
    stopped by SIGTTIN, or take lines meant for the shell."""
    try:
        fd = source.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is None:           # an in-memory file (click's test runner)
        read = getattr(source, "read1", source.read)
        yield from iter(lambda: read(65536), b"")
        return
    tty = os.isatty(fd)
    while True:
        if tty and not _in_foreground(fd):
            os.fstat(fd)    # OSError (the end) once the terminal is closed under us
            time.sleep(0.2)
            continue
        if tty and not select.select([fd], [], [], 0.2)[0]:
            continue        # look again whether we are still in the foreground before reading
        data = os.read(fd, 65536)
        if not data:
            return
        yield data


def _in_foreground(fd: int) -> bool:
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
