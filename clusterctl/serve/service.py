"""`clusterctl serve`, the use case, callable without click:

    model -> store -> ports -> run (with the endpoint watched) -> stop

    result = serve(cluster_or_None, ServeOptions(model="models/tiny", port=8080), events)

1. The model: a local mlx-lm model directory, checked here before anything moves (check.py).
2. The store: pushed to every other host's model store (transfer/models.py): content-addressed, verified on the
   host, resumable; a model already there moves no bytes. This machine, when it is a host, serves MODEL in place.
3. Ports: by default nothing listens on the network. Rank 0 binds a free port of its host's loopback, and a
   port of this machine's loopback is carried to it over the SSH connection to that host (hosts/forward.py):
   the URL is http://127.0.0.1:PORT here. With `listen`, rank 0 binds that address of its host instead.
   A port in use is refused before anything starts.
4. Run: one rank per host runs mlx-lm's server (clusterctl.serve.rank) through `run` (run/), a Service (what
   this kind of program can do, program.Capabilities): the ranks' stdin is /dev/null, only clusterctl itself is
   copied (not the current directory), its record says what it serves; restarts follow --max-restarts, and the
   stall watchdog's progress is the endpoint answering /health (launch/stall.py).
5. The endpoint (endpoint.py): each attempt is watched by a thread that says the URL once a one-token
   completion is answered, then asks /health every few seconds.
It runs until Ctrl-C (or SIGTERM), a failure with no restart left, or a stall with none left.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ClusterctlError, PortTaken, ServeError, UsageError
from ..hosts import hostscript
from ..hosts.connector import Connector
from ..hosts.facts import interfaces
from ..hosts.scripts.contract import UNRESOLVED
from ..hosts.forward import Forward, is_loopback
from ..inventory import Cluster
from ..launch.attempts import AttemptSettings
from ..program import Capabilities
from ..run.events import RunEvents
from ..run.modelpush import push_model
from ..run.options import THIS_MACHINE_BACKEND, RunOptions, Staged
from ..run.usecase import RunResult, run
from ..transfer import hub
from ..transfer import models as store
from .check import check_model, served_name, stage_files
from .endpoint import Endpoint, model_ids

RANK_MODULE = "clusterctl.serve.rank"
DEFAULT_PORT = 8080
LOOPBACK = "127.0.0.1"
# the server's own options serve sets; given after `--` they would contradict it
OWNED = ("--model", "--host", "--port", "--pipeline")
# a host's interfaces as hosts/scripts/probe.sh lists them (docs/facts/macos.md#ifconfig-not-ip-on-macos)
ADDRESSES = ('if [ "$(uname -s)" = Darwin ]; then ifconfig -a 2>/dev/null; '
             "else ip -o -4 addr show 2>/dev/null || ifconfig -a 2>/dev/null; fi")


@dataclass(frozen=True)
class ServeOptions:
    model: str                                  # a local mlx-lm model directory
    name: str | None = None                     # what /v1/models calls it (default: the directory's name)
    port: int = DEFAULT_PORT                    # the URL's port (this machine's, or the host's with listen)
    listen: str | None = None                   # rank 0 binds this address of its host (no forward)
    backend: str | None = None                  # default: the inventory's
    pipeline: bool = False                      # mlx-lm's pipeline parallelism instead of tensor parallelism
    server_args: tuple[str, ...] = ()           # mlx-lm server options, after `--`
    # runs_dir, launch_from, restart, and the watch: its stall policy (None: adaptive from the first health
    # answer; 0: off), whose progress serve makes the endpoint's health answers
    attempts: AttemptSettings = AttemptSettings()
    method: str = "auto"                        # how the model travels: relayed, else rsync, else SFTP
    direct: bool = False                        # to each host from here, never relayed between hosts
    verify: bool = False                        # re-hash every stored file, not only changed ones
    connect_timeout: float | None = None
    adapter: str | None = None                  # a directory of adapters (adapted.adapter_dir): fused into MODEL
    fuse: Callable | None = None                # ... by this (train/export.py fuse_into, which the CLI gives)
    # a detached serve's supervisor: host name -> where its rank reads the model (its store's copy, put there by
    # the command that detached it: serve/detached.py)
    stored: dict[str, str] | None = None


@dataclass(frozen=True)
class Service(Capabilities):
    """A served model as a kind of program `run` knows (program.Capabilities): every rank runs RANK_MODULE from the
    copy of clusterctl run ships (the project is not copied), reads no stdin, and its run's record says what it
    serves."""

    url: str
    model: str                                  # its id in /v1/models
    model_dir: str
    listen: str | None
    strategy: str                               # "tensor" or "pipeline"

    module = RANK_MODULE
    reads_stdin = False
    copies_project = False

    def describe(self, args) -> dict:
        """A service is "serve", of the model it serves, its strategy its parallelism."""
        return {"kind": "serve", "model": self.model, "strategy": self.strategy}

    @property
    def service(self) -> dict:
        return {"url": self.url, "model": self.model, "model_dir": self.model_dir, "listen": self.listen,
                "strategy": self.strategy}


class ServeEvents(RunEvents):
    """What `serve` tells its user: run's events and these."""

    def checked(self, model: str, kind: str, size: int) -> None: ...
    def fused(self, base: str, adapters: str, path: str, cached: bool) -> None: ...
    def ready(self, url: str, model_id: str, seconds: float, since_start: float) -> None: ...
    def listening(self, url: str, exposed: bool) -> None: ...


