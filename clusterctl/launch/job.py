"""A launch, prepared: a run id and directory, each rank's environment and the bootstrap every rank runs,
the launcher's command line from the backend, and how to start it, here or on the first host.

    launch = prepare(cluster, plan, program="-m", args=["clusterctl.train", ...], backend=get("ring"),
                     runs_root="runs", site=site, connector=connector)
    launch.describe()          # what will run (the dry run prints it)
    process = launch.start(lines)

Nothing is written on any host before start(): a dry run writes only the local run directory.
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Mapping

from ..atomic import write_text
from ..hosts.connector import RUN_FILES_DIR, Connector, ranks_run_dir
from ..hosts.probe import find_mpirun_sh
from ..hosts.stdinfeed import StdinFeed
from ..hosts.local import LocalTransport
from ..hosts.scripts.contract import HOST_ENV, RELAY_ENV, RUN_TOKEN  # the first two read (and removed) by the rank bootstrap
from ..hosts.transport import Process
from ..inventory import Cluster, scrub
from .backends import Backend, LauncherCommand, write_files
from .bootstrap import BOOTSTRAP
from .plan import LaunchPlan
from .site import LaunchSite
from .stdinrelay import relayed_start

# what a launch from the first host asks it first: its home, whether we are root there, its ssh and its mpirun
# (by absolute path, also where Homebrew puts it: sshd's PATH on a Mac does not have it)
LAUNCH_HOST_FACTS = find_mpirun_sh() + '; printf "%s\\n%s\\n%s\\n%s" "$HOME" "$(id -u)" "$(command -v ssh)" "$m"'
HEARTBEAT_S = 1.0          # every rank's bootstrap beats this often (supervise's hang timeout reads it)


@dataclass
class Launch:
    run_id: str
    run_dir: str
    backend: str
    argv: list[str]
    env: dict[str, str]              # for the launcher process on this machine (PATH for the ssh shim)
    rank_env: dict[str, str]         # what every rank gets
    rank_hosts: list[str]            # rank -> host name
    start: Callable[[queue.Queue], Process]
    site: LaunchSite = LaunchSite()  # where the launcher runs
    remote_command: str = ""         # the shell line that starts it there, when that is a host
    log_dir: str = ""                # the rank logs, launcher.log and launch.json: run_dir, or its attempt-K/
    # what `clusterctl stacks RUN` needs to reach the ranks without being told the inventory again
    inventory: str | None = None     # the inventory file the cluster came from (None: this machine alone)
    rank_files: dict[str, str] = field(default_factory=dict)   # host -> the ranks' pid and stacks files there
    secrets: list[str] = field(default_factory=list)           # env values no record shows (Cluster.secrets)
    exit_is_every_ranks: bool = False   # the launcher's exit 0 is every rank's (Backend.exit_is_every_ranks)

    def __post_init__(self):
        self.log_dir = self.log_dir or self.run_dir

    def describe(self) -> dict:
        """What will run, for the dry run and launch.json: secret env values replaced by <redacted>."""
        return scrub({"run_id": self.run_id, "backend": self.backend, "argv": self.argv,
                      "command": shlex.join(self.argv), "launcher_env": self.env, "rank_env": self.rank_env,
                      "rank_hosts": self.rank_hosts, "inventory": self.inventory, "rank_files": self.rank_files,
                      **({"launcher_host": self.site.host, "remote_command": self.remote_command}
                         if self.site.host else {})}, self.secrets)


def new_run_id() -> str:
    """YYYYmmdd-HHMMSS-hex6, as contract.RUN_ID matches it."""
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def rank_hosts(cluster: Cluster) -> list[str]:
    return [h.name for h in cluster.hosts for _ in range(h.slots)]


def run_dir_of_ranks(cluster: Cluster, run_id: str, run_dir: str) -> str:
    """A run's directory as its ranks name it: on this machine `run_dir` itself when every rank runs here; on
    other machines this machine's path means nothing, so runs/<id> in the host's workdir (the bootstrap makes it
    absolute), where the bundled trainer keeps its checkpoints."""
    return run_dir if all(h.local for h in cluster.hosts) else ranks_run_dir(run_id)


def rank_environment(cluster: Cluster, plan: LaunchPlan, run_id: str, run_dir: str,
                     extra_env: dict[str, str] | None = None, restart: int | None = None,
                     host_env: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """What every rank finds in its environment: the plan's (libmpi, the inventory's env), clusterctl's
    own CLUSTERCTL_* variables, unbuffered output, and the caller's extras; `host_env`: values of each host's own
    (host name -> values), which its ranks get through the bootstrap as they get the inventory's per-host env.
    A restartable run (`restart` not None) adds CLUSTERCTL_RESTART (0 for the first attempt, then 1, 2, ...) and, on a restart,
    CLUSTERCTL_RESUME_DIR: the run directory the earlier attempts wrote their checkpoints into."""
    rank_run_dir = run_dir_of_ranks(cluster, run_id, run_dir)
    env = {**plan.env, "CLUSTERCTL_WORLD_SIZE": str(cluster.world_size), "CLUSTERCTL_RUN_DIR": rank_run_dir,
           "CLUSTERCTL_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}
    if restart is not None:
        env["CLUSTERCTL_RESTART"] = str(restart)
        if restart:
            env["CLUSTERCTL_RESUME_DIR"] = rank_run_dir
    differ = host_env_overrides(cluster, host_env)
    if differ:
        env[HOST_ENV] = json.dumps(differ, separators=(",", ":"))
    # every rank gets the first host's own values, as the launcher gives them; the others' differ as above
    return {**env, **(extra_env or {}), **(host_env or {}).get(cluster.hosts[0].name, {})}


def host_env_overrides(cluster: Cluster, extra: Mapping[str, Mapping[str, str]] | None = None
                       ) -> dict[str, dict[str, str | None]]:
    """Per rank (its number as a string), how its host's inventory `env` (with `extra`'s values for that host:
    host name -> values) differs from the first host's, which every launcher gives every rank (one `-x NAME`
    list for mpirun, one environment for the others): the values to set, None for a name to remove. The
    bootstrap applies its rank's entry before the program starts, so each host's own `env:` reaches its ranks
    (Python has started by then: variables Python itself reads at start-up, PYTHONPATH and the like, must be the
    same on every host)."""
    def env_of(host) -> dict[str, str]:
        return {**host.env_dict, **(extra or {}).get(host.name, {})}

    first = env_of(cluster.hosts[0])
    out: dict[str, dict[str, str | None]] = {}
    rank = 0
    for host in cluster.hosts:
        mine = env_of(host)
        delta: dict[str, str | None] = {k: v for k, v in mine.items() if first.get(k) != v}
        delta.update({k: None for k in first if k not in mine})
        for _ in range(host.slots):
            if delta:
                out[str(rank)] = delta
            rank += 1
    return out


def rank_program(cluster: Cluster, run_id: str, script: str, args: list[str]) -> list[str]:
    """python and its arguments on every rank: the bootstrap (bootstrap.py), which works in its host's
    workdir, then runs `script` (a path, or "-m" and a module) with `args`. The run id is on every rank's
    command line, so the cleanup sweep finds them: as the bootstrap's first line, a comment, because
    `pgrep -f` on macOS <= 13 sees only a command line's first 2,048 bytes (docs/facts/macos.md#pgrep-2048-bytes)."""
    workdirs = [h.workdir for h in cluster.hosts for _ in range(h.slots)]
    workdir = workdirs[0] if len(set(workdirs)) == 1 else json.dumps(workdirs)   # the bootstrap picks its rank's
    return [cluster.hosts[0].python, "-c", f"#{RUN_TOKEN}{run_id}\n{BOOTSTRAP}", workdir, str(HEARTBEAT_S),
            script, *args]


