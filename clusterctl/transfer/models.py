"""The model store: an mlx-lm model directory pushed once to every host, kept there by its content, verified by
sha256 on the host, resumed when cut off (docs/models.md).

    model = describe("~/models/Qwen3-8B-4bit")                   # transfer/localmodel.py (sha256s cached)
    group = push(connector, None, model)                         # GroupResult: host -> HostOutcome(StoreEntry)
    entries = require_all(group)                                 # {host: StoreEntry}, or one line naming failures
    entries["m1"].path                                           # mlx-lm's --model on m1

Layout on a host (its inventory `model_store`, default ~/.cache/clusterctl/models; hosts/scripts/modelstore.py
does every step there, one round trip each):

    <store>/<name>-<digest12>/      a complete entry: the files and .clusterctl-entry.json (the manifest)
    <store>/.partial/<name>-<digest12>@<slot>/   a push in progress, or an entry taken back to repair it

The route (transfer/routes.py: each host to the first of relay, rsync, SFTP that takes it; the reason a host is
pushed from here is printed from that choice) sends the bytes; the rest is the same for every route.
Per host, in parallel (run_all, one deadline per host; transfer/storepush.py's store and HostPush):
  0. hold: the push takes a directory of its own under .partial (<slot>: the host's name, or <host>~N while
     other pushes of the model to the host run), held by a lock on the host for as long as the push's
     connection lives: a push cut off leaves it free, and the next push continues it;
  1. prepare: a complete entry is checked (each file's size and mtime against those recorded when it was
     verified; a file that differs is re-hashed; `verify`: every file re-hashed). All good: nothing moves.
     Otherwise the entry goes back to .partial (its manifest removed first), and each file there that is
     not verified is named to send, a damaged one moved aside as the basis to continue from;
  2. the files go to .partial with rsync --partial-dir (an interrupted file continues by rsync's delta) or,
     without rsync, SFTP appending from the partial copy's size; a link in the model (a Hugging Face snapshot's,
     into its blobs, checked by localmodel.model_paths) arrives as the file it points to, both ways;
  3. finish: each arrived file is hashed on the host; one that does not match is deleted and sent once more,
     whole; when every file is verified the manifest is written and the directory renamed into the store:
     an entry appears complete in one rename, never before.

remove() deletes only what the store made, and nothing on any host while a process there uses the entry (its
command line names it: a serve rank) or a push writes it; with `stop` (`models rm --force`: observe.procs'
kill_runs, the sweep `clusterctl kill` uses) the clusterctl runs that use it are stopped first.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ..errors import ModelInUse, ModelStoreError
from ..hosts.connector import Connector
from ..hosts.fanout import GroupResult, HostOutcome, in_background, run_all
from ..inventory import Host
from . import remotefiles
from .localmodel import LocalModel, describe, host_files, match
from .push import local_rsync
from .routes import ROUTES, after, choose
from .storepush import (HELPER, Asked, Choice, Job, ModelRoute, Progress, Pushed, Route, StoreEntry, hash_timeout,
                        store_root)

__all__ = ["LocalModel", "Route", "StoreEntry", "StoredModel", "describe", "list_models", "push", "remove", "require_all"]


@dataclass(frozen=True)
class StoredModel:
    """One entry of a host's store as list_models reports it."""

    key: str                      # the directory name: NAME-DIGEST12
    name: str | None
    digest: str | None            # None for a directory whose manifest is gone
    state: str                    # complete, partial (a push in progress or cut off) or incomplete
    path: str
    size: int                     # bytes of the files the entry holds (complete) or is to hold (partial)
    bytes: int                    # bytes on disk there now
    files: int                    # files it holds or is to hold
    model_files: int              # files of the whole model (more than `files`: a host given some weights)


def push(connector: Connector, hosts: Sequence[Host] | None, model: LocalModel | str, *, method: str = "auto",
         files: Mapping[str, Sequence[str]] | None = None, verify: bool = False, progress: Progress | None = None,
         bwlimit_kbps: int | None = None, timeout: float = 7200.0, direct: bool = False,
         on_route: Callable[[Route], None] | None = None) -> GroupResult:
    """Put `model` (a LocalModel, or a model directory to describe) into the store of every host of `hosts`
    (None: the connector's cluster). `files`: host name -> the weight files that host gets (it gets every
    other file too); a host not named gets the whole model. `verify`: re-hash every stored file on the hosts.
    Each host's route is routes.choose's: two or more hosts with a data-plane `address` get the model relayed
    (transfer/relay.py: over this machine's link once, then host to host) unless `direct` or a `method` is named;
    the others, and a host the relay cannot reach, directly. `on_route` hears the route before the bytes move.
    Every host's outcome is kept: its StoreEntry, or the error that stopped it."""
    if isinstance(model, str):
        model = describe(model)
    targets = list(connector.cluster.hosts if hosts is None else hosts)
    asked = Asked(method, direct, local_rsync(method), addressed=sum(1 for h in targets if h.address))
    choices = {h.name: choose(asked, h) for h in targets}
    job = Job(connector, model, {h.name: host_files(model, (files or {}).get(h.name)) for h in targets}, asked,
              verify, progress, bwlimit_kbps, connector.deadline(timeout + 2 * hash_timeout(model), slack=0),
              from_here={name: c.reason for name, c in choices.items() if not c.route.tells_route}, on_route=on_route)
    if on_route is not None and len(targets) > 1 and not any(c.route.tells_route for c in choices.values()):
        on_route(Route(direct=dict(job.from_here)))
    outcomes = _push_routes(job, targets, choices)
    return GroupResult([outcomes[h.name] for h in targets])


