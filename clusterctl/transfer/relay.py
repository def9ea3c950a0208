"""A model pushed to several hosts once over this machine's link: the hosts pass the bytes on to each other over
their data-plane addresses (docs/models.md#relay).

    RELAY.push(job, hosts, choices)     # the entry of transfer/routes.py: Pushed(host -> HostOutcome, hosts handed back)

Why: this machine's link is often the slowest one (a laptop on Wi-Fi) while the hosts are joined by Thunderbolt or
10 GbE; pushing to N hosts from here sends every byte N times over it. Here it goes once, to the first host of a
chain, and each host sends it on to the next while it still receives (a pipelined chain, as MPI's pipelined
broadcasts: the whole push takes about as long as one host's).

It takes two or more hosts with a data-plane `address` when the method is auto and --direct is not given
(RelayRoute.refusal; transfer/routes.py chooses). Every host follows the per-host sequence of any route (hold ->
prepare -> send -> finish, storepush.HostPush's steps), but the hosts take each step together, a round at a time,
since one stream feeds them all. Each round (RelayRounds holds what the rounds share and what each updates):
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
A host whose hop could not start (its address is not its own) is handed back, to be pushed directly.

RemoteHop is this machine's handle on one host's hop (hosts/scripts/relay.py, whose own Hop moves the bytes there):
its process, the files it holds and wants (HopFile), and what it says.
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

from ..errors import CommandFailed, CommandTimeout, ModelStoreError
from ..hosts.connector import Connector
from ..hosts.fanout import HostOutcome, in_background, run_all
from ..hosts import hostscript
from ..hosts.scripts.contract import TOKEN_ENV   # the hop reads the token under the name it gives
from ..inventory import Host
from . import remotefiles
from .localmodel import LocalModel
from .storepush import PARTS, Asked, Choice, HostPush, Job, ModelRoute, Progress, Pushed, Route

START_S = 30.0          # a hop's answer with its port
REACH_S = 25.0          # a hop's word on reaching the next (relay.py tries for 10 s)
WAIT_S = 120.0          # how long a hop waits for its upstream
ROUNDS = 3
CHUNK = 1 << 20


class HopFile(NamedTuple):
    """One file of the model as a hop sees it (and as its request carries it, a JSON list)."""

    size: int
    have: int          # bytes of it the host holds (relay.have_of)
    want: bool         # the host is to receive it
    mode: int


class RelayRoute(ModelRoute):
    """The relay as an entry of transfer/routes.py's ROUTES."""

    name = "relay"
    tells_route = True

    def refusal(self, asked: Asked, host: Host) -> str | None:
        if asked.direct:
            return "--direct"
        if asked.method != "auto":
            return f"--method {asked.method}"
        if not host.address:
            return "no data-plane address"
        return "the only host with a data-plane address" if asked.addressed < 2 else None

    def push(self, job: Job, hosts: Sequence[Host], choices: Mapping[str, Choice]) -> Pushed:
        return relay(job, hosts)


def offsets(chain: Sequence["RemoteHop"], rel: str) -> list[int]:
    """For each hop of `chain`, the offset from which it receives `rel` (pure). A hop that wants the file receives
    from what it holds; one that does not receives what the hops after it need beyond what it holds, and sends
    them the rest from its disk."""
    size = chain[0].files[rel].size
    out, after = [], size
    for hop in reversed(chain):
        f = hop.files[rel]
        after = min(f.have if f.want else size, max(f.have, after))
        out.append(after)
    return out[::-1]


def rotate(hops: list["RemoteHop"]) -> list["RemoteHop"]:
    """The chain's order: inventory order, beginning at the host holding the most of the model (the first, when
    none holds more than another) (pure)."""
    if not hops:
        return hops
    first = max(range(len(hops)), key=lambda i: (hops[i].held, -i))
    return hops[first:] + hops[:first]


