"""Standard input in frames, for a command behind the watchdog (watchdog.sh; hosts/remote.py, stdin=True), which
decodes them in POSIX sh: one line per frame, `d<text>` (the text and a newline), `p<text>` (the text alone: the
unterminated tail of a chunk), and `e` alone, the end of the data, after which the command's stdin is at EOF while
the channel, and the watchdog reading it, stay open; then `k` lines, pulses, may follow. The shell prints a text
with printf's %b, so a NUL byte (which a shell variable cannot hold) and a backslash travel as %b's octal escapes:
every byte passes as it was sent. A piece of ranks.py (and stdinfeed.py's); standard library only."""

STDIN_END = b"e\n"
# a pulse: the sender is still there (a watchdog started with ALIVE counts the seconds since the last one); sent
# only after STDIN_END, or on a channel without stdin, where the watchdog's drain reads every line at once
PULSE = b"k\n"


def _escaped(text):
    return text.replace(b"\\", b"\\0134").replace(b"\0", b"\\0000")


def stdin_frames(data):
    """`data` (any chunk of a stream, as it was read) as frames: text lines pass whole, a chunk's tail without
    a newline passes as it is."""
    *lines, rest = data.split(b"\n")
    return b"".join(b"d" + _escaped(line) + b"\n" for line in lines) + (b"p" + _escaped(rest) + b"\n" if rest else b"")
