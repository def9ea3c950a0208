"""What every route of a model push shares (transfer/routes.py lists the routes and chooses one per host;
transfer/models.py runs them): the route's interface (ModelRoute: its name, when it takes a host, how it
pushes), what it is given (Asked: the conditions it is chosen by; Job: the push), the decision (Choice: the route
and the reason printed), one host's push as a context (HostPush: its hold on its own partial directory, prepare
and finish, each one round trip to hosts/scripts/modelstore.py), the per-host sequence written once (store:
hold -> prepare -> send -> finish, the route supplying only `send`), the entry it leaves (StoreEntry) and the
route's record (Route).

    with HostPush(connector, host, model, want, verify) as hp:
        plan = hp.prepare()            # {"state": "complete"} or the files to send, into plan["path"]
        ...                            # the route sends them (rsync, SFTP, or the relay)
        hp.sent(files, count, "rsync"); hp.finish(); entry = hp.result()
"""
from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

from ..errors import ModelStoreError
from ..hosts.connector import Connector
from ..hosts.fanout import HostOutcome, run_all
from ..hosts.scripts.contract import StoreState
from ..hosts.scripts.contract import PARTS  # noqa: F401 (the helper's own: rsync's --partial-dir, where SFTP appends)
from ..inventory import Host
from . import remotefiles
from .localmodel import LocalModel

HELPER = "modelstore.py"
HASH_BYTES_PER_S = 100e6                # a slow disk's sha256 rate, for the helper's timeout
Progress = Callable[[str, int, int], None]       # (host name, bytes done, bytes total)


@dataclass
class StoreEntry:
    """One host's entry after a push."""

    host: str
    name: str
    digest: str
    path: str                     # absolute path of the complete entry on the host: mlx-lm's --model
    files: list[str]              # the model files this host was to get (all of them unless push(files=...))
    sent_files: list[str] = field(default_factory=list)
    sent_bytes: int = 0           # bytes that went over the wire (rsync's count; SFTP's payload)
    resumed_bytes: int = 0        # bytes of unfinished files already on the host when this push began
    damaged: list[str] = field(default_factory=list)    # files found damaged on the host and sent again
    rehashed: int = 0             # files hashed on the host to check the entry
    method: str = ""              # rsync or sftp; "" when nothing was sent
    note: str = ""
    elapsed_s: float = 0.0

    @property
    def reused(self) -> bool:
        """True when nothing had to move: the host already held every file, verified."""
        return not self.sent_files


@dataclass
class Route:
    """How a push's bytes travel: chains (this machine -> the first host -> the next ..., each host passing them on
    over the data plane) and the hosts pushed directly from this machine, each with why."""

    chains: list[list[str]] = field(default_factory=list)
    direct: dict[str, str] = field(default_factory=dict)
    via: dict[str, str] = field(default_factory=dict)      # a chain's first host -> how this machine reaches it
    notes: list[str] = field(default_factory=list)         # why a chain ends where it does
    again: bool = False                                    # a later round: hosts still lacking files, from what they hold
    sent_here: int = 0             # model bytes this machine sent into the chains (counted once the round has ended)

    def lines(self) -> list[str]:
        what = "relay again, from what each host holds" if self.again else "relay"
        out = [f"{what}: this machine -({self.via.get(c[0], 'ssh')})-> " + " -> ".join(c) for c in self.chains]
        reasons: dict[str, list[str]] = {}
        for name, why in self.direct.items():
            reasons.setdefault(why, []).append(name)
        out += [f"direct: {', '.join(names)} ({why})" for why, names in reasons.items()]
        return out + self.notes


def store_root(host: Host) -> str:
    return host.model_store.rstrip("/") or "/"


def push_request(host: Host, model: LocalModel, want: list[str], verify: bool, slot: str) -> dict:
    return {"root": store_root(host), "store": store_root(host), "key": model.key, "name": model.name,
            "digest": model.digest, "files": {f.path: [f.size, f.sha256] for f in model.files}, "want": want,
            "verify": verify, "slot": slot}