@dataclass
class ServeResult:
    run: RunResult
    url: str
    entries: dict[str, store.StoreEntry] = field(default_factory=dict)
    ready: list[float] = field(default_factory=list)      # seconds from each attempt's start to its readiness

    @property
    def exit_code(self) -> int:
        return self.run.exit_code


@dataclass(frozen=True)
class Prepared:
    """A model ready to serve: checked, in every host's store, the first host's port free (prepare)."""

    cluster: Cluster                            # one rank per host
    connector: Connector
    model_dir: str                              # the model as checked: here, or (a supervisor's) its host's store
    name: str                                   # its id in /v1/models
    paths: list[str]                            # where each host's rank reads it, in the hosts' order
    entries: dict[str, store.StoreEntry]        # each host's store entry (empty where nothing was pushed)


def prepare(cluster: Cluster | None, options: ServeOptions, events: ServeEvents) -> Prepared:
    """Steps 1 and 2, and what is refused before them: the model resolved (a hub id), fused with its adapters,
    checked, pushed to every other host's store; the cluster one rank per host, --listen and the first host's
    port checked. A detached serve's supervisor (options.stored) is given the stores' paths: it checks and moves
    nothing of the model, which the command that detached it did."""
    _check_args(options)
    cluster = one_rank_per_host(cluster or Cluster.this_machine(os.getcwd(), slots=1, backend=THIS_MACHINE_BACKEND))
    connector = Connector(cluster, **({"connect_timeout": options.connect_timeout} if options.connect_timeout else {}))
    first = cluster.hosts[0]
    _check_listen(first, options.listen, options.port)
    if options.stored is not None:
        paths = [options.stored[h.name] for h in cluster.hosts]
        return Prepared(cluster, connector, paths[0], options.name or served_name(options.model), paths, {})
    model_dir = os.path.abspath(hub.resolve(options.model))      # a hub id: its snapshot in the hub's cache here
    name = options.name
    if options.adapter is not None:      # mlx-lm serves no adapters across hosts: fused into the base, cached here
        from . import adapted

        check_model(model_dir, world=1)                    # the base itself, as it is, before the fuse reads it
        base = model_dir
        if options.fuse is None:
            raise UsageError("--adapter needs the trainer's fuse (clusterctl's CLI gives it)")
        model_dir, cached = adapted.fused_model(base, options.adapter, options.fuse)
        events.fused(base, options.adapter, model_dir, cached)
        name = name or f"{served_name(base)}+{adapted.label(options.adapter)}"
    summary = check_model(model_dir, world=len(cluster.hosts), pipeline=options.pipeline)
    if options.listen is not None or first.local:
        _check_port_free(connector, first, options.listen or LOOPBACK, options.port)
    events.checked(model_dir, summary.kind, summary.size)
    # this machine serves MODEL where it is; every other host from its store
    entries = push_model(connector, model_dir, events, method=options.method, verify=options.verify,
                         direct=options.direct, files=_shares(model_dir, cluster, summary, options.pipeline))
    paths = [entries[h.name].path if not h.local else model_dir for h in cluster.hosts]
    return Prepared(cluster, connector, model_dir, name or summary.name, paths, entries)


