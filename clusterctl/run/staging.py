"""Staging: what the job needs copied to its hosts before (or, for the project on a warm launch, beside) the launch,
all at once (they are independent): the project, clusterctl itself (for its modules), each host's own shards and
the program's model into every other host's model store (modelpush.py); transfer/stage.py does the copying."""
from __future__ import annotations

import os
import secrets
from concurrent.futures import wait
from dataclasses import dataclass
from functools import partial
from typing import Callable

from ..errors import ShardError
from ..hosts.connector import Connector
from ..hosts.fanout import Deferred, GroupResult, in_background
from ..program import Program
from ..trainer_contract import MODEL_DIR_ENV
from ..transfer.stage import project_copy, ship_clusterctl, stage_data, stage_project
from .events import RunEvents, told
from .modelpush import push_for_run
from .options import RunOptions
from .resolve import program_inputs


@dataclass(frozen=True)
class BesideCopy:
    """The project's copy, started with the launcher rather than before it (a warm launch: the plan cached,
    the copy most often one rsync round trip that moves nothing): `future` (a Deferred) copies, marking each
    host's copy as ended (transfer/stage.py project_copy), and says so (RunEvents.staged); the ranks of the
    launch it is beside wait for the mark of `token` (COPY_GATE_ENV) before their program runs."""

    token: str
    future: Deferred


def stage(connector: Connector, options: RunOptions, program: Program, project: str, events: RunEvents,
          beside: bool = False, model: str | None = None
          ) -> tuple[dict[str, str], BesideCopy | None, dict[str, dict[str, str]]]:
    """Copy what the job needs to the connector's hosts before launching, the project, clusterctl, the shards
    and the program's `model` (a directory here: into every other host's model store) at once (they are
    independent); returns the ranks' extra environment, with `beside` the project's copy to start with the
    launcher (BesideCopy: what the project's ignore rules leave out of it is refused here all the same, before
    anything moves), and each host's own environment (where its ranks read the model: MODEL_DIR_ENV)."""
    _check_data_dir(options, program)
    jobs = {}
    copy = None
    if model is not None:
        jobs["model"] = in_background(push_for_run, connector, model, events, options.direct_model)
    if options.sync and program.kind.copies_project:
        needed = tuple(path for _, path, copied in program_inputs(program, options, project) if copied)
        inside = model is not None and _inside(project, model)
        excludes = (f"/{os.path.relpath(model, os.path.realpath(project))}/",) if inside else ()   # the store has it
        if beside:
            copy = _beside_copy(connector, project, needed, events, excludes)
        else:
            jobs["project"] = in_background(_told_copy, events, "project", stage_project, connector, project, needed,
                                            excludes)
    if options.sync and program.ships_clusterctl:
        jobs["clusterctl"] = in_background(ship_clusterctl, connector)
    if options.data_dir:
        jobs["data"] = in_background(_told_copy, events, "data", stage_data, connector, options.data_dir,
                                     all_shards=options.all_shards)
    wait(jobs.values())
    for future in jobs.values():      # the first failure, after every copy has ended
        future.result()
    for what in ("project", "clusterctl"):
        if what in jobs and jobs[what].result() is not None:
            _tell_staged(events, what, jobs[what].result())
    host_env = {host: {MODEL_DIR_ENV: path} for host, path in jobs["model"].result().items()} if "model" in jobs else {}
    return ({"CLUSTERCTL_DATA_DIR": jobs["data"].result()} if "data" in jobs else {}), copy, host_env


def _check_data_dir(options: RunOptions, program: Program) -> None:
    """run's --data must hold `clusterctl data prepare`'s shards: the trap of an option both accept is to say whose
    --data this was (docs/run.md#the-command-line)."""
    if options.data_dir and not os.path.isfile(os.path.join(options.data_dir, _manifest())):
        what = "no such directory" if not os.path.isdir(options.data_dir) else f"no {_manifest()} there"
        raise ShardError(f"--data {options.data_dir}: {what}. This --data is clusterctl's, for shards from "
                         f"`clusterctl data prepare`, because it came before the program; if it was meant for "
                         f"{program.label}, write it after {program.label}")


def _tell_staged(events: RunEvents, what: str, group: GroupResult) -> None:
    """events.staged: the hosts a copy went to, the files and bytes it moved."""
    events.staged(what, len(group), sum(len(o.value.moved) for o in group.values()),
                  sum(o.value.moved_bytes for o in group.values()))


def _inside(project: str, path: str) -> bool:
    rel = os.path.relpath(path, os.path.realpath(project))
    return rel != os.curdir and not rel.startswith(os.pardir)


def _told_copy(events: RunEvents, what: str, copy: Callable, *args, **kwargs):
    """copy(*args, **kwargs, progress=...) with its progress told (told)."""
    with told(events, what) as progress:
        return copy(*args, progress=progress, **kwargs)


def _beside_copy(connector: Connector, project: str, needed: tuple[str, ...], events: RunEvents,
                 excludes: tuple[str, ...] = ()) -> BesideCopy | None:
    token = secrets.token_hex(8)
    progress = partial(events.copy_progress, "project")
    send = project_copy(connector, project, needed, gate=token, excludes=excludes, progress=progress)   # its refusals now
    if send is None:
        return None

    def copy() -> GroupResult:
        try:
            group = send()
        finally:
            events.copy_ended("project")
        _tell_staged(events, "project", group)
        return group

    return BesideCopy(token, Deferred(copy))


def _manifest() -> str:
    from ..transfer.shards import MANIFEST    # here: not every run loads the shards' code (30 ms)
    return MANIFEST
