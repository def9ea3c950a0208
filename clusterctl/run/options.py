"""What a caller asks of `run` (RunOptions), and what staging gave the ranks when another process staged the run
(Staged); run's defaults for a job on this machine alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Mapping

from ..hosts.transport import DEFAULT_CONNECT_TIMEOUT_S
from ..launch.attempts import AttemptSettings
from ..program import Capabilities
from ..trainer_program import BundledTrainer

# `clusterctl run` (and serve) without --hosts: this machine alone, over MLX's ring (no MPI needed), two ranks
THIS_MACHINE_BACKEND = "ring"
DEFAULT_SLOTS = 2


# while a job runs, its hosts' telemetry is sampled this often (less often than `top`'s 3 s: a probe starts a Python
# on each host, a cost the run pays while it trains; docs/run.md#the-live-panel)
HOST_SAMPLE_S = 5.0


@dataclass(frozen=True)
class RunOptions:
    script: str | None = None         # a path (relative to the project, i.e. each host's workdir) ...
    args: tuple[str, ...] = ()
    module: str | None = None         # ... or a module; neither: the bundled trainer
    backend: str | None = None        # default: the inventory's launch.backend
    launcher: str | None = None       # what starts the ranks; default: the backend's own (backends.get)
    # how every attempt is launched and watched (runs_dir, launch_from, dry_run: describe the launch, start and
    # write nothing on any host; preflight, restart, the supervisor's watch): handed to the attempts as it is
    attempts: AttemptSettings = AttemptSettings()
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    sync: bool = True                 # copy the project (and clusterctl, for its modules) first
    fetch: bool = True                # bring the first host's run directory home afterwards
    fetch_paths: tuple[str, ...] = ()  # and these (relative to rank 0's workdir, or absolute there)
    fetch_all_ranks: bool = False     # fetch_paths from every host, into runs/<id>/host-<name>/
    data_dir: str | None = None       # shards from `clusterctl data prepare`
    all_shards: bool = False          # ... every shard to every host (the bundled trainer's balancing)
    direct_model: bool = False        # the program's model to each host from here, not relayed host to host
    env: tuple[tuple[str, str], ...] = ()  # run --env: every rank's, over the inventory's (parse_env_options)
    project_dir: str | None = None    # default: the current directory
    # what every rank reads on its stdin, the same bytes to each, then EOF (docs/run.md#standard-input), when
    # its kind reads stdin: the CLI gives its own stdin unless --no-stdin; None, the default here: EOF at once
    stdin: BinaryIO | None = None
    # the kinds of program run knows by the module they are (program.Capabilities): the bundled trainer (the CLI
    # gives it its checks before a launch, train/prelaunch.py; run never imports train/), or serve's Service;
    # any other program is a program of the user's (program.ANY_PROGRAM)
    kinds: tuple[Capabilities, ...] = (BundledTrainer(),)
    # the hosts' telemetry sampled every this many seconds while the job runs (observe/hostwatch.py: the live panel's
    # host rows, a host swapping or throttled told and recorded); None: not sampled
    telemetry_interval: float | None = HOST_SAMPLE_S
    # a detached run's supervisor: what the command that detached it staged (run/detached.py); run stages nothing
    staged: Staged | None = None


@dataclass(frozen=True)
class Staged:
    """What staging gave the ranks, when another process staged the run: every rank's extra environment and each
    host's own (where its ranks read the program's model)."""

    extra_env: Mapping[str, str]
    host_env: Mapping[str, Mapping[str, str]]
