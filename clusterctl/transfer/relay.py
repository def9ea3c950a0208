"""A model pushed to several hosts once over this machine's link: the hosts pass the bytes on to each other over
their data-plane addresses (docs/models.md#relay).

    outcomes, fallback = relay(connector, hosts, model, wanted, ...)   # host -> HostOutcome; hosts to push directly

Why: this machine's link is often the slowest one (a laptop on Wi-Fi) while the hosts are joined by Thunderbolt or
10 GbE; pushing to N hosts from here sends every byte N times over it. Here it goes once, to the first host of a
chain, and each host sends it on to the next while it still receives (a pipelined chain, as MPI's pipelined
broadcasts: the whole push takes about as long as one host's).

Each round:
  1. every host: its push's hold and prepare (storepush.HostPush), exactly as a direct push's: what it holds
     verified, what it holds of an unfinished file (a push cut off), what it lacks;
  2. a hop starts on every host (hosts/scripts/relay.py), listening on the host's data-plane `address` for one
     connection that opens with a token of its own (sent to it on stdin with the environment);
  3. the chain: the hosts in inventory order (a Thunderbolt ring's addresses are reachable from the host before),
     rotated to begin at the host holding the most (a cut-off push's first host, or one that has it all). This machine
     connects to the first hop (through the SSH connection's port forwarding; straight over the data plane when
     this machine is a host of the cluster), each hop to the next; a hop that cannot reach the next ends its chain
     there and the next host begins another, fed from here. The route is told (`on_route`) before bytes move;
  4. for each file the offset each hop receives it from (`offsets`): a host's own bytes never cross a link
     again (it sends on what it holds from its disk), so a push cut off anywhere continues where each host
     stopped; then the bytes;
  5. every host hashes what arrived (finish). A host still lacking files (a hop cut off, a file that did not
     match and was deleted) goes round again, the chain rebuilt from what each holds, while a round moves bytes.
A host whose hop could not start (its address is not its own) is handed back to be pushed directly.
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import socket
import threading
import time
from typing import Callable, Mapping, Sequence

from ..errors import CommandFailed, CommandTimeout, ModelStoreError
from ..hosts.connector import Connector
from ..hosts.fanout import HostOutcome, in_background, run_all
from ..hosts.scripts import program
from ..hosts.scripts.relay import TOKEN_ENV   # the hop reads the token under the name it gives
from ..inventory import Host
from . import remotefiles
from .localmodel import LocalModel
from .storepush import PARTS, HostPush, Progress, Route

START_S = 30.0          # a hop's answer with its port
REACH_S = 25.0          # a hop's word on reaching the next (relay.py tries for 10 s)
WAIT_S = 120.0          # how long a hop waits for its upstream
ROUNDS = 3
CHUNK = 1 << 20


def offsets(chain: Sequence["Hop"], rel: str) -> list[int]:
    """For each hop of `chain`, the offset from which it receives `rel` (pure). A hop that wants the file receives
    from what it holds; one that does not receives what the hops after it need beyond what it holds, and sends
    them the rest from its disk."""
    size = chain[0].files[rel][0]
    out, after = [], size
    for hop in reversed(chain):
        _, have, want, _ = hop.files[rel]
        after = min(have if want else size, max(have, after))
        out.append(after)
    return out[::-1]


def rotate(hops: list["Hop"]) -> list["Hop"]:
    """The chain's order: inventory order, beginning at the host holding the most of the model (the first, when
    none holds more than another) (pure)."""
    if not hops:
        return hops
    first = max(range(len(hops)), key=lambda i: (hops[i].held, -i))
    return hops[first:] + hops[:first]


class Hop:
    """One host's relay hop in a round: what it holds and wants, its process, and what it says."""

    def __init__(self, hp: HostPush, model: LocalModel, modes: Mapping[str, int]):
        self.hp, self.name = hp, hp.host.name
        send = set(hp.plan.get("send", []))
        self.files: dict[str, list] = {}       # rel -> [size, have, want, mode]
        for f in model.files:
            want = f.path in hp.want and not hp.complete and f.path in send
            self.files[f.path] = [f.size, have_of(hp, f.path), want, modes[f.path]]
        self.held = sum(f[1] for f in self.files.values())
        self.wanted_held = sum(f[1] for rel, f in self.files.items() if rel in hp.want)
        self.need = sum(f[0] - f[1] for f in self.files.values() if f[2])
        self.token = secrets.token_hex(16)
        self.lines: queue.Queue = queue.Queue()
        self.cond = threading.Condition()
        self.port: int | None = None
        self.reach: dict | None = None         # {"next", "ok", "error"}
        self.answer: dict | None = None        # the hop's last line
        self.got = self.sent = 0
        self.lost: str | None = None
        self.ended = False
        self.errors: list[str] = []
        self.upstream = "this machine"
        self.proc = None

    def start(self, progress: Progress | None) -> None:
        host = self.hp.host
        request = {"root": self.hp.plan["path"], "listen": host.address, "dir": self.hp.plan["path"],
                   "source": self.hp.plan["path"], "parts": PARTS, "wait": WAIT_S, "files": self.files}
        argv = [host.python, "-c", program("relay.py"), remotefiles.argument(self.hp.transport, request)]
        self.proc = self.hp.transport.stream(argv, self.lines, env={TOKEN_ENV: self.token})
        threading.Thread(target=self._read, args=(progress,), name=f"relay-{self.name}", daemon=True).start()

    def _read(self, progress: Progress | None) -> None:
        while True:
            try:
                is_err, line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and not any(t.is_alive() for t in self.proc.readers) \
                        and self.lines.empty():
                    break
                continue
            try:
                msg = None if is_err else json.loads(line)
            except ValueError:
                msg = None
            with self.cond:
                if not isinstance(msg, dict):
                    self.errors.append(line)
                elif "port" in msg:
                    self.port = int(msg["port"])
                elif "next" in msg:
                    self.reach = msg
                elif "lost" in msg:
                    self.lost = str(msg.get("error"))
                elif "done" in msg:
                    self.answer = msg
                if isinstance(msg, dict) and "got" in msg:
                    self.got, self.sent = int(msg["got"]), int(msg["sent"])
                self.cond.notify_all()
            if isinstance(msg, dict) and "got" in msg and progress is not None and self.need:
                progress(self.name, min(self.got, self.need), self.need)
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def wait_for(self, what: Callable[[], object], timeout: float) -> bool:
        with self.cond:
            self.cond.wait_for(lambda: what() or self.ended, max(0.0, timeout))
            return bool(what())

    def failure(self) -> str:
        """Why this hop did not get all it wanted, in a few words."""
        if self.answer is not None and self.answer.get("error"):
            return f"its relay from {self.upstream}: {self.answer['error']}"
        tail = " ".join(self.errors[-1:])[:200]
        return f"its relay from {self.upstream} ended" + (f": {tail}" if tail else " before the model arrived")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def relay(connector: Connector, hosts: Sequence[Host], model: LocalModel, wanted: Mapping[str, list[str]], *,
          verify: bool, progress: Progress | None, bwlimit_kbps: int | None, deadline: float,
          on_route: Callable[[Route], None] | None, also_direct: Mapping[str, str]) -> tuple[dict, set[str]]:
    """Push `model` to `hosts` (each with a data-plane address) relayed: host name -> HostOutcome for each host
    the relay served, and the names of those to push directly instead (their hop could not start)."""
    end = time.monotonic() + deadline
    modes = {f.path: os.stat(os.path.join(model.root, f.path)).st_mode & 0o777 for f in model.files}
    from_plane = any(h.local and h.address for h in connector.cluster.hosts)

    def open_one(host: Host) -> HostPush:
        hp = HostPush(connector, host, model, wanted[host.name], verify).__enter__()
        try:
            hp.prepare()
        except BaseException:
            hp.__exit__(None, None, None)
            raise
        return hp

    opened = run_all(hosts, open_one, max(1.0, end - time.monotonic()))
    outcomes = {name: o for name, o in opened.failed.items()}
    pushes = [o.value for o in opened.ok.values()]
    fallback: set[str] = set()
    why: dict[str, str] = {}
    dead: dict[str, BaseException] = {}        # hosts that failed outright (their connection): out of later rounds
    try:
        for round_no in range(ROUNDS):
            live = [hp for hp in pushes if hp.host.name not in fallback and hp.host.name not in dead]
            if all(hp.complete for hp in live) or time.monotonic() > end:
                break
            hops = [Hop(hp, model, modes) for hp in live]
            moved = _round(connector, hops, model, progress, bwlimit_kbps, end, from_plane, fallback, dead,
                           on_route, round_no, also_direct, why)
            if not moved:
                break
        for hp in pushes:
            if hp.host.name in fallback:
                continue
            if hp.host.name in dead:
                outcomes[hp.host.name] = HostOutcome(hp.host, error=dead[hp.host.name])
            elif hp.complete:
                outcomes[hp.host.name] = HostOutcome(hp.host, value=hp.result())
            else:
                outcomes[hp.host.name] = HostOutcome(hp.host, error=ModelStoreError(
                    f"{why.get(hp.host.name, 'the relay did not complete it')}: push again to continue from "
                    "what it holds"))
    finally:
        for hp in pushes:
            hp.__exit__(None, None, None)
    return outcomes, fallback