def prepare(cluster: Cluster, plan: LaunchPlan, *, script: str, args: list[str], backend: Backend, runs_root: str,
            site: LaunchSite, connector: Connector, extra_env: dict[str, str] | None = None,
            run_id: str | None = None, restart: int | None = None, stdin: StdinFeed | None = None,
            host_env: Mapping[str, Mapping[str, str]] | None = None) -> Launch:
    """Make the local run directory and build the launch. On the first host (site.host, reached by
    site.transport) the launcher's files go to <workdir>/.clusterctl/runs/<id>/ there, copied when the
    launch starts. The launcher's ssh is given the connector's settings.
    A restart (run --max-restarts) keeps the run's id and directory, where the ranks' checkpoints are, and
    gives each attempt its own logs in runs/<id>/attempt-K/, K = `restart` (0 for the first).
    `stdin`: what the launcher, and through it every rank, reads (docs/run.md#standard-input); None: EOF at once.
    A later attempt reads on where the one before stopped."""
    run_id = run_id or new_run_id()
    run_dir = os.path.abspath(os.path.join(runs_root, run_id))
    log_dir = run_dir if restart is None else os.path.join(run_dir, f"attempt-{restart}")
    # private: launch.json and the launcher's files hold the ranks' environment (the inventory's env values)
    for folder in dict.fromkeys([run_dir, log_dir]):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    # the backend the ranks were started for: the bundled trainer initialises exactly that one
    # every rank's stdin from its host's relay, through FIFOs named with this attempt's tag
    relay = secrets.token_hex(4) if stdin is not None and backend.stdin_to_rank0_only else None
    rank_env = rank_environment(cluster, plan, run_id, run_dir, {"CLUSTERCTL_BACKEND": backend.name, **(extra_env or {}),
                                                                 **({RELAY_ENV: relay} if relay else {})},
                                restart=restart, host_env=host_env)
    program = rank_program(cluster, run_id, script, args)
    if site.host is None:
        launch = _prepare_here(cluster, plan, backend, site, run_id, run_dir, rank_env, program, connector,
                               log_dir, None if relay else stdin)
    else:
        launch = _prepare_on_host(cluster, plan, backend, site, run_id, run_dir, rank_env, program, connector,
                                  log_dir, None if relay else stdin)
    if relay:
        launch.start = relayed_start(cluster, connector, run_id, relay, launch.rank_hosts, stdin, launch.start)
    launch.log_dir = log_dir
    launch.inventory = os.path.abspath(cluster.path) if os.path.isfile(cluster.path) else None
    launch.rank_files = {h.name: connector.rank_files_dir(h, run_id) for h in cluster.hosts}
    launch.secrets = cluster.secrets
    description = json.dumps(launch.describe(), indent=2) + "\n"
    for where in {run_dir, log_dir}:      # the run's own is the newest attempt's (`clusterctl logs` reads it)
        write_text(os.path.join(where, "launch.json"), description, mode=0o600)
    return launch


