"""Everything `run` checks and resolves before anything moves (get_ready -> Ready): the program, the cluster (--env,
data-plane addresses), the backend's and the restart policy's refusals, the program's own checks on the last plan
(check_program), and the inputs that must already be on the hosts. run and a detached run's start share it."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import UsageError
from ..hosts.connector import Connector
from ..inventory import Cluster
from ..launch import backends
from ..launch.plan import LaunchPlan, cached_plan, check_inputs_on_hosts
from ..program import PlannedLaunch, Program
from ..transfer.fetch import check_fetch_paths
from .events import RunEvents
from .options import DEFAULT_SLOTS, THIS_MACHINE_BACKEND, RunOptions
from .resolve import model_here, program_for, program_inputs, resume_latest


@dataclass(frozen=True)
class Ready:
    """A run checked and resolved, before anything moves (get_ready): what run and a detached run's start share."""

    program: Program
    cluster: Cluster
    backend: backends.Backend
    connector: Connector
    project: str
    fetch_paths: tuple[str, ...]
    model: str | None          # the program's model as a directory here, which staging puts into the hosts' stores
    checks: bool               # the program's own checks before a launch apply
    warm: bool                 # a cached plan: launch at once, the pre-flight beside it


def get_ready(cluster: Cluster | None, options: RunOptions, events: RunEvents) -> Ready:
    """Everything run checks and resolves before anything moves: the program, the cluster (--env, data-plane
    addresses), the backend's and the restart policy's refusals, the program's own checks on the last plan, and
    the inputs that must already be on the hosts."""
    program = program_for(options.script, options.args, options.module, options.kinds)
    settings = options.attempts
    fetch_paths = check_fetch_paths(options.fetch_paths)          # a bad PATH: refused before anything starts
    if options.fetch_all_ranks and not fetch_paths:
        raise UsageError("--fetch-all-ranks says from where; --fetch PATH says what: give both")
    project = os.path.abspath(options.project_dir or os.getcwd())
    if cluster is None:     # this machine, working where run was started: a relative SCRIPT is the one here
        cluster = Cluster.this_machine(project, slots=DEFAULT_SLOTS, backend=THIS_MACHINE_BACKEND)
    cluster = cluster.with_env(dict(options.env))    # the inventory's env and --env's go the same way from here
    program = resume_latest(program, cluster, settings.runs_dir, events)
    backend = backends.get(options.backend or cluster.launch.backend, options.launcher)
    if backend.needs_addresses and any(not h.address and not h.local for h in cluster.hosts):
        cluster = addresses_from_ssh(cluster, backend.name, events)
    backend.check(cluster)       # --backend may ask for more than the inventory's own backend (jaccl: rdma lists)
    if backend.env_on_command_line and cluster.secrets:
        events.warning(f"{backend.launcher_label} takes the ranks' environment on its command line: the inventory's "
                       "secret env values are visible in `ps` on this machine and the hosts while the job runs "
                       "(clusterctl's own launchers never do that: docs/security.md#where-secrets-go)")
    policy = settings.restart
    policy.check(world=cluster.world_size, backend=backend.name, preflight=settings.preflight,
                 shrink_refusal=program.kind.shrink_refusal(program.args))
    # hosts are resolved (`ssh -G`, a process each) when first needed: a launch from a cached plan that the
    # pre-flight verifies through OpenSSH's own connections may never need them; a first launch resolves them
    # now, so that a host ssh cannot use is named before anything moves
    warm = settings.preflight and not settings.dry_run and cached_plan(cluster) is not None
    connector = Connector(cluster, connect_timeout=options.connect_timeout, lazy=warm)
    staged = options.staged is not None      # the model is in the hosts' stores already (Staged.host_env)
    program, model = (program, None) if settings.dry_run or staged else model_here(program, project)
    # a supervisor's checks ran where the run was detached from (its paths are that machine's)
    checks = program.kind.checks_before_launch and not settings.dry_run and not staged
    if checks:       # what is known before anything moves: the last plan's memory, the inventory's env
        check_program(cluster, cached_plan(cluster) or LaunchPlan.from_inventory(cluster), program, project, options)
    uncopied = [(flag, path) for flag, path, copied in program_inputs(program, options, project) if not copied]
    given = program.kind.store_model(program.args)
    if given is not None and model is None and not settings.dry_run and not staged:   # not here: on every host
        uncopied.append(("model", given))
    if uncopied and settings.preflight and not settings.dry_run and not all(h.local for h in cluster.hosts):
        check_inputs_on_hosts(connector, uncopied, synced=options.sync)
    return Ready(program, cluster, backend, connector, project, fetch_paths, model, checks, warm)


def check_program(cluster: Cluster, plan: LaunchPlan, program: Program, project: str, options: RunOptions) -> None:
    """The program's own checks of the launch as planned, before any rank starts: the bundled trainer refuses a
    run whose memory estimate exceeds the smallest host's (docs/trainer.md#memory-planning), or whose --model /
    --data fine-tuning inputs the ranks would refuse (docs/finetune.md), in one line (exit 2)."""
    program.kind.check(PlannedLaunch(program.args, cluster.world_size, plan.memory,
                                     {h.name: h.env_dict for h in cluster.hosts}, plan.first_os, project,
                                     options.data_dir))


def addresses_from_ssh(cluster: Cluster, backend: str, events: RunEvents) -> Cluster:
    """Hosts with no data-plane `address` under a backend that needs every rank's (ring, jaccl): the IPv4 address
    ssh reaches each at (its HostName as `ssh -G` gives it, an alias's too, resolved here), said in a note. A host
    with none (a name this machine cannot resolve to IPv4) is left for the backend's own refusal."""
    from ..hosts.sshconfig import address_of, resolve_cluster

    targets = resolve_cluster(cluster)
    found = {h.name: address_of(targets[h.name]) for h in cluster.hosts if not h.address and not h.local}
    found = {name: address for name, address in found.items() if address}
    if found:
        events.note(f"{', '.join(found)} {'has' if len(found) == 1 else 'have'} no `address` in the inventory: the "
                    f"{backend} backend's ranks reach {'it' if len(found) == 1 else 'them'} where ssh does "
                    f"({', '.join(f'{n} {a}' for n, a in found.items())}); give `address:` if the data plane is "
                    "another network (Thunderbolt)")
    return cluster.with_addresses(found)
