"""Standard input for every rank of a launcher that gives its own to rank 0 alone (mpirun:
docs/facts/launchers.md#mpirun-stdin-all): a relay on every host (hosts/scripts/stdinrelay.py), behind the
watchdog, fed the same frames of `run`'s stdin, makes a FIFO per rank of that host, which the rank's
bootstrap opens as its stdin (CLUSTERCTL_STDIN_RELAY holds the attempt's FIFO tag). The relays start beside
the launcher, not before it: a rank whose FIFO is not there yet waits for it (bootstrap.py), and the launch
fails if a relay does not say `ready` in READY_TIMEOUT seconds. The launcher's Process, wrapped: the relays
end with it (docs/facts/launchers.md#our-stdin-relay).
"""
from __future__ import annotations

import queue
import time
from typing import Callable

from ..errors import LaunchError
from ..hosts import hostscript
from ..hosts.connector import Connector
from ..hosts.scripts.contract import READY
from ..hosts.stdinfeed import StdinFeed
from ..hosts.transport import Process, Transport
from ..inventory import Cluster

READY_TIMEOUT_S = 30.0


class Relayed(Process):
    """The launcher's process, with the stdin relays it needs: they stop when it ends or is stopped."""

    def __init__(self, launcher: Process, relays: list[tuple[Transport, Process]]):
        self.launcher, self.relays = launcher, relays
        self.readers = launcher.readers

    def poll(self) -> int | None:
        code = self.launcher.poll()
        if code is not None:
            self._stop_relays()
        return code

    def wait(self, timeout: float) -> int:
        code = self.launcher.wait(timeout)
        self._stop_relays()
        return code

    def stop(self) -> None:
        self.launcher.stop()
        self._stop_relays()

    def _stop_relays(self) -> None:
        relays, self.relays = self.relays, []
        for transport, relay in relays:
            relay.stop()        # its watchdog kills it; it removes the FIFOs no rank opened
            transport.close()


def relayed_start(cluster: Cluster, connector: Connector, run_id: str, tag: str, rank_hosts: list[str],
                  source: StdinFeed, start: Callable[[queue.Queue], Process]) -> Callable[[queue.Queue], Process]:
    """`start` (the launcher's) beside a relay on every host, then, once each relay is ready, this attempt's
    share of `source`: the same frames to every relay. A relay that is gone is dropped; once every one is,
    the attempt is over and the chunk goes back to the feed for the next attempt (hosts/stdinfeed.py).
    `tag`: this attempt's, in its FIFOs' names (a FIFO an earlier attempt left is never opened)."""
    def with_relays(lines: queue.Queue) -> Process:
        started = start_relays(cluster, connector, run_id, tag, rank_hosts)
        relays = [(t, p) for t, p, _, _ in started]
        try:
            launcher = start(lines)
        except BaseException:
            Relayed(_Ended(), relays).stop()
            raise
        try:
            for _, relay, said, name in started:
                _wait_ready(relay, said, name)
        except BaseException:
            Relayed(launcher, relays).stop()
            raise
        live = [relay for _, relay in relays]

        def send(data: bytes) -> None:
            for relay in list(live):
                try:
                    relay.feed(data)
                except (OSError, ValueError, EOFError):
                    live.remove(relay)      # that host's relay is gone: the others still get theirs
            if not live:
                raise EOFError("every host's stdin relay is gone")
        source.attach(send)
        return Relayed(launcher, relays)
    return with_relays


def start_relays(cluster: Cluster, connector: Connector, run_id: str, tag: str,
                 rank_hosts: list[str]) -> list[tuple[Transport, Process, queue.Queue, str]]:
    """A relay started on every host that runs ranks: (transport, process, its output lines, host name)."""
    started = []
    try:
        for host in cluster.hosts:
            ranks = [str(rank) for rank, name in enumerate(rank_hosts) if name == host.name]
            if not ranks:
                continue
            transport = connector.transport(host)
            lines: queue.Queue = queue.Queue()
            relay = hostscript.start(transport, host.python, "stdinrelay.py", connector.rank_files_dir(host, run_id), tag,
                                     *ranks, lines=lines, stdin=True)
            started.append((transport, relay, lines, host.name))
    except BaseException:
        Relayed(_Ended(), [(t, p) for t, p, _, _ in started]).stop()
        raise
    return started


def _wait_ready(relay: Process, lines: queue.Queue, host: str) -> None:
    deadline, said = time.monotonic() + READY_TIMEOUT_S, []
    while time.monotonic() < deadline:
        try:
            is_err, line = lines.get(timeout=0.2)
        except queue.Empty:
            if relay.poll() is not None and not any(t.is_alive() for t in relay.readers) and lines.empty():
                break
            continue
        if not is_err and line == READY:
            return
        said.append(line)
    last = said[-1] if said else f"no answer in {READY_TIMEOUT_S:g}s"
    raise LaunchError(f"the ranks' stdin relay did not start on {host}: {last} (or use run --no-stdin)")


class _Ended(Process):
    readers: list = []

    def poll(self) -> int | None:
        return 0

    def wait(self, timeout: float) -> int:
        return 0

    def stop(self) -> None:
        pass