def _prepare_here(cluster, plan, backend, site, run_id, run_dir, rank_env, program, connector: Connector,
                  files_dir, stdin) -> Launch:
    site = LaunchSite.here(connector, site.launcher, files_dir)
    command = backend.command(cluster, plan, program=program, rank_env=rank_env, where=site)
    write_files(command)
    env = command.env()
    return Launch(run_id, run_dir, backend.name, command.argv, env, rank_env, rank_hosts(cluster),
                  start=lambda lines: LocalTransport().stream(command.argv, lines, env, stdin=stdin), site=site,
                  exit_is_every_ranks=backend.exit_is_every_ranks)


def _prepare_on_host(cluster, plan, backend, site, run_id, run_dir, rank_env, program, connector: Connector,
                     files_dir, stdin) -> Launch:
    host, remote = cluster.host(site.host), site.transport
    facts = remote.run(LAUNCH_HOST_FACTS, timeout=30).stdout.split("\n")
    home, uid, ssh, mpirun = (facts + ["", "", "", ""])[:4]
    workdir = home + host.workdir[1:] if host.workdir.startswith("~") else host.workdir
    there = f"{workdir.rstrip('/')}/{RUN_FILES_DIR}/{run_id}"
    # the launcher's ssh on that host reads that host's rendering of the inventory, sent with the launch
    config = f"{there}/ssh_config"
    site = site.ready(there, ssh=ssh.strip() or None, as_root=uid.strip() == "0",
                      launcher=backend.launcher_on_host(host.python, mpirun=mpirun.strip() or None),
                      ssh_options=("-F", config))
    command = backend.command(cluster, plan, program=program, rank_env=rank_env, where=site)
    command.files.append((config, connector.host_config_text(host), 0o600))
    # a copy of every file in the local run directory, for the record and for `clusterctl hostfile` users
    write_files(_relocated(command, there, files_dir))
    prefix = f"{command.shell_path()}; export PATH; " if command.path_prepend else ""
    text = prefix + "exec " + shlex.join(command.argv)

    def start(lines: queue.Queue) -> Process:
        # Copied only when the launch really starts: a dry run writes nothing on any host.
        for path, _, mode in command.files:
            remote.put(os.path.join(files_dir, os.path.relpath(path, there)), path, mode=mode)
        # closing its channel kills the launcher's tree there; env_values go on the channel's stdin
        return remote.stream(text, lines, env=command.env_values, stdin=stdin)

    return Launch(run_id, run_dir, backend.name, command.argv, {}, rank_env, rank_hosts(cluster), start=start,
                  site=site, remote_command=text, exit_is_every_ranks=backend.exit_is_every_ranks)


def _relocated(command: LauncherCommand, there: str, run_dir: str) -> LauncherCommand:
    files = [(os.path.join(run_dir, os.path.relpath(path, there)), text, mode) for path, text, mode in command.files]
    return LauncherCommand(command.argv, files, command.path_prepend)

