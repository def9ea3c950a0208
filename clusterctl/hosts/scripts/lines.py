"""A stream's bytes -> complete lines and progress-bar redraws, as a terminal would show them; part of the rank
bootstrap (bootstrap.py). A \\r that something other than \\n follows makes the line a bar: each \\r starts a
redraw, the last non-blank state is what the line shows. feed() and end() return ("line", text) for every line
that ended (a bar's final state; \\r\\n counts as \\n) and ("bar", text) for the current bar's latest state, at
most once every `every` seconds (tick() too, called from the heartbeat, so a stalled bar still shows its latest
state). Memory stays bounded: of a bar only its last complete state and the redraw in progress are kept,
and a line longer than MAX_LINE is cut into MAX_LINE pieces, each but the last ending in SPLIT (so the rank,
the rank starter and `run` never hold more of one line; docs/run.md#output-the-live-panel-and-metrics-lines).
Pure (time is passed in): tests/unit/test_bootstrap.py."""

BAR_EVERY_S = 1.0   # at most one progress-bar update a second per stream per rank
MAX_LINE = 64 * 1024
SPLIT = b" [clusterctl: line cut at 64 KiB, continued on the next line]"


class Lines:
    def __init__(self, every):
        self.every = every
        self.rest = b""         # the current line since its last \r (a trailing \r waits: \r\n or a redraw?)
        self.state = None       # a bar's last complete non-blank state (b"" before one); None: not a bar
        self.shown = b""        # the update last shown of the current line
        self.shown_at = None    # when the last update was shown (any line of this stream)

    def feed(self, data, now):
        *ended, partial = (self.rest + data).split(b"\n")
        out = []
        for line in ended:
            self.rest = line[:-1] if line.endswith(b"\r") else line
            out += self._cut(self._final(), last=True)
        self.rest = partial
        self._absorb()
        if len(self.rest) > MAX_LINE and not self.rest.endswith(b"\r"):
            # whole pieces only, and never all of it: the last piece waits for the line's end, so a line cuts
            # the same way however its bytes arrive (ceil(n / MAX_LINE) pieces, SPLIT on all but the last)
            cut = (len(self.rest) - 1) // MAX_LINE * MAX_LINE
            whole, self.rest = self.rest[:cut], self.rest[cut:]
            out += self._cut(whole, last=False)
            self.state, self.shown = None, b""
        return out + self.tick(now)

    @staticmethod
    def _cut(text, last):
        """`text` as lines of at most MAX_LINE bytes (and SPLIT); `last`: its final piece ends the line."""
        if len(text) <= MAX_LINE and last:
            return [("line", text)]
        pieces = [text[i:i + MAX_LINE] for i in range(0, len(text), MAX_LINE)] or [b""]
        return [("line", p + (SPLIT if i < len(pieces) - 1 or not last else b"")) for i, p in enumerate(pieces)]

    def end(self):
        return [("line", self._final())] if self.rest or self.state is not None else []

    def tick(self, now):
        if self.state is None:
            return []
        drawing = self.rest.rstrip(b"\r")
        latest = drawing if drawing.strip() else self.state
        if not latest.strip() or latest == self.shown:
            return []
        if self.shown_at is not None and now - self.shown_at < self.every:
            return []
        self.shown, self.shown_at = latest, now
        return [("bar", latest)]

    def _absorb(self):
        body, held = (self.rest[:-1], b"\r") if self.rest.endswith(b"\r") else (self.rest, b"")
        *states, drawing = body.split(b"\r")
        for state in states:
            if state.strip() or self.state is None:
                self.state = state
        self.rest = drawing + held

    def _final(self):
        text = self.rest
        if self.state is not None or b"\r" in text:
            text = next((s for s in reversed(text.split(b"\r")) if s.strip()), self.state or b"")
        self.rest, self.state, self.shown = b"", None, b""
        return text