def slot_name(host: str) -> str:
    """The host's partial directories' name in a store (KEY@SLOT, KEY@SLOT~2, ...: hosts sharing one store never
    share a push; the helper's `hold` gives each push of the host its own)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", host).lstrip(".") or "host"


def hash_timeout(model: LocalModel) -> float:
    return remotefiles.HELPER_TIMEOUT_S + model.size / HASH_BYTES_PER_S


class HostPush:
    """One host's push, as a context: its connection, and its hold on its own partial directory (the helper's
    `hold`) for as long as the block runs; prepare and finish (one round trip each) keep the host's StoreEntry."""

    def __init__(self, connector: Connector, host: Host, model: LocalModel, want: list[str], verify: bool):
        self.connector, self.host, self.model, self.want, self.verify = connector, host, model, want, verify
        self.start = time.monotonic()
        self.stack = ExitStack()
        self.entry: StoreEntry | None = None
        self.plan: dict = {}

    def __enter__(self) -> "HostPush":
        try:
            self.transport = self.stack.enter_context(self.connector.transport(self.host))
            hold = {"root": store_root(self.host), "store": store_root(self.host), "key": self.model.key,
                    "slot": slot_name(self.host.name)}
            slot = self.stack.enter_context(remotefiles.held(self.transport, self.host.python, "hold", hold,
                                                             script=HELPER))
        except BaseException:
            self.stack.close()
            raise
        self.request = push_request(self.host, self.model, self.want, self.verify, slot["slot"])
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def call(self, op: str) -> dict:
        return remotefiles.call(self.transport, self.host.python, op, self.request, hash_timeout(self.model), HELPER)

    def prepare(self) -> dict:
        """Check what the host holds: the plan ({state: complete} or the files to send and from where)."""
        self.plan = plan = self.call("prepare")
        if self.entry is None:
            self.entry = StoreEntry(self.host.name, self.model.name, self.model.digest, plan.get("entry", plan["path"]),
                                    self.want, damaged=plan.get("damaged", []), rehashed=plan.get("hashed", 0),
                                    resumed_bytes=sum(int(v) for v in plan.get("resume", {}).values()))
        else:
            self.entry.damaged += [f for f in plan.get("damaged", []) if f not in self.entry.damaged]
            self.entry.rehashed += plan.get("hashed", 0)
        if plan["state"] == StoreState.COMPLETE:
            self.entry.path = plan["path"]
        return plan

    @property
    def complete(self) -> bool:
        return self.plan.get("state") == StoreState.COMPLETE

    def finish(self) -> dict:
        """Hash what arrived on the host; when every file is verified the entry is complete (its path kept)."""
        done = self.call("finish")
        if not done["bad"] and not done["missing"]:
            self.entry.path = done["path"]
            self.plan = {"state": StoreState.COMPLETE, "path": done["path"]}
        return done

    def sent(self, files: Sequence[str], count: int, method: str, note: str = "") -> None:
        self.entry.sent_bytes += count
        self.entry.sent_files += [f for f in files if f not in self.entry.sent_files]
        self.entry.method, self.entry.note = method, note or self.entry.note

    def result(self) -> StoreEntry:
        self.entry.elapsed_s = time.monotonic() - self.start
        return self.entry


def mismatch(hp: HostPush, files: Sequence[str]) -> ModelStoreError:
    return ModelStoreError(f"{hp.host.name}: {', '.join(files)} still does not match its sha256 on the host after "
                           f"being sent again: the file in {hp.model.root} changed during the push, or the host's "
                           "disk corrupts it (push again; if it recurs, check that disk)")


@dataclass(frozen=True)
class Asked:
    """The conditions a push's routes are chosen by (routes.choose), the same for each of its hosts."""

    method: str = "auto"          # --method: auto, rsync or sftp
    direct: bool = False          # --direct: from this machine to each host, never relayed
    rsync: str | None = None      # this machine's rsync, when the method may use it (push.local_rsync)
    addressed: int = 0            # how many of the push's hosts have a data-plane `address`