class RemoteHop:
    """This machine's handle on one host's relay hop in a round: what the host holds and wants, the hop's process
    there, and what it says."""

    def __init__(self, hp: HostPush, model: LocalModel, modes: Mapping[str, int]):
        self.hp, self.name = hp, hp.host.name
        send = set(hp.plan.get("send", []))
        self.files: dict[str, HopFile] = {}
        for f in model.files:
            want = f.path in hp.want and not hp.complete and f.path in send
            self.files[f.path] = HopFile(f.size, have_of(hp, f.path), want, modes[f.path])
        self.held = sum(f.have for f in self.files.values())
        self.wanted_held = sum(f.have for rel, f in self.files.items() if rel in hp.want)
        self.need = sum(f.size - f.have for f in self.files.values() if f.want)
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
        self.proc = hostscript.start(self.hp.transport, host.python, "relay.py",
                                     remotefiles.argument(self.hp.transport, request), lines=self.lines,
                                     env={TOKEN_ENV: self.token})
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
                msg = None if is_err else hostscript.message(line)
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


@dataclass
class RelayRounds:
    """What a relay's rounds share (the push, its end on the monotonic clock, whether this machine is on the data
    plane) and what each round updates, only through the methods below: the hosts handed back to be pushed
    directly, the hosts lost outright (out of later rounds), and why a host is still without its model."""

    job: Job
    end: float
    from_plane: bool
    round_no: int = 0
    fallback: set[str] = field(default_factory=set)
    dead: dict[str, BaseException] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)

    def left(self) -> float:
        return self.end - time.monotonic()

    def out(self, hp: HostPush) -> bool:
        """The host takes no more part in the rounds: handed back, or lost."""
        return hp.host.name in self.fallback or hp.host.name in self.dead

    def hand_back(self, hop: RemoteHop, route: Route) -> None:
        """The hop could not start: the host is pushed directly instead, its hold released for that push to take."""
        self.fallback.add(hop.name)
        said = (hop.answer or {}).get("error") or " ".join(hop.errors[-1:])[:200] or "no answer"
        route.direct[hop.name] = f"its relay could not start: {said}"
        hop.hp.__exit__(None, None, None)

    def lose(self, hop: RemoteHop, error: BaseException) -> None:
        self.dead[hop.name] = lost(hop, error)

    def unfinished(self, hop: RemoteHop) -> None:
        self.why[hop.name] = f"{hop.name}: {hop.failure()}"

    def outcome(self, hp: HostPush) -> HostOutcome:
        """The host's outcome once the rounds are over (it was not handed back)."""
        name = hp.host.name
        if name in self.dead:
            return HostOutcome(hp.host, error=self.dead[name])
        if hp.complete:
            return HostOutcome(hp.host, value=hp.result())
        return HostOutcome(hp.host, error=ModelStoreError(
            f"{self.why.get(name, 'the relay did not complete it')}: push again to continue from what it holds"))


def relay(job: Job, hosts: Sequence[Host]) -> Pushed:
    """Push job.model to `hosts` (each with a data-plane address) relayed: host name -> HostOutcome for each host
    the relay served, and the names of those to push directly instead (their hop could not start)."""
    model = job.model
    rounds = RelayRounds(job, time.monotonic() + job.deadline,
                         from_plane=any(h.local and h.address for h in job.connector.cluster.hosts))
    modes = {f.path: os.stat(os.path.join(model.root, f.path)).st_mode & 0o777 for f in model.files}

    def open_one(host: Host) -> HostPush:
        hp = HostPush(job.connector, host, model, job.wanted[host.name], job.verify).__enter__()
        try:
            hp.prepare()
        except BaseException:
            hp.__exit__(None, None, None)
            raise
        return hp

    opened = run_all(hosts, open_one, max(1.0, rounds.left()))
    outcomes = {name: o for name, o in opened.failed.items()}
    pushes = [o.value for o in opened.ok.values()]
    try:
        for round_no in range(ROUNDS):
            rounds.round_no = round_no
            live = [hp for hp in pushes if not rounds.out(hp)]
            if all(hp.complete for hp in live) or rounds.left() < 0:
                break
            if not _round(rounds, [RemoteHop(hp, model, modes) for hp in live]):
                break
        outcomes.update({hp.host.name: rounds.outcome(hp) for hp in pushes if hp.host.name not in rounds.fallback})
    finally:
        for hp in pushes:
            hp.__exit__(None, None, None)
    return Pushed(outcomes, frozenset(rounds.fallback))