def _round(connector: Connector, hops: list[Hop], model: LocalModel, progress: Progress | None,
           bwlimit_kbps: int | None, end: float, from_plane: bool, fallback: set[str], dead: dict[str, BaseException],
           on_route: Callable[[Route], None] | None, round_no: int, also_direct: Mapping[str, str],
           why: dict[str, str]) -> int:
    """One round (the module's steps 2-5): the bytes the hosts wanting files received."""
    route = Route(direct=dict(also_direct), again=round_no > 0)
    chains: list[tuple[list[Hop], object]] = []
    try:
        for hop in hops:
            try:
                hop.start(progress)
            except Exception as e:  # noqa: BLE001 - the host's own outcome
                dead[hop.name] = lost(hop, e)
        hops = [h for h in hops if h.name not in dead]
        for hop in hops:
            if not hop.wait_for(lambda hop=hop: hop.port, min(START_S, end - time.monotonic())):
                fallback.add(hop.name)
                said = (hop.answer or {}).get("error") or " ".join(hop.errors[-1:])[:200] or "no answer"
                route.direct[hop.name] = f"its relay could not start: {said}"
                hop.hp.__exit__(None, None, None)          # its hold, for the direct push to take
        chains = _chains(connector, rotate([h for h in hops if h.name not in fallback]), from_plane, route, end)
        if on_route is not None and (route.chains or route.direct):
            on_route(route)
        senders = [in_background(_send, conn, chain, model, bwlimit_kbps) for chain, conn in chains]
        for chain, conn in chains:
            for hop in chain:
                hop.wait_for(lambda hop=hop: hop.answer, end - time.monotonic())
            conn.close()
        for sender in senders:
            try:
                route.sent_here += sender.result(timeout=max(0.0, end - time.monotonic()))
            except Exception:  # noqa: BLE001 - the hops' own answers say what became of the bytes
                pass
    finally:
        for hop in hops:
            hop.stop()
    live = [h for chain, _ in chains for h in chain]
    finished = run_all([h.hp.host for h in live], lambda host: _finish(next(h for h in live if h.hp.host is host)),
                       max(1.0, end - time.monotonic()))
    moved = 0
    for hop in live:
        error = finished[hop.name].error
        if error is not None:
            dead[hop.name] = lost(hop, error)
            continue
        # what arrived: the hop's own count when it ended well, else what the host holds now beyond what it held
        received = hop.got if hop.answer and hop.answer.get("done") else max(hop.got, held(hop.hp) - hop.wanted_held)
        if received:
            hop.hp.sent([rel for rel, f in hop.files.items() if f[2]], received, "relay", f"relayed from {hop.upstream}")
            moved += received
        if not hop.hp.complete:
            why[hop.name] = f"{hop.name}: {hop.failure()}"
    return moved