@dataclass(frozen=True)
class Job:
    """One push as its routes see it."""

    connector: Connector
    model: LocalModel
    wanted: Mapping[str, list[str]]       # host name -> the model files it gets
    asked: Asked
    verify: bool = False
    progress: Progress | None = None
    bwlimit_kbps: int | None = None
    deadline: float = 0.0                 # seconds a route's hosts have (run_all's deadline)
    from_here: Mapping[str, str] = field(default_factory=dict)   # hosts pushed from here, not relayed -> the Choice's reason
    on_route: Callable[[Route], None] | None = None


@dataclass(frozen=True)
class Choice:
    """The route a host's bytes take, as routes.choose decided it, and the words that decision prints: `reason`,
    for a host pushed from this machine, why it is not relayed (the route's line `direct: h4 (no data-plane
    address)`: the first route's refusal); `note`, what the host's StoreEntry says of how its bytes went (the chosen
    route's note: SFTP standing in for rsync)."""

    route: "ModelRoute"
    reason: str = ""
    note: str = ""


class Sent(NamedTuple):
    """What a route's send did for one host: bytes that went over the wire, how (its StoreEntry's method), a note."""

    count: int
    method: str
    note: str = ""


class Pushed(NamedTuple):
    """What a route's push did: host name -> HostOutcome, and the hosts it hands back (to the routes after it)."""

    outcomes: dict[str, HostOutcome]
    back: frozenset[str] = frozenset()


Send = Callable[[Job, "HostPush", list[str], dict[str, int]], Sent]


class ModelRoute(ABC):
    """A way to copy a model into the hosts' stores: an entry of routes.ROUTES, which routes.choose walks in order,
    giving each host to the first entry that takes it."""

    name: str = ""
    tells_route: bool = False       # it tells the Route itself (job.on_route, round by round); else models.push does

    @abstractmethod
    def refusal(self, asked: Asked, host: Host) -> str | None:
        """None when this route takes `host`; else why not, in the words the route's lines print."""

    def note(self, asked: Asked, host: Host) -> str:
        """What the StoreEntry of a host this route takes says of how its bytes went ("": nothing)."""
        return ""

    @abstractmethod
    def push(self, job: Job, hosts: Sequence[Host], choices: Mapping[str, Choice]) -> Pushed:
        """The model into the stores of `hosts` (those this route took; `choices`: each one's Choice)."""


class OneByOne(ModelRoute):
    """A route from this machine to each host on its own: every host runs the per-host sequence (store) with this
    route's send, all at once."""

    def push(self, job: Job, hosts: Sequence[Host], choices: Mapping[str, Choice]) -> Pushed:
        group = run_all(hosts, lambda host: store(job, host, self.send, choices[host.name].note), job.deadline)
        return Pushed(dict(group.items()))

    @abstractmethod
    def send(self, job: Job, hp: HostPush, files: list[str], resume: dict[str, int]) -> Sent:
        """Send `files` into the host's partial directory, hp.plan["path"] (`resume`: file -> the bytes of it the
        host already holds, to continue from)."""


def store(job: Job, host: Host, send: Send, note: str = "") -> StoreEntry:
    """One host's push, the sequence every route follows: hold (HostPush's context) -> prepare -> send -> finish,
    and what finish deleted (it did not match its sha256) sent once more, whole. A host already holding the model,
    verified, moves nothing. `note`: the Choice's, kept unless the send says more."""
    with HostPush(job.connector, host, job.model, job.wanted[host.name], job.verify) as hp:
        plan = hp.prepare()
        if hp.complete:
            return hp.result()
        files, resume = plan["send"], {k: int(v) for k, v in plan["resume"].items()}
        for _ in range(2):          # the second time: what finish deleted, sent whole
            if files:
                sent = send(job, hp, files, resume)
                hp.sent(files, sent.count, sent.method, sent.note or note)
            done = hp.finish()
            if hp.complete:
                return hp.result()
            files, resume = done["bad"] + done["missing"], {}
        raise mismatch(hp, files)
