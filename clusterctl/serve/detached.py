"""`serve --detach`: the model checked and put into every host's store from here, exactly as `serve` does it
(service.prepare), then the server handed to a supervisor on one of its hosts, which is `serve` itself (its
attempts, restarts, endpoint watch and record), started there detached from any terminal (clusterctl/detach/, as
`run --detach` hands over a run: run/detached.py hand_over); this machine keeps a record and may go away.

    detached, url = detach(cluster, options, argv, supervisor_name, events)

`argv`: serve's own arguments for the supervisor, without what applies here only (the CLI makes them:
cli/serve.py supervisor_argv). The supervisor is given where each host's rank reads the model (Handoff.stored):
it checks, fuses and moves nothing of the model. A detached server listens on an address of its first host's
network (--listen): nothing of this machine carries a port to it once this machine is gone.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..detach import handoff, supervisor
from ..errors import UsageError
from ..hosts.connector import Connector
from ..inventory import Cluster
from ..launch.job import new_run_id
from ..run.detached import Detached, hand_over
from ..transfer.stage import ship_clusterctl
from .service import ServeEvents, ServeOptions, reachable, one_rank_per_host, prepare


def detach(cluster: Cluster | None, options: ServeOptions, argv: Callable[[str, str], Sequence[str]],
           supervisor_name: str | None, events: ServeEvents | None = None) -> tuple[Detached, str]:
    """The server handed to its supervisor; (the record, the URL it will answer at once ready). `argv(model_path,
    name)` gives the supervisor's words once the model's place and name are known."""
    events = events or ServeEvents()
    if cluster is None:
        raise UsageError("serve --detach needs --hosts: a server on this machine alone would stop with it")
    if options.listen is None:
        raise UsageError("serve --detach needs --listen ADDR (an address of the first host's network, or 0.0.0.0): "
                         "the URL on this machine's loopback, carried over SSH, would close with this machine")
    here = [h.name for h in cluster.hosts if h.local]
    if here:
        raise UsageError(f"serve --detach: {here[0]} is this machine (local: true), whose rank would stop with it: "
                         "serve from the other hosts, or serve attached")
    host = supervisor.choose(cluster, supervisor_name)
    supervisor.check_python(Connector(one_rank_per_host(cluster), **_timeout(options)), host)   # before bytes move
    ready = prepare(cluster, options, events)
    ship_clusterctl(ready.connector, what="the server", hint="serve attached")    # its ranks and its supervisor
    stored = {h.name: path for h, path in zip(ready.cluster.hosts, ready.paths)}
    given = handoff.Handoff(new_run_id(), host.name, handoff.as_seen_from(ready.cluster, host.name),
                            tuple(argv(ready.paths[0], ready.name)), command="serve", stored=stored)
    url = f"http://{reachable(ready.cluster.hosts[0], options.listen)}:{options.port}"
    return hand_over(ready.connector, ready.cluster, host, given, options.attempts.runs_dir), url


def _timeout(options: ServeOptions) -> dict:
    return {"connect_timeout": options.connect_timeout} if options.connect_timeout else {}
