"""The program run starts and what it reads, from run's arguments, before anything moves: SCRIPT, `-m MODULE` or
the bundled trainer, of the kind `RunOptions.kinds` know its module as (program_for); `--resume latest` made a run
directory (resume_latest); the model it reads as a directory here, a hub id resolved (model_here); and the
directories it reads, copied with the project or to be found on every host (program_inputs)."""
from __future__ import annotations

import os
import re
from dataclasses import replace

from ..errors import UsageError
from ..inventory import Cluster
from ..launch.job import run_dir_of_ranks
from ..observe.runs import latest_checkpoint
from ..program import Capabilities, Program, kind_of
from ..trainer_program import BundledTrainer
from ..transfer import hub
from .events import RunEvents
from .options import RunOptions

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def program_for(script: str | None, args: tuple[str, ...], module: str | None,
                kinds: tuple[Capabilities, ...] = RunOptions.kinds) -> Program:
    """SCRIPT, `-m MODULE` or the bundled trainer, from run's arguments (pure), of the kind `kinds` know its
    module as. A module name is checked here, before anything starts: dotted Python identifiers, as `python -m`
    takes them."""
    if script is not None and script.startswith("-"):
        args, script = (script, *args), None     # `run -- --steps 100`: arguments for the default program
    if script is not None and module:
        raise UsageError("give a SCRIPT or --module, not both")
    if module is not None and not _MODULE_NAME.fullmatch(module):
        hint = (f"; to run the file, write `clusterctl run {module}`" if module.endswith(".py") or "/" in module
                else "")
        raise UsageError(f"-m {module!r} is not a module name (dotted Python identifiers, like pkg.train){hint}")
    if script is None:
        module = module or BundledTrainer.module
        return Program(None, module, tuple(args), kind_of(module, kinds))
    return Program(script, None, tuple(args))


def resume_latest(program: Program, cluster: Cluster, runs_dir: str, events: RunEvents) -> Program:
    """A program that asks for the latest checkpoint (the bundled trainer's `--resume latest` without `--out`):
    under run every run has a directory of its own, so `latest` is the newest run here (in runs_dir) that holds a
    checkpoint, as its ranks name its directory (docs/trainer.md#resume); no such run is one line, exit 2."""
    if not program.kind.asks_latest(program.args):
        return program
    found = latest_checkpoint(runs_dir)
    if found is None:
        raise UsageError(f"--resume latest: no run in {runs_dir}/ holds a checkpoint (name one with --resume "
                         f"{runs_dir}/<id>, or start afresh without --resume)")
    run_id, step = found
    there = run_dir_of_ranks(cluster, run_id, os.path.abspath(os.path.join(runs_dir, run_id)))
    events.note(f"--resume latest: run {run_id}, from its {step} (--resume {there})")
    return replace(program, args=tuple(program.kind.resuming_from(program.args, there)))


def model_here(program: Program, project: str) -> tuple[Program, str | None]:
    """The model the program reads (its kind's `store_model`) as a directory here, which run puts into the hosts'
    stores, or None (none, or not here: then it must be on every host as given). A Hugging Face id is resolved in
    the hub's cache here (transfer/hub.py: downloaded into it first when need be) and the program's arguments
    then name that snapshot (what its records keep)."""
    given = program.kind.store_model(program.args)
    if given is None:
        return program, None
    resolved = hub.resolve(given, project)
    if resolved != given:
        program = replace(program, args=tuple(program.kind.with_store_model(program.args, resolved)))
    path = os.path.realpath(os.path.join(project, os.path.expanduser(resolved)))
    return program, path if os.path.isdir(path) else None


def program_inputs(program: Program, options: RunOptions, project: str) -> list[tuple[str, str, bool]]:
    """(flag, path, whether run copies it with the project) for the directories the program reads (its kind's
    inputs: the bundled trainer's --model, and its --data when run gives none). A relative path inside the
    project is copied (unless --no-sync); an absolute one, or one that leads out of the project, must be on
    every host already (the ranks read it as given, from their workdir)."""
    root = os.path.realpath(project)
    copies = options.sync and program.kind.copies_project
    found = []
    for flag, path in program.kind.inputs(program.args, run_gives_data=bool(options.data_dir)):
        inside = not os.path.isabs(path) and \
            not os.path.relpath(os.path.realpath(os.path.join(root, path)), root).startswith(os.pardir)
        found.append((flag, path, inside and copies))
    return found
