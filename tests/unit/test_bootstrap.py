"""The bootstrap's pure parts, run from the very text every rank runs (bootstrap.LINES): splitting
output into lines and progress-bar redraws."""
from clusterctl.launch.bootstrap import BAR_EVERY_S, BOOTSTRAP, LINES

SNIPPETS: dict = {}
exec(LINES, SNIPPETS)
Lines = SNIPPETS["Lines"]


def feed_all(chunks, every=1.0, step=0.01):
    """Feed `chunks` (bytes) one by one, `step` seconds apart; every item out, then the end."""
    lines, out = Lines(every), []
    for i, chunk in enumerate(chunks):
        out += lines.feed(chunk, i * step)
    return out + lines.end()


def test_the_snippets_are_the_bootstrap_s_own():
    assert LINES in BOOTSTRAP and f"Lines({BAR_EVERY_S!r})" in BOOTSTRAP


def test_plain_lines_pass_through_as_they_are():
    assert feed_all([b"one\ntw", b"o\n\nthree"]) == [("line", b"one"), ("line", b"two"), ("line", b""),
                                                     ("line", b"three")]
    assert feed_all([b"  indented  \n"]) == [("line", b"  indented  ")]
    assert feed_all([]) == [] and feed_all([b""]) == []


def test_crlf_is_a_line_end_even_split_across_reads():
    assert feed_all([b"a\r\nb\r", b"\nc\r\n"]) == [("line", b"a"), ("line", b"b"), ("line", b"c")]
    # a trailing \r waits for what follows: no bar update for "b" before its \n arrives
    lines = Lines(0.0)
    assert lines.feed(b"b\r", 0.0) == [] and lines.feed(b"\n", 5.0) == [("line", b"b")]


def test_a_bar_shows_its_first_state_then_at_most_one_update_a_second_and_always_its_final_state():
    chunks = [b"\r%3d%%|%s|" % (i, b"#" * (i // 10)) for i in range(101)] + [b"\n"]
    out = feed_all(chunks, every=1.0, step=0.03)      # 101 redraws over 3 s
    bars = [text for kind, text in out if kind == "bar"]
    assert out[-1] == ("line", b"100%|##########|")
    assert [kind for kind, _ in out].count("line") == 1
    assert bars[0] == b"  0%||" and 3 <= len(bars) <= 5, bars


def test_the_final_state_is_the_last_non_blank_redraw():
    assert feed_all([b"\r 50%\r100%\r    \r\n"]) == [("line", b"100%")]
    assert feed_all([b"working...\rdone      \n"]) == [("line", b"done      ")]
    assert feed_all([b"\r\r\n"]) == [("line", b"")]


def test_a_bar_then_lines_then_another_bar():
    out = feed_all([b"\rA 1/2", b"\rA 2/2\nlog line\n\rB 1/3\rB 3/3", b"\nend"], every=100.0)
    assert [x for x in out if x[0] == "line"] == [("line", b"A 2/2"), ("line", b"log line"), ("line", b"B 3/3"),
                                                  ("line", b"end")]
    assert [x for x in out if x[0] == "bar"] == [("bar", b"A 1/2")]    # one update per 100 s here


def test_a_bar_split_mid_state_shows_the_partial_state_live_but_ends_whole():
    lines = Lines(0.0)
    assert lines.feed(b"\r 10%|#", 0.0) == [("bar", b" 10%|#")]
    assert lines.feed(b"#  |", 1.0) == [("bar", b" 10%|##  |")]
    assert lines.feed(b"\r 20%|###|", 2.0) == [("bar", b" 20%|###|")]
    assert lines.feed(b"\r 20%|###|", 3.0) == []                       # the same state is not shown again
    assert lines.end() == [("line", b" 20%|###|")]                    # the stream ended mid-bar


def test_tick_shows_a_stalled_bar_s_latest_state_once():
    lines = Lines(1.0)
    assert lines.feed(b"\r1%", 0.0) == [("bar", b"1%")]
    assert lines.feed(b"\r2%\r3%", 0.5) == []                          # too soon
    assert lines.tick(1.0) == [("bar", b"3%")] and lines.tick(5.0) == []
    assert lines.tick(6.0) == [] and Lines(1.0).tick(9.0) == []


def test_a_bar_s_memory_stays_bounded():
    lines = Lines(1.0)
    for i in range(20000):
        lines.feed(b"\r%d%%|%s|" % (i, b"#" * 40), i * 0.001)
    assert len(lines.rest) < 100 and lines.end() == [("line", b"19999%|" + b"#" * 40 + b"|")]
