"""One reader of the controller's stdin for a whole run (hosts/stdinfeed.py): each attempt gets the bytes from
where the one before it stopped, none lost, repeated or reordered, then the end (docs/run.md#standard-input)."""
import os
import re
import threading
import time

import pytest

from clusterctl.hosts import stdinfeed
from clusterctl.hosts.stdinfeed import StdinFeed

ESCAPES = {b"\\0000": b"\0", b"\\0134": b"\\"}


def decode(frames: bytes) -> tuple[bytes, bool]:
    """What the watchdog's shell makes of frames: (the bytes, whether the end frame came)."""
    out, ended = [], False
    for line in frames.split(b"\n")[:-1]:
        text = re.sub(rb"\\0000|\\0134", lambda m: ESCAPES[m.group(0)], line[1:])
        if line[:1] == b"d":
            out.append(text + b"\n")
        elif line[:1] == b"p":
            out.append(text)
        else:
            assert line == b"e" and not ended
            ended = True
    return b"".join(out), ended


class Attempt:
    """One attempt's commands, as the feed sees them: a `send` that takes frames until `fail_after` of them,
    then raises as a closed channel does."""

    def __init__(self, fail_after: int | None = None):
        self.frames, self.fail_after, self.calls = [], fail_after, 0
        self.gone = threading.Event()

    def send(self, data: bytes) -> None:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            self.gone.set()
            raise OSError("Socket is closed")
        self.frames.append(data)

    def data(self) -> tuple[bytes, bool]:
        return decode(b"".join(self.frames))


def numbered_lines(n: int, gap: float) -> tuple[int, bytes]:
    """A pipe's read end and what its writer thread writes, line by line with `gap` seconds between."""
    lines = [b"line %03d \\ \0 end\n" % i for i in range(n)]
    read_end, write_end = os.pipe()

    def write():
        for line in lines:
            os.write(write_end, line)
            time.sleep(gap)
        os.close(write_end)
    threading.Thread(target=write, daemon=True).start()
    return read_end, b"".join(lines)


def wait_until(condition, within=20.0):
    deadline = time.monotonic() + within
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def test_a_restart_reads_on_where_the_attempt_before_stopped():
    read_end, sent = numbered_lines(200, 0.002)
    with os.fdopen(read_end, "rb", buffering=0) as source:
        feed = StdinFeed(source)
        first = Attempt(fail_after=30)
        feed.attach(first.send)
        first.gone.wait(20)
        time.sleep(0.2)                       # the restart's delay: the reader goes on meanwhile
        second = Attempt()
        feed.attach(second.send).join(20)
    got_first, ended_first = first.data()
    got_second, ended_second = second.data()
    assert not ended_first and ended_second
    assert got_first + got_second == sent     # in order, no gap, no repeat, NUL bytes and backslashes kept


def test_an_earlier_attempt_that_still_takes_data_gets_none_once_the_next_attaches():
    """The defect this replaces: the first attempt's copy went on reading the source beside the next one's
    (its send never failed), so the two took lines in turn."""
    read_end, sent = numbered_lines(100, 0.002)
    with os.fdopen(read_end, "rb", buffering=0) as source:
        feed = StdinFeed(source)
        first, second = Attempt(), Attempt()
        feed.attach(first.send)
        wait_until(lambda: len(first.frames) >= 10)
        feed.attach(second.send).join(20)
    got_first, _ = first.data()
    got_second, ended = second.data()
    assert ended and got_first + got_second == sent


def test_the_end_reaches_every_later_attempt():
    read_end, write_end = os.pipe()
    os.write(write_end, b"all of it\npartial")
    os.close(write_end)
    with os.fdopen(read_end, "rb", buffering=0) as source:
        feed = StdinFeed(source)
        first, second = Attempt(), Attempt()
        feed.attach(first.send).join(20)
        feed.attach(second.send).join(20)
    assert first.data() == (b"all of it\npartial", True)
    assert second.data() == (b"", True)


def test_nothing_is_read_before_the_first_attempt_attaches():
    read_end, write_end = os.pipe()
    os.write(write_end, b"for the job\n")
    feed = StdinFeed(os.fdopen(read_end, "rb", buffering=0))
    time.sleep(0.2)
    assert os.read(read_end, 100) == b"for the job\n"      # still in the pipe: a dry run reads nothing
    os.close(write_end)
    assert feed._reader is None


def test_a_send_stuck_past_the_wait_keeps_its_chunk_and_the_next_attempt_goes_on(monkeypatch):
    """An old attempt's send that never returns (a host that stopped reading) does not hold the run up; what it
    held is that attempt's, and the next attempt's bytes are still a contiguous run of the source."""
    monkeypatch.setattr(stdinfeed, "RETIRE_WAIT_S", 0.3)
    read_end, sent = numbered_lines(60, 0.002)
    release = threading.Event()
    stuck: list[bytes] = []

    def stuck_send(data):
        stuck.append(data)
        release.wait(20)
        raise OSError("Socket is closed")
    with os.fdopen(read_end, "rb", buffering=0) as source:
        feed = StdinFeed(source)
        feed.attach(stuck_send)
        wait_until(lambda: stuck)
        second = Attempt()
        thread = feed.attach(second.send)
        release.set()
        thread.join(20)
    got, ended = second.data()
    held, _ = decode(stuck[0])
    assert ended and held and sent.startswith(held) and sent.endswith(got) and held + got == sent


@pytest.mark.parametrize("limit", [64])
def test_the_reader_stays_at_most_its_limit_ahead(limit):
    read_end, sent = numbered_lines(50, 0.0)
    with os.fdopen(read_end, "rb", buffering=0) as source:
        feed = StdinFeed(source, limit=limit)
        first = Attempt(fail_after=0)             # gone at once: nothing is taken
        feed.attach(first.send)
        first.gone.wait(20)
        time.sleep(0.3)
        assert limit <= feed._held < limit + 65536 and not feed._ended     # it stopped reading, short of the end
        second = Attempt()
        feed.attach(second.send).join(20)
    assert second.data() == (sent, True)


def test_nothing_to_carry_is_no_feed(tmp_path):
    """/dev/null or an empty file: every rank gets EOF at once, and no relay is started for it."""
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    full = tmp_path / "full"
    full.write_bytes(b"x\n")
    with open(os.devnull, "rb") as null, open(empty, "rb") as e, open(full, "rb") as f:
        assert StdinFeed.of(None) is None and StdinFeed.of(null) is None and StdinFeed.of(e) is None
        assert isinstance(StdinFeed.of(f), StdinFeed)
        f.read()                          # read to its end already: nothing left
        assert StdinFeed.of(f) is None
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as pipe:
        assert isinstance(StdinFeed.of(pipe), StdinFeed)      # its writer may write yet: a feed, nothing read
        os.write(write_end, b"later\n")
        assert os.read(read_end, 100) == b"later\n"
    os.close(write_end)
    # a pipe at its end already (`true | clusterctl run`): nothing to carry, no relay
    read_end, write_end = os.pipe()
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        assert StdinFeed.of(pipe) is None


def test_a_pipe_already_written_keeps_what_was_read_to_look_first():
    """StdinFeed.of reads a pipe that is ready, to tell written from ended: those bytes are the feed's first."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"first\n")
    with os.fdopen(read_end, "rb", buffering=0) as source:
        feed = StdinFeed.of(source)
        assert isinstance(feed, StdinFeed)
        os.write(write_end, b"second\n")
        os.close(write_end)
        attempt = Attempt()
        feed.attach(attempt.send).join(20)
    assert attempt.data() == (b"first\nsecond\n", True)
