"""Bringing a job's results home, whatever its outcome: what it left in its run directory on the first host
(checkpoints, metrics; and what its kind says it produced there, told: program.Capabilities.products), and every
`--fetch PATH` from rank 0's host, or from every host (transfer/fetch.py)."""
from __future__ import annotations

import os

from ..errors import ClusterctlError
from ..hosts.connector import Connector
from ..launch.job import Launch
from ..program import Program
from ..transfer.fetch import fetch_outputs
from ..transfer.stage import fetch_run_dir
from .events import RunEvents, told


def fetch_run(connector: Connector, launch: Launch, program: Program, events: RunEvents) -> None:
    """Bring home what the job left in its run directory on the first host (checkpoints, metrics), and tell what
    of its kind's products it holds."""
    host = connector.cluster.hosts[0]
    remote_dir = connector.run_dir(host, launch.run_id) + "/"
    try:
        with told(events, "fetch") as progress:
            files, nbytes = fetch_run_dir(connector, launch.run_id, launch.run_dir, progress=progress)
    except (OSError, EOFError, ClusterctlError) as e:   # reported; the files stay on the host
        events.fetch_failed(launch, host.name, remote_dir, e)
        return
    if files:
        events.fetched(launch, host.name, remote_dir, files, nbytes)
        found = produced(program, launch.run_dir)
        if found:
            events.produced(launch, found)


def produced(program: Program, run_dir: str) -> list[tuple[str, str]]:
    """(what, its directory here) for each product of the program's kind that `run_dir` holds whole."""
    places = [(p.what, os.path.join(run_dir, p.path), p.marker) for p in program.kind.products(program.args)]
    return [(what, path) for what, path, marker in places if os.path.isfile(os.path.join(path, marker))]


def fetch_paths(connector: Connector, launch: Launch, paths: tuple[str, ...], project: str, all_ranks: bool,
                events: RunEvents) -> None:
    """Every --fetch PATH from rank 0's host (or every host: `all_ranks`), told."""
    with told(events, "fetch") as progress:
        fetched = fetch_outputs(connector, paths, project, launch.run_dir, all_ranks=all_ranks, progress=progress)
    events.outputs_fetched(launch, fetched)
