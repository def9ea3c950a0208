"""What `clusterctl run` starts on every rank (a Program) and what that program can do (its Capabilities), so
that `run` asks a program what it needs instead of comparing its name:

    program = Program("train.py", None, ("--lr", "3e-4"))              # a script of the user's: Capabilities()
    program = Program(None, "clusterctl.train", args, BundledTrainer())   # trainer_program.py
    program.kind.copies_project, program.kind.inputs(program.args, run_gives_data=False), ...

A kind of program is one Capabilities object: this module's base class is any program of the user's (a script,
or a module, `python -m`); the bundled trainer (trainer_program.BundledTrainer) and a service (`clusterctl
serve`'s, serve/service.Service) are the others. run/resolve.py program_for picks the kind by the module a program
runs. Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class PlannedLaunch:
    """What a program's checks before a launch see (Capabilities.check): the launch as planned on this machine,
    before any rank starts."""

    args: tuple[str, ...]              # the program's arguments
    world: int                         # ranks
    memory: Mapping[str, int]          # host -> bytes of memory, as the last pre-flight found it (or none)
    host_env: Mapping[str, Mapping[str, str]]   # host -> the inventory's env for it
    first_os: str | None               # rank 0's host's OS (uname -s), when known
    project: str                       # the project directory here (what run copies)
    data_dir: str | None               # run's own --data (shards from `clusterctl data prepare`), or None


@dataclass(frozen=True)
class Product:
    """What a run of a kind of program leaves in its run directory for its user (Capabilities.products): what it is
    ("model": an mlx-lm model directory; "adapters": mlx-lm's adapter layout, on the base the run adapted), its
    directory relative to the run directory, and the file in it that is there once it was written whole."""

    what: str
    path: str
    marker: str


class Capabilities:
    """What a kind of program can do, one answer each, as `run` asks: this base class answers for any program of
    the user's (a script, or a module), and a kind of program run knows better overrides what differs."""

    module: str | None = None          # the module this kind is (`python -m`); None: any program
    reads_stdin = True                 # its ranks read run's stdin (docs/run.md#standard-input); else EOF at once
    copies_project = True              # run copies the project (the current directory) to the hosts first
    resumes_from_checkpoints = False   # a restart continues from the newest checkpoint a host holds (run spreads it)
    pictures_loss = False              # afterwards, runs/<id>/loss.png from its metrics (observe/plot.py)
    checks_before_launch = False       # check() looks at the planned launch (False: run skips planning one)

    def store_model(self, args: Sequence[str]) -> str | None:
        """The model it reads (a directory here or a Hugging Face id), which run puts into every host's model store
        before the launch, its ranks finding their host's copy in MODEL_DIR_ENV; None: none."""
        return None

    def with_store_model(self, args: Sequence[str], model: str) -> list[str]:
        """Its arguments with the model given as `model` (a hub id resolved to its snapshot here)."""
        return list(args)

    def inputs(self, args: Sequence[str], run_gives_data: bool) -> list[tuple[str, str]]:
        """(flag, path) of the directories it reads that run may copy with the project, or must find on every
        host when it cannot (`run_gives_data`: run's own --data was given)."""
        return []

    def with_data(self, args: Sequence[str], data_dir: str) -> list[str]:
        """Its arguments when run staged shards in `data_dir` on every host (a program of the user's finds them
        in CLUSTERCTL_DATA_DIR)."""
        return list(args)

    def asks_latest(self, args: Sequence[str]) -> bool:
        """Whether its arguments ask to resume from the newest run here with a checkpoint (run finds it)."""
        return False

    def resuming_from(self, args: Sequence[str], run_dir: str) -> list[str]:
        """Its arguments resuming from the checkpoints in `run_dir` (as its ranks name it)."""
        return list(args)

    def shrink_refusal(self, args: Sequence[str]) -> str | None:
        """Why an --elastic restart cannot continue it on fewer ranks (its state sharded over the ranks that
        wrote it), as one line; None: it can."""
        return None

    def check(self, planned: PlannedLaunch) -> None:
        """Raise a one-line BadInput for a launch its ranks would refuse (when checks_before_launch)."""

    def products(self, args: Sequence[str]) -> tuple[Product, ...]:
        """What a run of it may leave in its run directory for its user, which run tells once it came home (those
        that are there); none that clusterctl knows of for a program of the user's."""
        return ()

    def describe(self, args: Sequence[str]) -> dict:
        """What a run of it is, for its record and `runs` (pure): {"kind", "model", "strategy"}: a program whose
        model and strategy clusterctl cannot know."""
        return {"kind": "program", "model": None, "strategy": None}

    @property
    def service(self) -> dict | None:
        """What the run's record says of a service (its URL, model), None for anything else."""
        return None


ANY_PROGRAM = Capabilities()


def kind_of(module: str | None, kinds: Sequence[Capabilities]) -> Capabilities:
    """The kind of the program that runs `module` (None: a script), among `kinds`; else any program's."""
    return next((kind for kind in kinds if module is not None and kind.module == module), ANY_PROGRAM)


@dataclass(frozen=True)
class Program:
    """What every rank runs: a script path, or "-m" with a module first in `args`; `kind`: what it can do (not
    compared: the same program whatever is known of it)."""

    script: str | None                 # the user's SCRIPT, None for a module
    module: str | None
    args: tuple[str, ...]
    kind: Capabilities = field(default=ANY_PROGRAM, compare=False)

    @property
    def label(self) -> str:
        return self.module or self.script

    @property
    def argv(self) -> tuple[str, list[str]]:
        """(bootstrap's script argument, its arguments): (path, args) or ("-m", [module, *args])."""
        return ("-m", [self.module, *self.args]) if self.module else (self.script, list(self.args))

    @property
    def ships_clusterctl(self) -> bool:
        """A module of clusterctl's own runs from the copy run ships to every host."""
        return self.module is not None and self.module.startswith("clusterctl.")

    def rank_args(self, data_dir: str | None = None) -> list[str]:
        """The bootstrap's arguments after the script argument, with the shards run staged in `data_dir` (on a
        changed world, re-staged) given as its kind takes them."""
        script, args = self.argv
        if not data_dir:
            return args
        given = self.kind.with_data(self.args, data_dir)
        return [self.module, *given] if script == "-m" else given