def lost(hop: Hop, error: BaseException) -> BaseException:
    """A host that failed outright during the push: a helper's own failure as it is; the connection gone (the host
    stopped, slept, or its sshd died) in one line saying so: what it holds is kept for the next push."""
    if isinstance(error, (CommandFailed, CommandTimeout, ModelStoreError)):
        return error
    said = " ".join(str(error).split()).removeprefix(f"{hop.name}: ")
    return ModelStoreError(f"{hop.name}: the connection to it was lost during the push ({said}): once it answers "
                           "again, push again to continue from what it holds")


def have_of(hp: HostPush, rel: str) -> int:
    """Bytes of `rel` the host holds, as its last prepare (or finish) found them: a verified file all of them, an
    unfinished one its partial copy (a damaged copy moved aside is no basis to send on: 0), one it does not want 0."""
    if rel not in hp.want:
        return 0
    size = hp.model.file(rel).size
    if hp.complete or rel not in hp.plan.get("send", []):
        return size
    return 0 if rel in hp.plan.get("damaged", []) else int(hp.plan.get("resume", {}).get(rel, 0))


def held(hp: HostPush) -> int:
    """Bytes of the files the host wants that it holds (have_of)."""
    return sum(have_of(hp, rel) for rel in hp.want)


def _finish(hop: Hop) -> None:
    """Hash what arrived; a host still lacking files prepares again (what it holds now) for the next round."""
    if hop.hp.complete:
        return
    hop.hp.finish()
    if not hop.hp.complete:
        hop.hp.prepare()


