"""One hop of a relayed model push (transfer/relay.py, docs/models.md#relay), run on a host as
`python -c <this file> REQUEST` (standard library only). It listens on the host's data-plane address, takes one
connection that opens with this push's token (CLUSTERCTL_RELAY_TOKEN, given on stdin with the environment, never on
a command line), passes the route on to the next host, then takes the model's bytes from upstream, writes what this
host lacks into its partial directory and sends on, chunk by chunk, what the next host lacks: the next host
receives while this one still does (a pipelined chain). A file held here (verified, or the part of it that
arrived before a cut) is sent on from this host's disk, so what a host holds never crosses a link again.

REQUEST (JSON, from this machine): listen (the address to listen on), dir (this push's partial directory on the
host), source (where this host's verified files are: dir, or its complete entry), parts (the partial copies'
directory name beside each file), wait (seconds to wait for upstream), files {rel: [size, have, want, mode]}:
`have` bytes of rel are here already (a verified file: all of them, in source; an unfinished one: its partial
copy), `want`: this host needs the rest.

What arrives from upstream, in order: TOKEN line; {"route": [[name, address, port, token], ...]} (the hops after
this one); {"files": [[rel, [offset, ...]], ...]} (for each file the offset from which each remaining hop
receives it, this one first); then each listed file's bytes from this hop's offset to its end, back to back.
This hop sends the next the same, the route and offsets less its own entry.

It prints JSON lines: {"port"}, {"next", "ok", "error"}, {"got", "sent"} (bytes written here and sent on; at most
every PROGRESS_S), {"lost", "error"} (the next host went away: this one goes on for itself), and last the answer
{"done", "got", "sent", "error"}. A file is renamed to its place when its last byte is written; a hop cut off
leaves its partial copies, which the next push continues.
"""
import hmac
import json
import os
import socket
import sys
import time

from .contract import TOKEN_ENV, read_request, reply

CHUNK = 1 << 20
PROGRESS_S = 0.5
CONNECT_S = 10.0          # how long a hop tries to reach the next
IDLE_S = 120.0            # no byte from upstream for this long: the hop gives up (the push says which)


def say(**kv):
    reply(kv)


class Upstream:
    """Lines and exact byte counts from a socket."""

    def __init__(self, conn):
        self.conn, self.buf = conn, b""

    def line(self, limit=1 << 22):
        while b"\n" not in self.buf:
            if len(self.buf) > limit:
                raise ValueError("upstream sent a line longer than %d bytes" % limit)
            data = self.conn.recv(65536)
            if not data:
                raise EOFError("upstream closed the connection")
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode("utf-8")

    def chunks(self, n):
        """n bytes, in pieces of at most CHUNK; EOFError when upstream ends first."""
        if self.buf:
            head, self.buf = self.buf[:n], self.buf[n:]
            n -= len(head)
            yield head
        while n > 0:
            data = self.conn.recv(min(n, CHUNK))
            if not data:
                raise EOFError("upstream ended with %d bytes of the file still to come" % n)
            n -= len(data)
            yield data


