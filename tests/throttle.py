"""A slow uplink from this machine, for benchmarks and tests: the documented stand-in for a laptop on Wi-Fi.

A user's laptop reaches its Macs over Wi-Fi (tens of MB/s, shared by every connection it opens), while the Macs
reach each other over Thunderbolt or Ethernet (far faster). The loopback test cluster (tests/sshcluster.py) has no
such asymmetry: every address is loopback. This module gives it one. A Throttle is a TCP forwarder in threads of
this process (standard library only): for each test host it listens on 127.0.0.1:<a port of its own> and forwards
every connection to the host's real sshd address:port.

  - this machine -> host: every byte of every connection passes through ONE token bucket shared by all of them
    (`rate` bytes/s in total: the uplink), so four parallel copies share the rate as on a real Wi-Fi link;
  - host -> this machine: forwarded as it comes (the laptop's downlink is not what a push is waiting on);
  - both directions are counted, in total and per host (`counters()`), so a benchmark can say how many bytes
    left this machine.

A benchmark points its OpenSSH clients at the throttle with an ssh_config whose `Host hN` blocks say
`HostName 127.0.0.1` and `Port <hN's throttle port>` (`ssh_config_text`): everything clusterctl, rsync or ssh
opens to a host from here goes through the limit, while the inventory's `address:` (the data plane the hosts use
between themselves) stays the host's own loopback address, unthrottled. Host keys are then recorded in
known_hosts as `[127.0.0.1]:PORT`; StrictHostKeyChecking accept-new works as for a direct connection.

    throttle = Throttle(rate=20e6).start()
    port = throttle.add("h1", ("127.1.5.11", 40022))       # 127.0.0.1:port now reaches h1's sshd
    ...
    throttle.counters()     # {"up": bytes this machine sent, "down": ..., "hosts": {"h1": {"up":..,"down":..}}, ...}
    throttle.reset()        # counters to zero (between a benchmark's cases)
    throttle.stop()         # closes the listeners and every forwarded connection

The bucket: each chunk read from this machine's side reserves its bytes first (the bucket may go into debt) and
waits until the debt is paid back at `rate`; at most `burst` bytes (default: 50 ms of the rate) accumulate while
the link is idle. Over any interval longer than a few chunks, this machine -> hosts carries at most
rate x seconds + burst bytes. Its CPU cost here is a recv and a sendall per chunk of at most 64 KiB (about 300 a
second at 20 MB/s); `cpu_seconds()` reports what this process spent, for a benchmark to show it is small.

Run alone (for manual experiments), it forwards until Ctrl-C (or SIGTERM) and prints its counters:

    python tests/throttle.py --rate 20e6 h1=127.1.5.11:40022 h2=127.1.5.12:40022
"""
from __future__ import annotations

import argparse
import json
import resource
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

CHUNK = 64 * 1024


