"""Standard input in frames, for a command behind the watchdog (hosts/transport.py remote_command(stdin=True)),
which decodes them in POSIX sh: one line per frame, `d<text>` (the text and a newline), `p<text>` (the text
alone: the unterminated tail of a chunk), and `e` alone, the end of the data, after which the command's stdin
is at EOF while the channel, and the watchdog reading it, stay open. A piece of ranks.py (and transport.py's);
standard library only."""

STDIN_END = b"e\n"


def stdin_frames(data):
    """`data` (any chunk of a stream, as it was read) as frames: text lines pass whole, a chunk's tail without
    a newline passes as it is, NUL bytes are dropped (a shell variable cannot hold one)."""
    *lines, rest = data.replace(b"\0", b"").split(b"\n")
    return b"".join(b"d" + line + b"\n" for line in lines) + (b"p" + rest + b"\n" if rest else b"")
