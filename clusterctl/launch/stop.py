"""A stop with the work kept: Ctrl-C or SIGTERM to `run`, or `clusterctl kill`, asks each rank of a program that
said it can (the bundled trainer) to finish its step, write a checkpoint and exit, before anything is killed
(docs/run.md#ctrl-c-and-sigterm).

    asked = ask_to_stop(connector, run_id, signal.SIGINT, ranks_of={"h1": [0], "h2": [1]})   # at once
    asked = ask_to_stop(connector, run_id, signal.SIGTERM, wait_s=60)    # and wait there for them to end
    asked = ask_to_stop(connector, run_id, None, wait_s=60)              # only wait (they were asked before)
    asked.ranks, asked.left, asked.errors

The request goes to each rank's own process over SSH (hosts/scripts/stopranks.py, by the pid file its bootstrap
keeps), whatever the launcher: none passes a signal on to the ranks as such. What they do with a stop,
measured on the test cluster (docs/facts/launchers.md#what-a-stop-sends-the-ranks): clusterctl's rank starter
closes each rank's pipe and its watchdog sends SIGTERM then, 2 s later, SIGKILL; mpirun sends SIGTERM and then
SIGKILL; the sweep's `pkill -f` sends SIGTERM to every process of the run, then SIGKILL. A rank never sees a
SIGINT, and every SIGTERM it sees is followed by a SIGKILL too soon to write a checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..hosts import hostscript
from ..hosts.connector import Connector
from ..hosts.fanout import run_all
from ..hosts.scripts.contract import STOP_SIGNALS

ASK_TIMEOUT_S = 20.0          # one host's answer, not counting the wait for the ranks to end
NAMES = {signum: word for word, signum in STOP_SIGNALS.items()}     # the signal as stopranks.py takes it


@dataclass
class StopAsked:
    ranks: list[int] = field(default_factory=list)              # the ranks signalled (or found), on every host
    left: list[int] = field(default_factory=list)               # of those, alive when the wait ended
    errors: dict[str, str] = field(default_factory=dict)        # host -> why it could not be asked


def ranks_by_host(rank_hosts: list[str]) -> dict[str, list[int]]:
    """host -> its ranks, from each rank's host in rank order (a launch's rank_hosts, launch.json's)."""
    placed: dict[str, list[int]] = {}
    for rank, host in enumerate(rank_hosts):
        placed.setdefault(host, []).append(rank)
    return placed


def ask_to_stop(connector: Connector, run_id: str, signum: int | None, *,
                ranks_of: dict[str, list[int]] | None = None, wait_s: float = 0.0) -> StopAsked:
    """Send `signum` (SIGINT or SIGTERM; None: none) to every rank of `run_id` alive on the connector's hosts
    (only the ranks `ranks_of` places on each host, when given), then wait up to `wait_s` there for them to end."""
    hosts = [h for h in connector.cluster.hosts if ranks_of is None or h.name in ranks_of]

    def one(host):
        only = [str(r) for r in (ranks_of or {}).get(host.name, [])]
        with connector.transport(host) as t:
            return hostscript.run(t, host.python, "stopranks.py", connector.rank_files_dir(host, run_id), run_id,
                                  NAMES[signum], f"{wait_s:g}", *only, timeout=ASK_TIMEOUT_S + wait_s)

    group = run_all(hosts, one, deadline=connector.deadline(ASK_TIMEOUT_S + wait_s))
    asked = StopAsked()
    for name, outcome in group.items():
        if outcome.error is not None:
            asked.errors[name] = str(outcome.error)
            continue
        try:
            answer = hostscript.answer(outcome.value)
        except hostscript.NoAnswer as e:
            asked.errors[name] = str(e)
            continue
        asked.ranks += answer["asked"]
        asked.left += answer["left"]
    asked.ranks.sort()
    asked.left.sort()
    return asked
