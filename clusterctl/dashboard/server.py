"""The dashboard served: a listening socket on an address of this machine, the token, uvicorn running the app.

    page = Page(board, "127.0.0.1", 0)         # bound now: PortTaken / UsageError in one line before anything runs
    page.url                                   # http://127.0.0.1:PORT/?token=...
    page.run()                                 # until Ctrl-C or SIGTERM (uvicorn's own handlers); board closed after
                                               # (each open page's stream ends itself at the stop)
"""
from __future__ import annotations

import errno
import secrets
import socket

from ..errors import PortTaken, UsageError
from ..hosts.forward import is_loopback, listen
from .state import Board

LOOPBACK = "127.0.0.1"
GRACE_S = 3          # open pages' streams are cut after this long at a stop


def bind(address: str, port: int) -> socket.socket:
    """A listening socket on address:port (port 0: a free one), or PortTaken / UsageError in one line."""
    try:
        sock = listen(address, port)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise PortTaken(f"port {port} of {address} is in use: give another with --port, or --port 0 for a free "
                            "one") from None
        raise UsageError(f"cannot listen on {address} port {port}: {e.strerror or e} (--listen takes an address of "
                         "this machine)") from None
    sock.setblocking(False)
    return sock


class Page:
    def __init__(self, board: Board, address: str = LOOPBACK, port: int = 0):
        self.board = board
        self.sock = bind(address, port)
        self.token = secrets.token_urlsafe(24)
        shown = f"[{address}]" if ":" in address else address
        self.url = f"http://{shown}:{self.sock.getsockname()[1]}/?token={self.token}"
        self.exposed = not is_loopback(address)

    def run(self, debug: bool = False) -> None:
        """Serve until stopped. uvicorn's own log (a request's traceback among it) only with `debug`: a user sees
        one-line errors, as from every command."""
        import uvicorn

        from .app import build

        server = None
        app = build(self.board, self.token, stopping=lambda: server is not None and server.should_exit)
        server = uvicorn.Server(uvicorn.Config(app, log_level="debug" if debug else "critical", access_log=debug,
                                               timeout_graceful_shutdown=GRACE_S, lifespan="off"))
        try:
            server.run(sockets=[self.sock])
        finally:
            self.board.close()
            self.sock.close()