def serve(cluster: Cluster | None, options: ServeOptions, events: ServeEvents | None = None) -> ServeResult:
    began = time.monotonic()
    events = events or ServeEvents()
    _check_args(options)
    forward = None
    if options.listen is None and not (cluster is None or cluster.hosts[0].local):
        forward = Forward.bind(options.port)             # refused now, before anything moves, when in use
    try:
        ready_ = prepare(cluster, options, events)
        cluster, connector, name, paths = ready_.cluster, ready_.connector, ready_.name, ready_.paths
        first = cluster.hosts[0]
        if options.stored is not None and options.listen is not None:    # checked here too: since it was, time passed
            _check_port_free(connector, first, options.listen, options.port)
        if forward is not None:
            bind, port = LOOPBACK, _free_loopback_port(connector, first)
            forward.point(connector.transport(first), LOOPBACK, port)
            forward.start()
            url = forward.url
        else:
            bind, port = options.listen or LOOPBACK, options.port
            url = f"http://{reachable(first, bind)}:{port}"
        events.listening(url, exposed=options.listen is not None)
        result = ServeResult(None, url, ready_.entries)

        def ready(seconds: float) -> None:
            result.ready.append(seconds)
            try:
                listed = model_ids(url)
            except OSError:
                listed = []
            events.ready(url, listed[0] if listed else name, seconds, time.monotonic() - began)

        endpoint = Endpoint(url, ready)
        args = [json.dumps({"name": name, "models": paths}), "--host", bind, "--port", str(port),
                *(["--pipeline"] if options.pipeline else []), *options.server_args]
        service = Service(url, name, ready_.model_dir, options.listen, "pipeline" if options.pipeline else "tensor")
        run_options = RunOptions(module=RANK_MODULE, args=tuple(args), backend=options.backend, fetch=False,
                                 attempts=options.attempts.with_progress(lambda: endpoint.answered), kinds=(service,),
                                 # a detached serve's supervisor: clusterctl went to every host with the model
                                 staged=Staged({}, {}) if options.stored is not None else None,
                                 **({"connect_timeout": options.connect_timeout} if options.connect_timeout else {}))
        try:
            result.run = run(cluster, run_options, _Watched(events, endpoint))
        finally:
            endpoint.stop()
        return result
    finally:
        if forward is not None:
            forward.close()


class _Watched:
    """run's events passed on to serve's, each attempt's start also starting the endpoint's watch."""

    def __init__(self, events: ServeEvents, endpoint: Endpoint):
        self._events, self._endpoint = events, endpoint

    def __getattr__(self, name):         # every event but `started`
        return getattr(self._events, name)

    def started(self, launch, program, world, backend):
        self._events.started(launch, program, world, backend)
        self._endpoint.attempt_started()


def _shares(model_dir: str, cluster: Cluster, summary, pipeline: bool) -> dict[str, list[str]] | None:
    """host -> the weight files its rank reads, under pipeline parallelism on several hosts (each host then gets
    only those: a stage's blocks and the shared weights); None (every host gets every file) otherwise: tensor
    parallelism reads a slice of every block, so of every file."""
    if not pipeline or len(cluster.hosts) < 2 or summary.layers is None:
        return None
    stages = stage_files(model_dir, len(cluster.hosts), summary.layers)
    return {host.name: stages[i] for i, host in enumerate(cluster.hosts)}


def one_rank_per_host(cluster: Cluster) -> Cluster:
    """The cluster with one slot per host (a served model is sharded across hosts, one rank each)."""
    hosts = tuple(dataclasses.replace(h, slots=1, rank=i) for i, h in enumerate(cluster.hosts))
    if any(h.rdma for h in cluster.hosts) and any(h.slots > 1 for h in cluster.hosts):
        raise UsageError("serve runs one rank per host, but the inventory's jaccl rdma lists name a rank per slot: "
                         "give each host slots: 1")
    return dataclasses.replace(cluster, hosts=hosts)


def _check_args(options: ServeOptions) -> None:
    if not 0 < options.port < 65536:
        raise UsageError(f"--port {options.port}: give a port between 1 and 65535")
    for word in options.server_args:
        owned = owned_option(word)
        if owned is not None:
            said = word.split("=", 1)[0]
            meant = " or ".join(option for option in OWNED if option.startswith(said))
            means = "serve sets it" if said == owned else f"mlx-lm's server may take it for {meant}, which serve sets"
            raise UsageError(f"{said} after `--`: {means} (use serve's own MODEL, --listen, --port, --pipeline)")