def accept(srv, token, wait):
    """The connection that opens with `token`; others (a stray client, a port scan) are closed unread."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        srv.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            break
        conn.settimeout(5.0)
        up = Upstream(conn)
        try:
            ok = hmac.compare_digest(up.line(256).encode(), token.encode())
        except (OSError, ValueError, EOFError, UnicodeDecodeError):
            ok = False
        if ok:
            conn.settimeout(IDLE_S)
            return up
        conn.close()
    raise TimeoutError("no upstream connection within %.0f s" % wait)


def reach(route):
    """A connection to the first hop of `route`, its token and the rest of the route sent; None (said) if it
    cannot be reached within CONNECT_S."""
    name, address, port, token = route[0]
    deadline, error = time.monotonic() + CONNECT_S, "no attempt"
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((address, int(port)), timeout=max(0.5, deadline - time.monotonic()))
            s.settimeout(IDLE_S)
            s.sendall((token + "\n" + json.dumps({"route": route[1:]}) + "\n").encode())
            say(next=name, ok=True)
            return s
        except OSError as e:
            error = "%s:%s: %s" % (address, port, e)
            time.sleep(0.2)
    say(next=name, ok=False, error=error)
    return None


class Hop:
    def __init__(self, req, up, down):
        self.req, self.up, self.down = req, up, down
        self.got = self.sent = 0
        self.said = 0.0

    def tell(self, force=False):
        now = time.monotonic()
        if force or now - self.said >= PROGRESS_S:
            self.said = now
            say(got=self.got, sent=self.sent)

    def send(self, data):
        if self.down is None:
            return
        try:
            self.down.sendall(data)
            self.sent += len(data)
        except OSError as e:
            say(lost=True, error=str(e))
            self.down.close()
            self.down = None

    def where(self, rel):
        d, base = os.path.split(os.path.join(self.req["dir"], rel))
        return os.path.join(d, self.req["parts"], base), os.path.join(d, base)

    def file(self, rel, offsets):
        size, have, want, mode = self.req["files"][rel]
        start = offsets[0]
        out = offsets[1] if len(offsets) > 1 and self.down is not None else None
        if not (0 <= start <= size and (out is None or 0 <= out <= size)) or (want and start > have):
            raise ValueError("refused: offsets %r for %s (size %d, %d here)" % (offsets, rel, size, have))
        part, final = self.where(rel)
        if out is not None and out < start:        # what this host holds, from its own disk
            held = part if want else os.path.join(self.req["source"], rel)
            with open(held, "rb") as f:
                f.seek(out)
                left = start - out
                while left > 0:
                    data = f.read(min(left, CHUNK))
                    if not data:
                        raise ValueError("refused: %s holds fewer bytes than the push counted on" % held)
                    left -= len(data)
                    self.send(data)
                    self.tell()
        fd = None
        if want:
            os.makedirs(os.path.dirname(part), exist_ok=True)
            fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
            os.ftruncate(fd, start)
            os.lseek(fd, start, os.SEEK_SET)
        try:
            pos = start
            for data in self.up.chunks(size - start):
                if fd is not None:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    self.got += len(data)
                if out is not None and pos + len(data) > out:
                    self.send(data[max(0, out - pos):])
                pos += len(data)
                self.tell()
        finally:
            if fd is not None:
                os.close(fd)
        if want:
            os.chmod(part, mode & 0o777)
            os.replace(part, final)


def relay(req, token):
    if len(token) < 16:
        return {"done": False, "got": 0, "sent": 0, "error": "refused: no relay token in the environment"}
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        srv.bind((req["listen"], 0))
        srv.listen(8)
    except OSError as e:
        srv.close()
        return {"done": False, "got": 0, "sent": 0, "error": "cannot listen on %s: %s" % (req["listen"], e)}
    say(port=srv.getsockname()[1])
    hop = None
    try:
        up = accept(srv, token, float(req.get("wait", 120)))
        srv.close()
        route = json.loads(up.line()).get("route") or []
        down = reach(route) if route else None
        hop = Hop(req, up, down)
        plan = json.loads(up.line())["files"]
        for rel, offsets in plan:
            if rel not in req["files"] or not offsets:
                raise ValueError("refused: %r is not a file of this push" % (rel,))
        hop.send((json.dumps({"files": [[rel, offsets[1:]] for rel, offsets in plan]}) + "\n").encode())
        for rel, offsets in plan:
            hop.file(rel, offsets)
        hop.tell(force=True)
        return {"done": True, "got": hop.got, "sent": hop.sent}
    except (OSError, ValueError, EOFError, TimeoutError) as e:
        return {"done": False, "got": hop.got if hop else 0, "sent": hop.sent if hop else 0, "error": str(e)}
    finally:
        srv.close()
        if hop is not None and hop.down is not None:
            hop.down.close()


if __name__ == "__main__":
    reply(relay(read_request(sys.argv[1]), os.environ.get(TOKEN_ENV, "")))