def _push_routes(job: Job, hosts: Sequence[Host], choices: Mapping[str, Choice]) -> dict[str, HostOutcome]:
    """Each route's hosts pushed by it, the first route's here and the others' beside it; the hosts a route hands
    back, by the routes after it (chosen again among those)."""
    taken = {route: [h for h in hosts if choices[h.name].route is route] for route in ROUTES}
    routes = [route for route in ROUTES if taken[route]]
    outcomes: dict[str, HostOutcome] = {}

    def pushed(route: ModelRoute, result: Pushed) -> None:
        outcomes.update(result.outcomes)
        back = [h for h in taken[route] if h.name in result.back]
        if back:
            outcomes.update(_push_routes(job, back, {h.name: choose(job.asked, h, after(route)) for h in back}))

    aside = [(route, in_background(route.push, job, taken[route], choices)) for route in routes[1:]]
    if routes:
        pushed(routes[0], routes[0].push(job, taken[routes[0]], choices))
    for route, pushing in aside:
        pushed(route, pushing.result())
    return outcomes


def require_all(group: GroupResult) -> dict[str, StoreEntry]:
    """host -> StoreEntry when every host got its entry; else one line naming each host that did not and why."""
    if group.failed:
        raise ModelStoreError("; ".join(f"{name}: {' '.join(str(o.error).split())}" for name, o in group.failed.items()))
    return {name: o.value for name, o in group.items()}


def list_models(connector: Connector, hosts: Sequence[Host] | None = None, timeout: float = 120.0) -> GroupResult:
    """Every host's store: host -> HostOutcome whose value is a list of StoredModel."""
    def one(host: Host) -> list[StoredModel]:
        with connector.transport(host) as transport:
            answer = remotefiles.call(transport, host.python, "list", {"root": store_root(host), "store": store_root(host)},
                                      timeout, HELPER)
        return [StoredModel(**e) for e in answer["entries"]]

    return run_all(list(connector.cluster.hosts if hosts is None else hosts), one, connector.deadline(timeout))


def remove(connector: Connector, hosts: Sequence[Host] | None, which: str, timeout: float = 600.0,
           stop: Callable[[Connector, str], object] | None = None) -> GroupResult:
    """Delete the model `which` names (an entry name, a model name or a digest prefix: one model, else one line
    saying it is ambiguous) from every host's store, complete or partial: host -> the paths removed. Every host
    is listed and checked first, so an ambiguous name, or a model in use on any host (ModelInUse, one line), is
    refused before anything is deleted anywhere; with `stop`, the clusterctl runs using it are stopped first
    (`stop(connector, run_id)`). A host that cannot be listed is reported as failed and left alone."""
    listed = list_models(connector, hosts, timeout)
    rows = [{"key": m.key, "name": m.name, "digest": m.digest, "host": name}
            for name, o in listed.ok.items() for m in o.value]
    chosen = match(rows, which)
    targets = list(connector.cluster.hosts if hosts is None else hosts)

    def call(host: Host, dry: bool) -> dict:
        failed = listed[host.name]
        if failed.error is not None:
            raise failed.error
        keys = sorted({r["key"] for r in chosen if r["host"] == host.name})
        if not keys:
            return {"removed": [], "held": []}
        with connector.transport(host) as transport:
            return remotefiles.call(transport, host.python, "remove", {"root": store_root(host), "store": store_root(host),
                                                                        "keys": keys, "dry": dry}, timeout, HELPER)

    checked = run_all(targets, lambda host: call(host, True), connector.deadline(timeout))
    held = [(name, h) for name, o in checked.ok.items() for h in o.value["held"]]
    runs = sorted({h["run"] for _, h in held if h.get("run")})
    if held and (stop is None or any(not h.get("run") for _, h in held)):
        raise ModelInUse(in_use(held, forced=stop is not None))
    for run_id in runs:
        stop(connector, run_id)

    def one(host: Host) -> list[str]:
        if checked[host.name].error is not None:
            raise checked[host.name].error
        answer = call(host, False)
        if answer["held"]:
            raise ModelInUse(f"{host.name}: {in_use([(host.name, h) for h in answer['held']], stop is not None)}")
        return answer["removed"]

    return run_all(targets, one, connector.deadline(timeout))


def in_use(held: Sequence[tuple[str, dict]], forced: bool) -> str:
    """One line for `models rm` refused: what uses the model, on which hosts, and what to do (pure). `held`:
    (host, the helper's answer: {path, pid, run, command} for a process, {path, push} for a push)."""
    keys = sorted({posixpath.basename(h["path"]).split("@", 1)[0] for _, h in held})
    runs: dict[str, list[str]] = {}
    parts = []
    for host, h in held:
        if h.get("run"):
            runs.setdefault(h["run"], [])
            if host not in runs[h["run"]]:
                runs[h["run"]].append(host)
    parts += [f"run {run} on {', '.join(names)}" for run, names in sorted(runs.items())]
    parts += [f"pid {h['pid']} on {host} ({h['command'][:80]})" for host, h in held if h.get("pid") and not h.get("run")]
    parts += [f"a push on {host}" for host, h in held if h.get("push")]
    if runs and not forced and len(parts) == len(runs):
        fix = (f"stop it first (clusterctl kill {' / '.join(sorted(runs))}), or give --force to stop "
               f"{'it' if len(runs) == 1 else 'them'} and remove the model")
    elif any(h.get("push") for _, h in held):
        fix = "let the push finish (or stop it), then remove the model"
    else:
        fix = "stop it first (--force stops clusterctl runs only)"
    return f"{', '.join(keys)} is in use: {'; '.join(parts)}: {fix}"
