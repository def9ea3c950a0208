"""The ways a model push copies a model (each an entry: storepush.ModelRoute), and the one place one is chosen for
each host (docs/models.md#relay, CONTRIBUTING "Adding a way to copy models").

    choice = choose(Asked(method="auto", rsync="/usr/bin/rsync", addressed=3), host)
    choice.route.name, choice.reason, choice.note        # "relay", "", ""; or "rsync", "no data-plane address", ""

ROUTES in order, each host given to the first entry that takes it:
    RELAY   over this machine's link once, then host to host over the data plane (transfer/relay.py): two or more
            hosts with a data-plane `address`, --method auto, no --direct; it hands back a host its hop could not
            serve, to the routes after it
    RSYNC   from here to each host with rsync (transfer/direct.py); SFTP for a host that has no rsync
    SFTP    from here to each host over its file session: takes every host

The reason a host is pushed from here (the first entry's refusal) is what the route's lines print
(`push: direct: h4 (no data-plane address)`), and the chosen entry's note what its StoreEntry says: both come from
the Choice, never from its conditions written again.
"""
from __future__ import annotations

from typing import Sequence

from ..inventory import Host
from .direct import RsyncRoute, SftpRoute
from .relay import RelayRoute
from .storepush import Asked, Choice, ModelRoute

RELAY, RSYNC, SFTP = RelayRoute(), RsyncRoute(), SftpRoute()
ROUTES: tuple[ModelRoute, ...] = (RELAY, RSYNC, SFTP)


def choose(asked: Asked, host: Host, routes: Sequence[ModelRoute] = ROUTES) -> Choice:
    """The first of `routes` that takes `host` (pure): its Choice, whose reason is the first route's refusal
    ("" when the first takes it) and whose note is the chosen route's."""
    first: str | None = None
    for route in routes:
        refusal = route.refusal(asked, host)
        if refusal is None:
            return Choice(route, first or "", route.note(asked, host))
        first = refusal if first is None else first
    raise AssertionError(f"no route takes {host.name}: the last of ROUTES must take every host")


def after(route: ModelRoute) -> tuple[ModelRoute, ...]:
    """The routes after `route` in ROUTES: where the hosts it hands back go."""
    return ROUTES[ROUTES.index(route) + 1:]