def _chains(connector: Connector, hops: list[Hop], from_plane: bool, route: Route,
            end: float) -> list[tuple[list[Hop], object]]:
    """The chains and this machine's connection to each one's first hop (the module's step 3)."""
    chains = []
    while hops:
        head = hops[0]
        try:
            conn = _connect(head, from_plane)
            rest = [[h.name, h.hp.host.address, h.port, h.token] for h in hops[1:]]
            conn.sendall((head.token + "\n" + json.dumps({"route": rest}) + "\n").encode())
        except OSError as e:
            route.direct[head.name] = f"this machine cannot reach its relay: {' '.join(str(e).split())}"
            hops = hops[1:]
            continue
        chain = [head]
        for here, there in zip(hops, hops[1:]):
            if not here.wait_for(lambda here=here: here.reach, min(REACH_S, end - time.monotonic())) \
                    or not here.reach.get("ok"):
                error = (here.reach or {}).get("error") or here.failure()
                route.notes.append(f"{here.name} cannot reach {there.name} on the data plane ({error}): "
                                   f"{there.name} begins another chain")
                break
            there.upstream = here.name
            chain.append(there)
        route.chains.append([h.name for h in chain])
        route.via[head.name] = "data plane" if from_plane or head.hp.host.local else "ssh"
        chains.append((chain, conn))
        hops = hops[len(chain):]
    return chains


def _connect(head: Hop, from_plane: bool):
    host = head.hp.host
    if from_plane or host.local:
        return socket.create_connection((host.address, head.port), timeout=REACH_S)
    return head.hp.transport.connect_tcp(host.address, head.port, REACH_S)


def _send(conn, chain: list[Hop], model: LocalModel, bwlimit_kbps: int | None) -> int:
    """The plan, then each file's bytes from the first hop's offset, to the chain's first hop: bytes sent."""
    plan = [[f.path, offsets(chain, f.path)] for f in model.files if any(h.files[f.path][2] for h in chain)]
    conn.sendall((json.dumps({"files": plan}) + "\n").encode())
    rate = bwlimit_kbps * 1024 if bwlimit_kbps else None
    start, sent = time.monotonic(), 0
    for rel, offs in plan:
        with open(os.path.join(model.root, rel), "rb") as f:
            f.seek(offs[0])
            left = model.file(rel).size - offs[0]
            while left > 0:
                data = f.read(min(left, CHUNK))
                if not data:
                    raise ModelStoreError(f"{rel} in {model.root} became shorter during the push")
                left -= len(data)
                try:
                    conn.sendall(data)
                except OSError:       # the first hop went away: the hops' answers say what arrived
                    return sent
                sent += len(data)
                if rate:
                    ahead = sent / rate - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)
    return sent
