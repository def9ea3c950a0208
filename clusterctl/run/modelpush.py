"""The program's model (a directory here) into the model store of every host but this machine, verified there
(transfer/models.py), each host's progress and outcome told: run's staging pushes it (push_for_run), and serve
pushes its model with it too (push_model)."""
from __future__ import annotations

from ..hosts.connector import Connector
from .events import RunEvents


def push_model(connector: Connector, model: str, events: RunEvents, **push) -> dict:
    """`model` (a directory here) into the store of every host but this machine, verified there (transfer/
    models.py: once; a model already there moves nothing, a cut-off push continues; relayed between the hosts
    unless `push` says direct; `push`: its method, verify, files, direct), the route, each host's progress and
    outcome told (events.model_route, model_progress, model_stored); host name -> its
    StoreEntry. This machine's ranks read the model where it is. serve pushes its model with it too."""
    from ..transfer import models as store

    remote = [h for h in connector.cluster.hosts if not h.local]
    try:
        entries = store.require_all(store.push(connector, remote, store.describe(model), progress=events.model_progress,
                                               on_route=lambda route: events.model_route(route.lines()),
                                               **push)) if remote else {}
    except BaseException:
        events.copy_ended("model")       # its progress stops before the line that says why
        raise
    for host in connector.cluster.hosts:
        entry = entries.get(host.name)
        events.model_stored(host.name, entry, entry.path if entry is not None else model)
    return entries


def push_for_run(connector: Connector, model: str, events: RunEvents, direct: bool = False) -> dict[str, str]:
    """push_model, for run: host name -> where its ranks read the model (its store's copy), this machine's none;
    on this machine alone, nothing to push or say."""
    if all(h.local for h in connector.cluster.hosts):
        return {}
    return {name: entry.path for name, entry in push_model(connector, model, events, direct=direct).items()}