def _round(rounds: RelayRounds, hops: list[RemoteHop]) -> int:
    """One round (the module's steps 2-5): the bytes the hosts wanting files received."""
    job = rounds.job
    route = Route(direct=dict(job.from_here), again=rounds.round_no > 0)
    chains: list[tuple[list[RemoteHop], object]] = []
    try:
        for hop in hops:
            try:
                hop.start(job.progress)
            except Exception as e:  # noqa: BLE001 - the host's own outcome
                rounds.lose(hop, e)
        hops = [h for h in hops if h.name not in rounds.dead]
        for hop in hops:
            if not hop.wait_for(lambda hop=hop: hop.port, min(START_S, rounds.left())):
                rounds.hand_back(hop, route)
        chains = _chains(job.connector, rotate([h for h in hops if h.name not in rounds.fallback]), rounds.from_plane,
                         route, rounds.end)
        if job.on_route is not None and (route.chains or route.direct):
            job.on_route(route)
        senders = [in_background(_send, conn, chain, job.model, job.bwlimit_kbps) for chain, conn in chains]
        for chain, conn in chains:
            for hop in chain:
                hop.wait_for(lambda hop=hop: hop.answer, rounds.left())
            conn.close()
        for sender in senders:
            try:
                route.sent_here += sender.result(timeout=max(0.0, rounds.left()))
            except Exception:  # noqa: BLE001 - the hops' own answers say what became of the bytes
                pass
    finally:
        for hop in hops:
            hop.stop()
    live = [h for chain, _ in chains for h in chain]
    finished = run_all([h.hp.host for h in live], lambda host: _finish(next(h for h in live if h.hp.host is host)),
                       max(1.0, rounds.left()))
    moved = 0
    for hop in live:
        error = finished[hop.name].error
        if error is not None:
            rounds.lose(hop, error)
            continue
        # what arrived: the hop's own count when it ended well, else what the host holds now beyond what it held
        received = hop.got if hop.answer and hop.answer.get("done") else max(hop.got, held(hop.hp) - hop.wanted_held)
        if received:
            hop.hp.sent([rel for rel, f in hop.files.items() if f.want], received, "relay", f"relayed from {hop.upstream}")
            moved += received
        if not hop.hp.complete:
            rounds.unfinished(hop)
    return moved


def lost(hop: RemoteHop, error: BaseException) -> BaseException:
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


def _finish(hop: RemoteHop) -> None:
    """Hash what arrived; a host still lacking files prepares again (what it holds now) for the next round."""
    if hop.hp.complete:
        return
    hop.hp.finish()
    if not hop.hp.complete:
        hop.hp.prepare()


def _chains(connector: Connector, hops: list[RemoteHop], from_plane: bool, route: Route,
            end: float) -> list[tuple[list[RemoteHop], object]]:
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


def _connect(head: RemoteHop, from_plane: bool):
    host = head.hp.host
    if from_plane or host.local:
        return socket.create_connection((host.address, head.port), timeout=REACH_S)
    return head.hp.transport.connect_tcp(host.address, head.port, REACH_S)


def _send(conn, chain: list[RemoteHop], model: LocalModel, bwlimit_kbps: int | None) -> int:
    """The plan, then each file's bytes from the first hop's offset, to the chain's first hop: bytes sent."""
    plan = [[f.path, offsets(chain, f.path)] for f in model.files if any(h.files[f.path].want for h in chain)]
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
