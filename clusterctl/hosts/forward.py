"""A port of this machine carried to a port as a host sees it, over the SSH connection to that host: what
`ssh -L PORT:127.0.0.1:REMOTE host` does, inside clusterctl (`serve` reaches a server that listens only on its
host's loopback this way, so nothing listens on the network).

    forward = Forward.bind(8080)                       # PortTaken when this machine's port is in use
    forward.point(transport, "127.0.0.1", 41234)       # where connections go (again after a restart)
    forward.start()
    ...                                                # http://127.0.0.1:8080 answers from the host
    forward.close()                                    # the port is free again; open connections end

Each connection accepted is one direct-tcpip channel of the transport's connection (transport.connect_tcp),
pumped both ways by one thread waiting in select() on the two ends; a connection the host cannot take (nothing
listens there yet, the host is away) is closed at once, which a client sees as a reset.
"""
from __future__ import annotations

import ipaddress
import select
import socket
import threading

from ..errors import ClusterctlError, PortTaken
from .transport import DEFAULT_CONNECT_TIMEOUT_S

CHUNK = 65536


def listen(address: str, port: int) -> socket.socket:
    """A socket listening on address:port of this machine (port 0: a free one); the OSError bind or listen gave,
    the socket closed. Connections just closed linger in TIME_WAIT: without SO_REUSEADDR the port could not be
    taken again for a minute after a stop (a second listener on it is still refused)."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP, bracketed or not, or a name) is a loopback address: only `localhost` by name."""
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return address.lower() == "localhost"


class Forward:
    def __init__(self, listener: socket.socket, address: str):
        self.listener = listener
        self.address = address
        self.port = listener.getsockname()[1]
        self._target: tuple[object, str, int] | None = None
        self._lock = threading.Lock()
        self._open: set = set()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def bind(cls, port: int, address: str = "127.0.0.1") -> Forward:
        """Listen on address:port of this machine (port 0: any free one); PortTaken when it is in use."""
        try:
            listener = listen(address, port)
        except OSError as e:
            raise PortTaken(f"port {port} on {address} is in use on this machine ({e.strerror}): give another "
                            f"with --port, or stop what listens there") from None
        return cls(listener, address)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def point(self, transport, address: str, port: int) -> None:
        """Carry every new connection to address:port as seen from `transport`'s host."""
        with self._lock:
            self._target = (transport, address, port)

    def start(self) -> Forward:
        self._thread = threading.Thread(target=self._accept, name=f"forward-{self.port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening (the port is free when this returns) and end every open connection."""
        self._closed.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            ends = list(self._open)
        for end in ends:
            _close(end)

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return        # closed
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        with self._lock:
            target = self._target
        if target is None:
            client.close()
            return
        transport, address, port = target
        try:
            far = transport.connect_tcp(address, port, DEFAULT_CONNECT_TIMEOUT_S)
        except (OSError, ClusterctlError):
            client.close()
            return
        with self._lock:
            self._open.update((client, far))
        try:
            pump(client, far, self._closed)
        finally:
            with self._lock:
                self._open.difference_update((client, far))
            _close(client)
            _close(far)


def pump(a, b, closed: threading.Event | None = None) -> None:
    """Copy bytes both ways between two streams (sockets or SSH channels) until both directions have ended."""
    ends = {a: b, b: a}
    shut: set = set()          # ends whose reading side has ended (their peer was told: shutdown of writing)
    while len(shut) < 2 and not (closed is not None and closed.is_set()):
        readable = [x for x in ends if x not in shut]
        try:
            ready, _, _ = select.select(readable, [], [], 1.0)
        except (OSError, ValueError):
            return
        for end in ready:
            try:
                data = end.recv(CHUNK)
            except OSError:
                return
            other = ends[end]
            if not data:
                shut.add(end)
                _shutdown_write(other)
                continue
            try:
                other.sendall(data)
            except OSError:
                return


def _shutdown_write(end) -> None:
    try:
        if hasattr(end, "shutdown_write"):
            end.shutdown_write()      # an SSH channel: EOF to the far side
        else:
            end.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _close(end) -> None:
    try:
        end.close()
    except OSError:
        pass