def owned_option(word: str) -> str | None:
    """The option of serve's own (OWNED) that mlx-lm's server could take `word` for, None for any other word.
    Its argparse takes any unambiguous prefix of a long option (`--hos` is --host, `--po=9` is --port 9), so
    every prefix of an owned option counts: one it would resolve to that option, or one it finds ambiguous (and
    would refuse) among options one of which is serve's. mlx-lm has no option that is itself a prefix of an
    owned one, so no word counted here means another option to it."""
    if not word.startswith("--") or word == "--":
        return None
    said = word.split("=", 1)[0]
    return next((option for option in OWNED if option.startswith(said)), None)


def _free_loopback_port(connector: Connector, host) -> int:
    """A port nothing listens on in `host`'s loopback, asked of the host's python (rank 0 binds it)."""
    with connector.transport(host) as t:
        r = hostscript.run(t, host.python, "ports.py", "free", timeout=30)
    try:
        return int(hostscript.answer(r)["port"])
    except (hostscript.NoAnswer, TypeError, KeyError, ValueError):
        raise ServeError(f"{host.name}: could not find a free port on its loopback with {host.python}: "
                         f"{(r.stderr or r.stdout).strip()[-200:]}") from None


def _check_listen(host, listen: str | None, port: int) -> None:
    """A loopback --listen on a host that is not this machine is refused: the URL would name this machine's
    loopback, where nothing of the server is. (A loopback address the inventory reaches the host by is that host's
    own, as on the loopback test cluster.)"""
    if listen is None or host.local or listen in (host.name, host.hostname, host.address):
        return
    if is_loopback(listen):
        raise UsageError(f"--listen {listen} is {host.name}'s own loopback, which this machine cannot reach: leave "
                         f"out --listen (serve then carries http://127.0.0.1:{port} here to it over SSH), or give "
                         "an address of the host's network")


def _check_port_free(connector: Connector, host, address: str, port: int) -> None:
    """Refused, in one line, when rank 0 could not listen on `address:port` of `host`: PortTaken for a port in use,
    UsageError for an address the host does not have or cannot resolve, or any other reason the bind gives."""
    with connector.transport(host) as t:
        r = hostscript.run(t, host.python, "ports.py", "check", address, str(port), timeout=30)
    try:
        answer = hostscript.answer(r) if r.ok else None
    except hostscript.NoAnswer:
        answer = None
    if not isinstance(answer, dict):
        raise ServeError(f"{host.name}: could not check port {port} with {host.python}: "
                         f"{(r.stderr or r.stdout).strip()[-200:]}")
    if answer.get("free"):
        return
    why, said = str(answer.get("why")), str(answer.get("said"))
    where = "this machine" if host.local else host.name
    if why == "EADDRINUSE":
        raise PortTaken(f"port {port} on {address} is in use on {where} ({said}): give another with --port, or stop "
                        "what listens there")
    if why == "EADDRNOTAVAIL":
        has = _addresses(connector, host)
        raise UsageError(f"--listen {address} is not an address of {where}" + (f" (it has {', '.join(has)})" if has else "")
                         + ": give one of its own, or 0.0.0.0 for all of them")
    if why == UNRESOLVED:
        raise UsageError(f"--listen {address}: {where} cannot resolve it ({said}): give one of its IP addresses")
    raise UsageError(f"{where} cannot listen on port {port} of {address} ({said})"
                     + (": give a port above 1023" if why == "EACCES" and port < 1024 else ""))


def _addresses(connector: Connector, host) -> list[str]:
    """The host's IPv4 addresses, read as the probe reads them (ifconfig on a Mac, else `ip`); [] when unknown."""
    try:
        with connector.transport(host) as t:
            r = t.run(ADDRESSES, timeout=30)
    except ClusterctlError:
        return []
    return list(dict.fromkeys(str(i.ip) for _, i in interfaces(r.stdout.splitlines())))


def reachable(host, bind: str) -> str:
    """The address this machine uses for a server bound to `bind` on `host` (0.0.0.0: the host's own)."""
    if bind in ("0.0.0.0", "::"):
        return host.hostname or host.address or host.name
    return f"[{bind}]" if ":" in bind else bind


def describe_failure(result: RunResult) -> str | None:
    """One line for a failure whose cause the server's last lines name (a port in use, a model it cannot load)."""
    outcome = result.outcome
    if outcome is None or not outcome.tail:
        return None
    for line in reversed(outcome.tail):
        if "Address already in use" in line:
            return "the server could not listen: its port is in use on rank 0's host (give another with --port)"
        if line.startswith(("ValueError:", "KeyError:", "FileNotFoundError:", "RuntimeError:")):
            return f"the server could not load the model: {line}"
    return None