class TokenBucket:
    """`rate` bytes/s shared by every caller of take(); at most `burst` bytes saved up while idle."""

    def __init__(self, rate: float, burst: float | None = None):
        if rate <= 0:
            raise ValueError("rate must be positive (bytes per second)")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(CHUNK, rate * 0.05))
        self._tokens = self.burst
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        """Reserve n bytes, then wait until the bucket has paid for them (reservations are served in order)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate) - n
            self._last = now
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


@dataclass
class _Route:
    name: str
    target: tuple[str, int]
    listener: socket.socket
    port: int
    up: int = 0               # bytes this machine -> host
    down: int = 0             # bytes host -> this machine
    connections: int = 0
    thread: threading.Thread | None = None
    open: set = field(default_factory=set)   # live sockets (both ends of every forwarded connection)


class Throttle:
    """A TCP forwarder per host, this machine -> hosts limited to one shared `rate` (bytes/s). See the module
    docstring."""

    def __init__(self, rate: float, burst: float | None = None, listen: str = "127.0.0.1"):
        self.bucket = TokenBucket(rate, burst)
        self.listen = listen
        self.routes: dict[str, _Route] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._cpu0 = 0.0

    @property
    def rate(self) -> float:
        return self.bucket.rate

    def start(self) -> "Throttle":
        self._cpu0 = _cpu()
        return self

    def add(self, name: str, target: tuple[str, int], port: int = 0) -> int:
        """Forward 127.0.0.1:port (0: a free one) to `target`, counted as host `name`; returns the port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.listen, port))
        listener.listen(128)
        route = _Route(name, (target[0], int(target[1])), listener, listener.getsockname()[1])
        route.thread = threading.Thread(target=self._accept, args=(route,), name=f"throttle-{name}", daemon=True)
        with self._lock:
            if name in self.routes:
                listener.close()
                raise ValueError(f"{name} is forwarded already")
            self.routes[name] = route
        route.thread.start()
        return route.port

    def port(self, name: str) -> int:
        return self.routes[name].port

    def _accept(self, route: _Route) -> None:
        while not self._stopping:
            try:
                client, _ = route.listener.accept()
            except OSError:
                return                                  # the listener was closed: stop()
            # the connection to the host in a thread of its own: a frozen host holds up only its own clients
            threading.Thread(target=self._connect, args=(route, client), daemon=True).start()

    def _connect(self, route: _Route, client: socket.socket) -> None:
        try:
            server = socket.create_connection(route.target, timeout=10)
            server.settimeout(None)
        except OSError:
            client.close()                              # the host is down: the client sees the connection end
            return
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            route.connections += 1
            route.open.update((client, server))
        ended: list[bool] = []              # one entry per pump that has ended: the second closes both sockets
        threading.Thread(target=self._pump, args=(route, client, server, True, ended), daemon=True).start()
        self._pump(route, server, client, False, ended)

    def _pump(self, route: _Route, src: socket.socket, dst: socket.socket, up: bool, ended: list) -> None:
        """Copy src -> dst until src ends; `up` (this machine -> host) through the bucket. At the end the other
        direction is told (shutdown of dst's write side), and whichever pump ends second closes both."""
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                if up:
                    self.bucket.take(len(data))
                dst.sendall(data)
                with self._lock:
                    if up:
                        route.up += len(data)
                    else:
                        route.down += len(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._lock:
            ended.append(up)
            if len(ended) == 2:
                for s in (src, dst):
                    route.open.discard(s)
                    s.close()

    def counters(self) -> dict:
        """Bytes forwarded so far (since start or the last reset): in total and per host, and the CPU seconds
        this process has spent (all its threads: the throttle's, when nothing else here works)."""
        with self._lock:
            hosts = {n: {"up": r.up, "down": r.down, "connections": r.connections} for n, r in self.routes.items()}
        return {"up": sum(h["up"] for h in hosts.values()), "down": sum(h["down"] for h in hosts.values()),
                "hosts": hosts, "rate": self.rate, "cpu_s": round(self.cpu_seconds(), 3)}

    def reset(self) -> None:
        with self._lock:
            for r in self.routes.values():
                r.up = r.down = r.connections = 0
        self._cpu0 = _cpu()

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of this process since start() or reset()."""
        return _cpu() - self._cpu0

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.counters(), f, indent=2)

    def stop(self) -> None:
        """Close the listeners and every forwarded connection (an SSH master kept through it ends)."""
        self._stopping = True
        with self._lock:
            routes = list(self.routes.values())
            sockets = [s for r in routes for s in r.open]
            for r in routes:
                r.open.clear()
        for r in routes:
            try:
                r.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            r.listener.close()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for r in routes:
            if r.thread is not None:
                r.thread.join(5)

    def __enter__(self) -> "Throttle":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def ssh_config_text(cluster, throttle: Throttle) -> str:
    """The test cluster's ssh_config (tests/sshcluster.py write_ssh_config) with every host reached through the
    throttle: HostName 127.0.0.1 and the host's throttle port; the rest (user, key, known_hosts, accept-new,
    BatchMode, the classic key exchange) as the cluster's own."""
    text = cluster.ssh_config.read_text()
    for h in cluster.hosts:
        block = f"Host {h.name}\n  HostName {h.address}\n  Port {h.port}\n"
        if block not in text:
            raise ValueError(f"{cluster.ssh_config}: no block for {h.name} as sshcluster writes it")
        text = text.replace(block, f"Host {h.name}\n  HostName 127.0.0.1\n  Port {throttle.port(h.name)}\n")
    return text


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20e6, help="bytes/s this machine -> hosts, shared (20e6)")
    parser.add_argument("routes", nargs="+", metavar="NAME=ADDRESS:PORT", help="a host to forward to")
    args = parser.parse_args()
    # Ctrl-C or SIGTERM end it (a shell starting it in the background without job control ignores SIGINT for it)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    throttle = Throttle(args.rate).start()
    for spec in args.routes:
        name, _, target = spec.partition("=")
        address, _, port = target.rpartition(":")
        print(f"{name}: 127.0.0.1:{throttle.add(name, (address, int(port)))} -> {address}:{port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        print(json.dumps(throttle.counters(), indent=2))
        throttle.stop()


if __name__ == "__main__":
    main()
