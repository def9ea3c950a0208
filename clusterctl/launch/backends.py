"""The launch backends, one registry entry each: how a job starts on every rank for MLX's `mpi`, `ring`
and `jaccl` backends. Everything that differs between backends is here; the rest of clusterctl asks the
registry (`get(name)`, `names()`), never compares backend names.

    backend = get("ring")
    command = backend.command(cluster, plan, program=[...], rank_env={...}, where=LaunchSite.here(connector, launcher, dir))
    command.argv, command.files, command.path_prepend       # what to write where, and what to run

A backend entry says: which MLX backend it is, which launcher starts the ranks (mpirun or mlx.launch),
where that launcher is on this machine or on a host, which hostfile it reads, its command line, what
`bench --tune` may vary and how a chosen setting is written to the inventory, whether `run --elastic` can
shrink its world, which variable names a rank's peers (the world check's hint) and doctor's smoke test for
it. Adding a backend is adding an entry to REGISTRY (and its tests).

Below the registry, the pure builders: mpirun's and mlx.launch's command lines. One source of truth for
every `--mca`: clusterctl's own settings, with any `--mca KEY VALUE` in the inventory's mpi.extra_args
replacing ours for the same KEY instead of repeating it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from ..atomic import write_text
from ..errors import InventoryError, LaunchError, UsageError
from ..hosts.facts import RING_STARTING_PORT
from ..hosts.openssh import rsh_agent
from ..hosts.scripts import program as script_program
from ..hosts.quoting import quote_path, shell_command
from ..hosts.remote import env_input, remote_command
from ..inventory import Cluster, load
from . import mlxenv
from .hostfile import render as render_hostfile
from .site import LaunchSite

if TYPE_CHECKING:
    from .plan import LaunchPlan


@dataclass
class LauncherCommand:
    argv: list[str]
    files: list[tuple[str, str, int | None]] = field(default_factory=list)   # (path, text, mode) to write first
    path_prepend: str | None = None   # a directory to put first on the launcher's PATH (mlx.launch's ssh shim)
    # what the launcher must find in its own environment (mpirun's `-x NAME` passes NAME's value from there):
    # given to it on its stdin (hosts/transport.py), never on a command line
    env_values: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """What the launcher's process on this machine is given on top of this environment."""
        path = {"PATH": self.path_prepend + os.pathsep + os.environ.get("PATH", "")} if self.path_prepend else {}
        return {**self.env_values, **path}

    def by_hand(self) -> str:
        """The command as a line to type: env_values and the PATH as assignments before it."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env_values.items()]
        return " ".join([*words, *([self.shell_path()] if self.path_prepend else []), shlex.join(self.argv)])

    def shell_path(self) -> str:
        """The same for a shell line: a PATH assignment to put before the command, or ""."""
        return f'PATH={shlex.quote(self.path_prepend)}:"$PATH"' if self.path_prepend else ""


class Backend:
    """One way of starting ranks. Subclasses fill in the launcher; instances are the registry entries."""

    name: str                         # MLX's backend name (`mx.distributed.init(backend=name)`)
    launcher_name: str                # "mpirun", "mlx.launch", "clusterctl" (run's --launcher)
    hostfile_format: str              # hostfile.FORMATS key
    hostfile_name: str                # its file name in a run directory
    benchmarked = False               # `clusterctl bench` measures it
    install_hint: str                 # how to install the launcher on this machine
    tune_count: str | None = None     # the count `bench --tune` varies (1, 2, 4, 8) ...
    tune_subnets = False              # ... and whether it also tries every subnet the hosts share
    mpi4py_reference = False          # bench can time raw mpi4py beside MLX on it
    needs_mpi = False                 # every host needs Open MPI (mpirun, libmpi) for it
    needs_addresses = False           # every host needs its data-plane `address` for it
    neighbours_only = False           # ranks exchange data only with their ring neighbours (bench --p2p)
    rdma: str | None = None           # jaccl: which rank pairs need an RDMA device, "mesh" (all) or "ring" (neighbours)
    fallbacks: Mapping[str, "Backend"] = {}   # other launchers that can start it, by launcher name
    peers_variable: str | None = None  # the variable naming a rank's peers to MLX (the world check's hint)
    smoke_needs: tuple[str, ...] | None = None   # doctor checks its smoke test needs passed; None: it has none
    env_on_command_line = False       # its launcher takes the ranks' env values as arguments (`ps` shows them)
    stdin_to_rank0_only = False       # its launcher gives its stdin to rank 0 alone: run relays it (launch/stdinrelay.py)

    @property
    def launcher_label(self) -> str:
        """The launcher, for messages."""
        return "clusterctl's rank starter" if self.launcher_name == "clusterctl" else self.launcher_name

    def launcher_here(self) -> list[str] | None:
        """The launcher's argv prefix on this machine, None when it is not installed here."""
        raise NotImplementedError

    def launcher_on_host(self, python: str, mpirun: str | None = None) -> list[str]:
        """The launcher's argv prefix on a host whose python is `python` (doctor checked it is there) and
        whose mpirun, if it has one, is at `mpirun` (an absolute path the host reported)."""
        raise NotImplementedError

    def command(self, cluster: Cluster, plan: LaunchPlan, *, program: Sequence[str], rank_env: Mapping[str, str],
                where: LaunchSite, hostfile: str | None = None, cwd: str | None = None) -> LauncherCommand:
        """The launcher's command line for `program` (python and its arguments, python first) on every
        rank, each rank getting rank_env. The hostfile is written into where.dir unless `hostfile` names
        one that exists already. The launcher's ssh gets where.ssh_options. `cwd`: the directory ranks
        start in, for a line run by hand (`run`'s ranks change to their workdir in the bootstrap)."""
        raise NotImplementedError

    def hostfile(self, cluster: Cluster) -> str:
        return render_hostfile(cluster, self.hostfile_format, backend=self.name, env={}, rdma=self.rdma is not None)

    def check(self, cluster: Cluster) -> None:
        """InventoryError, at the inventory's line, when `cluster` cannot run on this backend (before anything
        is launched). Backends with rdma need every host's `rdma` list (docs/facts/macos.md#jaccl)."""
        if self.rdma is not None:
            check_rdma(cluster, self.name, ring=self.rdma == "ring")

    @property
    def shrink_refusal(self) -> str | None:
        """Why `run --elastic` cannot continue a job of this backend on fewer ranks; None when it can."""
        if self.rdma is None:
            return None
        return (f"--elastic cannot shrink a {self.name} world: its rdma table names the device to every rank "
                "of the whole cluster (use --backend ring or mpi for elastic runs)")

    def lost_peers(self) -> str:
        """Why ranks started for this backend most likely each formed a world of one (the world check's line)."""
        return (f"MLX could not join the ranks: its {self.name} backend found no peers (did the program change "
                f"{self.peers_variable}? check the inventory's addresses; clusterctl doctor runs a smoke test)")

    def smoke_ready(self, cluster: Cluster) -> bool:
        """Whether doctor's deep checks can launch this backend's smoke test on `cluster`: it has one, and
        with data-plane addresses, every host has one (docs/facts/launchers.md#mlx-launch-hostfile-format) or
        the cluster is this machine alone, ranks on 127.0.0.1 (docs/facts/launchers.md#mlx-launch-runs-ssh-tt)."""
        if self.smoke_needs is None:
            return False
        if not self.needs_addresses:
            return True
        if len(cluster.hosts) == 1 and cluster.hosts[0].local:
            return cluster.world_size > 1
        return len(cluster.hosts) > 1 and all(h.address for h in cluster.hosts)

    def smoke_fix(self, libmpi_hint: str | None) -> str:
        """What to do when a rank's MLX init failed in the smoke test (`libmpi_hint`: the libmpi doctor found)."""
        return "check the data-plane addresses and that the ring ports are free"

    def with_setting(self, cluster: Cluster, setting: Mapping[str, object]) -> Cluster:
        """`cluster` with a `bench --tune` candidate applied."""
        raise NotImplementedError

    def tune_conflict(self, cluster: Cluster) -> str | None:
        """Why `bench --tune` cannot vary the setting in this inventory, if it cannot."""
        return None

    def inventory_lines(self, setting: Mapping[str, object], plan: LaunchPlan) -> list[tuple[str, str, str]]:
        """(section, key, YAML value) that store a tuned setting in the inventory (what `plan` already
        uses without the inventory saying so is not written)."""
        raise NotImplementedError


class MPIBackend(Backend):
    """MLX's `mpi` backend, started by Open MPI's mpirun over an Open MPI hostfile. mpirun's daemons ssh
    to the hosts with our OpenSSH options (plm_rsh_agent); every variable reaches python through `-x`."""

    name, launcher_name, hostfile_format, hostfile_name = "mpi", "mpirun", "openmpi", "hostfile"
    benchmarked, tune_count, tune_subnets, mpi4py_reference, needs_mpi = True, "btl_tcp_links", True, True, True
    smoke_needs = ("mpirun",)         # no peers variable: mpirun tells the ranks their peers
    stdin_to_rank0_only = True        # docs/facts/launchers.md#mpirun-stdin-all
    install_hint = ("install Open MPI here too (macOS: brew install open-mpi; Debian: apt install openmpi-bin), or "
                    "run clusterctl from one of the hosts")

    def launcher_here(self):
        # by its absolute path: Open MPI then starts its daemons on the other hosts from the same prefix, so
        # they need not be on sshd's PATH there (docs/facts/launchers.md#mpirun-absolute-path)
        found = shutil.which("mpirun")
        return [os.path.abspath(found)] if found else None

    def launcher_on_host(self, python, mpirun=None):
        return [mpirun or "mpirun"]

    def lost_peers(self):
        return ("MLX could not join the ranks: under mpirun it could not load libmpi (MLX_MPI_LIBNAME, "
                "LD_LIBRARY_PATH / DYLD_FALLBACK_LIBRARY_PATH; see clusterctl doctor)")

    def smoke_fix(self, libmpi_hint):
        # docs/facts/mlx-distributed.md#mlx-mpi-libname, docs/facts/mlx-distributed.md#mpi-backend-needs-open-mpi
        return ("MLX could not load libmpi: set `mpi_lib_dir:` (or MLX_MPI_LIBNAME in env) to the Open MPI "
                "libmpi" + (f" (doctor found {libmpi_hint})" if libmpi_hint else "") + "; MLX needs Open MPI")

    def command(self, cluster, plan, *, program, rank_env, where, hostfile=None, cwd=None):
        files = []
        if hostfile is None:
            hostfile = os.path.join(where.dir, self.hostfile_name)
            files.append((hostfile, self.hostfile(cluster), None))
        program = [plan.python(cluster), *program[1:]]      # mpirun execs it without a shell
        argv = mpirun_argv(cluster, hostfile=hostfile, program=program, env=rank_env,
                           rsh_agent=rsh_agent(list(where.ssh_options)),
                           if_include=plan.if_include, as_root=where.as_root,
                           mpirun=(where.launcher or ["mpirun"])[0], wdir=cwd)
        return LauncherCommand(argv, files, env_values=dict(rank_env))

    def with_setting(self, cluster, setting):
        return dataclasses.replace(cluster, mpi=dataclasses.replace(
            cluster.mpi, btl_tcp_links=setting["btl_tcp_links"], if_include=setting["if_include"]))

    def tune_conflict(self, cluster):
        if "btl_tcp_links" in cluster.mpi.extra_args:
            return ("mpi.extra_args sets --mca btl_tcp_links itself, which overrides mpi.btl_tcp_links: remove it "
                    "there so --tune can try and store values")
        return None

    def inventory_lines(self, setting, plan):
        lines = [("mpi", "btl_tcp_links", str(setting["btl_tcp_links"]))]
        if setting.get("if_include") and setting["if_include"] != plan.if_include:
            lines.append(("mpi", "if_include", json.dumps(setting["if_include"])))
        return lines


# mlx.launch's own entry point, for a host where only python (with mlx) is known to be installed
# (a private module: docs/facts/launchers.md#mlx-launch-is-a-module)
MLX_LAUNCH_MODULE = "import sys; from mlx._distributed_utils.launch import main; sys.exit(main())"


class MLXLaunchBackend(Backend):
    """MLX's own launcher, mlx.launch, for the `ring` (TCP) and `jaccl` (Thunderbolt RDMA) backends, over
    its JSON hostfile of the hosts' data-plane addresses. It runs plain `ssh HOST`, so it finds our
    OpenSSH options through an `ssh` shim first on its PATH."""

    launcher_name, hostfile_format, hostfile_name = "mlx.launch", "mlx", "hosts.json"
    needs_addresses = True            # its hostfile lists every rank's IP (docs/facts/launchers.md#mlx-launch-hostfile-format)
    install_hint = "pip install mlx here as well"
    env_on_command_line = True        # `--env NAME=VALUE` (its remote ssh command exports them too)

    def __init__(self, name: str, benchmarked: bool = False, tune_count: str | None = None,
                 neighbours_only: bool = False, rdma: str | None = None, smoke_needs: tuple[str, ...] | None = None):
        self.name, self.benchmarked, self.tune_count, self.neighbours_only = name, benchmarked, tune_count, neighbours_only
        self.rdma, self.smoke_needs = rdma, smoke_needs
        # MLX finds a ring's peers in MLX_HOSTFILE, jaccl's RDMA devices in MLX_IBV_DEVICES (launch/mlxenv.py)
        self.peers_variable = "MLX_HOSTFILE" if rdma is None else "MLX_IBV_DEVICES"

    def launcher_here(self):
        return find_mlx_launch()

    def launcher_on_host(self, python, mpirun=None):
        return [python, "-c", MLX_LAUNCH_MODULE]

    def command(self, cluster, plan, *, program, rank_env, where, hostfile=None, cwd=None):
        if where.ssh is None:
            raise LaunchError(f"mlx.launch needs an OpenSSH client (ssh) on {where.name}")
        files = []
        if hostfile is None:
            hostfile = os.path.join(where.dir, self.hostfile_name)
            files.append((hostfile, self.hostfile(cluster), None))
        shim_dir = os.path.join(where.dir, "ssh")
        files.append((os.path.join(shim_dir, "ssh"), ssh_shim(where.ssh, where.ssh_options), 0o755))
        python, rest = plan.python(cluster), program[1:]      # one --python for every host, not expanded
        argv = mlx_launch_argv(cluster, hostfile=hostfile, backend=self.name, python=python, program=rest,
                               env=rank_env, cwd=cwd, launcher=where.launcher or ["mlx.launch"])
        return LauncherCommand(argv, files, path_prepend=shim_dir)

    def with_setting(self, cluster, setting):
        return dataclasses.replace(cluster, launch=dataclasses.replace(
            cluster.launch, connections_per_ip=setting["connections_per_ip"]))

    def inventory_lines(self, setting, plan):
        return [("launch", "connections_per_ip", str(setting["connections_per_ip"]))]


class RankStarterBackend(Backend):
    """MLX's `ring` backend started by clusterctl itself (docs/facts/launchers.md#our-rank-starter): every rank
    is started directly, over the one OpenSSH rendering (hosts/openssh.py) or on the launching machine
    without ssh, with exactly the environment MLX's own launcher gives it (MLX_RANK, and MLX_HOSTFILE
    naming a file with every rank's `ip:port` list; see rank_env below). The starter is a standard-library
    program (hosts/scripts/ranks.py) that sleeps in select() between lines; mlx.launch stays available as
    a fallback (`--launcher mlx.launch`)."""

    launcher_name, hostfile_format, hostfile_name = "clusterctl", None, "ranks.json"
    needs_addresses = True
    install_hint = "it is part of clusterctl"

    def __init__(self, fallback: MLXLaunchBackend):
        """The same MLX backend as `fallback` (mlx.launch's entry): its name, what bench measures and tunes
        and how a tuned value is stored, its rdma layout; only who starts the ranks differs."""
        self.fallback = fallback
        self.fallbacks = {fallback.launcher_name: fallback}
        self.name, self.benchmarked, self.tune_count = fallback.name, fallback.benchmarked, fallback.tune_count
        self.neighbours_only, self.rdma = fallback.neighbours_only, fallback.rdma
        self.peers_variable, self.smoke_needs = fallback.peers_variable, fallback.smoke_needs

    def launcher_here(self):
        return [sys.executable]

    def launcher_on_host(self, python, mpirun=None):
        return [python]

    def command(self, cluster, plan, *, program, rank_env, where, hostfile=None, cwd=None):
        local_only = all(_runs_where(h, where) for h in cluster.hosts)
        if where.ssh is None and not local_only:
            raise LaunchError(f"starting ranks on other hosts needs an OpenSSH client (ssh) on {where.name}")
        port = free_port_block(cluster.world_size * cluster.launch.connections_per_ip) if local_only \
            else RING_STARTING_PORT
        files = self.rank_files(cluster, port)
        ranks = []
        for rank, host in enumerate(h for h in cluster.hosts for _ in range(h.slots)):
            mlx = self.rank_env(cluster, rank, port)
            env = {**rank_env, **mlx}
            if files:
                env["CLUSTERCTL_ENV_FILES"] = json.dumps(files, separators=(",", ":"))
            # the environment goes on the rank's stdin (the starter writes it first), never its command line
            # the host's own python, a leading ~ its home (quote_path), as the pre-flight found it; MLX_RANK
            # (no secret) also on the command line, where `clusterctl ps` reads a rank's number
            # then the starter's own stdin, the same bytes to every rank (docs/run.md#standard-input)
            wrapped = remote_command(shell_command(
                f"MLX_RANK={rank} {quote_path(host.python)} {shlex.join(program[1:])}"), env=True, stdin=True)
            argv = ["/bin/sh", "-c", wrapped] if _runs_where(host, where) else \
                [where.ssh, *where.ssh_options, "--", host.name, wrapped]
            # "mlx": for the record (and the reader of ranks.json): what MLX reads, the files by their text
            ranks.append({"rank": rank, "host": host.name, "mlx": {**mlx, **files}, "argv": argv,
                          "stdin": env_input(env).decode()})
        spec = os.path.join(where.dir, self.hostfile_name)
        starter = os.path.join(where.dir, "ranks.py")
        files = [(spec, json.dumps({"ranks": ranks}, indent=1) + "\n", 0o600), (starter, script_program("ranks.py"), None)]
        return LauncherCommand([*(where.launcher or [sys.executable]), starter, spec], files)

    def hostfile(self, cluster: Cluster) -> str:
        """The ranks need none; this is the hostfile mlx.launch would read for them (`clusterctl hostfile`)."""
        return self.fallback.hostfile(cluster)

    def rank_files(self, cluster: Cluster, port: int) -> dict[str, str]:
        """The files MLX reads by path, by the variable that names them, with their text, as mlx.launch 0.32
        writes them (launch/mlxenv.py): ring, MLX_HOSTFILE (every rank's `ip:port` list, ports counted up
        from `port`; none for a ring of one); jaccl, MLX_IBV_DEVICES (every rank's RDMA devices). The same
        for every rank: the bootstrap writes them on the rank's host from CLUSTERCTL_ENV_FILES and points
        each variable at its file."""
        try:
            if self.rdma is None:
                text = mlxenv.ring_hostfile_json(cluster, port, cluster.launch.connections_per_ip)
                return {self.peers_variable: text} if text else {}
            return {self.peers_variable: mlxenv.ibv_devices_json(cluster)}
        except ValueError as e:
            raise LaunchError(f"{e} (run clusterctl doctor)") from None

    def rank_env(self, cluster: Cluster, rank: int, port: int) -> dict[str, str]:
        """The variables rank `rank` gets besides the files: MLX_RANK; for jaccl also MLX_JACCL_COORDINATOR
        (rank 0's address and `port`) and, for its ring variant, MLX_JACCL_RING."""
        if self.rdma is None:
            return {"MLX_RANK": str(rank)}
        try:
            env = mlxenv.jaccl_env(cluster, rank, port, "", ring=self.rdma == "ring")
        except ValueError as e:
            raise LaunchError(f"{e} (run clusterctl doctor)") from None
        return {k: v for k, v in env.items() if k != "MLX_IBV_DEVICES"}

    def with_setting(self, cluster, setting):
        return self.fallback.with_setting(cluster, setting)

    def inventory_lines(self, setting, plan):
        return self.fallback.inventory_lines(setting, plan)


def _runs_where(host, where: LaunchSite) -> bool:
    """The rank's host is the machine the starter runs on: started without ssh."""
    return host.local if where.host is None else host.name == where.host


def free_port_block(count: int, low: int = RING_STARTING_PORT, high: int = 60000) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1, searched from a random point between `low`
    and `high` (then from `low`): two jobs started on one machine at the same moment, each checking before its
    ranks bind, do not both land on the first free block."""
    import random
    import socket

    start = random.randrange(low, max(low + 1, high - count))
    for port in (*range(start, high - count), *range(low, start)):
        held = []
        try:
            for p in range(port, port + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise LaunchError(f"no {count} consecutive free ports on 127.0.0.1 above {low}")


# MLX's backends and which of them clusterctl offers: docs/facts/mlx-distributed.md#backends
REGISTRY: dict[str, Backend] = {b.name: b for b in (
    MPIBackend(),
    # ring: TCP between neighbours only (MLX's ring sends to a rank's two neighbours:
    # docs/facts/mlx-distributed.md#ring-sends-to-neighbours-only)
    RankStarterBackend(MLXLaunchBackend("ring", benchmarked=True, tune_count="connections_per_ip",
                                        neighbours_only=True, smoke_needs=("data-plane",))),
    # jaccl: RDMA over Thunderbolt 5 between every pair of ranks (docs/facts/macos.md#jaccl); its `jaccl-ring`
    # variant would be RankStarterBackend(MLXLaunchBackend("jaccl-ring", rdma="ring")). No smoke test:
    # doctor checks each Mac's RDMA devices instead (doctor/checks.py's jaccl)
    RankStarterBackend(MLXLaunchBackend("jaccl", rdma="mesh")),
)}


def names(benchmarked: bool = False) -> list[str]:
    return [n for n, b in REGISTRY.items() if b.benchmarked or not benchmarked]


def get(name: str, launcher: str | None = None) -> Backend:
    """The backend `name`, started by its own launcher or, when `launcher` names another one it offers
    (`--launcher mlx.launch` for ring), by that one."""
    try:
        backend = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r} (one of {', '.join(REGISTRY)})") from None
    if launcher is None or launcher == backend.launcher_name:
        return backend
    fallbacks = backend.fallbacks
    if launcher not in fallbacks:
        offered = ", ".join([backend.launcher_name, *fallbacks])
        raise UsageError(f"--launcher {launcher}: the {name} backend is started by {offered}")
    return fallbacks[launcher]


def launchers() -> list[str]:
    """Every launcher some backend can be started by (the CLI's --launcher choices)."""
    out = []
    for b in REGISTRY.values():
        for name in (b.launcher_name, *b.fallbacks):
            if name not in out:
                out.append(name)
    return out


def for_hostfile(fmt: str, preferred: str) -> Backend:
    """The backend whose launcher reads a `fmt` hostfile: `preferred` (the inventory's) when it does,
    else the first registered one that does. UsageError for a format no backend launches from."""
    variants = [v for b in REGISTRY.values() for v in (b, *b.fallbacks.values())]
    fits = [b for b in variants if b.hostfile_format == fmt]
    if not fits:
        usable = sorted({b.hostfile_format for b in variants if b.hostfile_format})
        raise UsageError(f"no backend launches from a {fmt} hostfile (MLX's mpi backend needs Open MPI): "
                         f"--print-command works with {' or '.join(usable)}")
    return next((b for b in fits if b.name == preferred), fits[0])


def validated(cluster: Cluster) -> Cluster:
    """The cluster, once its `launch.backend` names a registered backend and the inventory gives what that
    backend needs (InventoryError at the line)."""
    if cluster.launch.backend not in REGISTRY:
        raise InventoryError(cluster.path, cluster.launch.backend_line,
                             f"launch.backend must be one of {', '.join(REGISTRY)}, not '{cluster.launch.backend}'")
    REGISTRY[cluster.launch.backend].check(cluster)
    return cluster


def check_rdma(cluster: Cluster, backend: str, ring: bool = False) -> None:
    """What jaccl needs from the inventory beyond the `rdma` lists' own shape (inventory.py checks that): one
    rank per host, an `rdma` list on every host, and a device for every pair of ranks jaccl connects (all
    pairs; a rank's two ring neighbours for jaccl-ring), as mlx.launch's launch_jaccl demands."""
    for host in cluster.hosts:
        if host.slots > 1:
            # Two ranks on one Mac would need an RDMA device between them, and Thunderbolt has no loopback:
            # mlx.launch refuses a null device for any pair jaccl connects.
            raise InventoryError(cluster.path, host.line, f"{host.name} has slots: {host.slots}, but the {backend} "
                                 "backend runs one rank per Mac (two ranks on one Mac would need an RDMA device "
                                 "between them, and Thunderbolt has none): remove `slots`, or use the ring backend")
        if host.rdma is None:
            raise InventoryError(cluster.path, host.line, f"{host.name} has no `rdma:` list, which the {backend} "
                                 f"backend needs: add `rdma: [...]` to it with, per rank, the RDMA device {host.name} "
                                 "reaches that rank through (`ibv_devices` on it lists them), null for itself")
    by_rank = mlxenv.rank_hosts(cluster)
    for i, j in mlxenv.jaccl_pairs(cluster.world_size, ring=ring):
        if by_rank[i].rdma[j] is None:
            host, peer = by_rank[i], by_rank[j]
            raise InventoryError(cluster.path, host.rdma_line, f"rdma of {host.name} has no device for {peer.name} "
                                 f"(entry {j}): the {backend} backend needs one between " +
                                 ("every rank and its ring neighbours" if ring else "every pair of hosts") +
                                 f"; give the RDMA device of the Thunderbolt port cabled to {peer.name}")


def load_cluster(path: str) -> Cluster:
    """Read an inventory the way every command does: parsed, validated, its backend a registered one."""
    return validated(load(path))


def write_files(command: LauncherCommand) -> None:
    """Write a command's files on this machine (atomically, with their modes)."""
    for path, text, mode in command.files:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_text(path, text, mode=mode)


# ---- pure builders ----------------------------------------------------------------------------------

def mca_settings(cluster: Cluster, rsh_agent: str, if_include: str | None) -> dict[str, str]:
    # docs/facts/launchers.md#open-mpi-rsh-agent, docs/facts/launchers.md#btl-tcp-links
    mca = {"plm_rsh_agent": rsh_agent, "btl_tcp_links": str(cluster.mpi.btl_tcp_links)}
    include = cluster.mpi.if_include or if_include
    if include:
        # Only the rank-to-rank traffic: mpirun's own control connections (oob) must still reach the
        # machine mpirun runs on, which need not sit on the data-plane subnet (docs/facts/launchers.md#btl-tcp-if-include).
        mca["btl_tcp_if_include"] = include
    return mca


def _split_user_mca(extra_args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The user's `--mca KEY VALUE` triples, and everything else in extra_args, in order."""
    mca, rest, i = {}, [], 0
    while i < len(extra_args):
        if extra_args[i] in ("--mca", "-mca") and i + 2 < len(extra_args):
            mca[extra_args[i + 1]] = extra_args[i + 2]
            i += 3
        else:
            rest.append(extra_args[i])
            i += 1
    return mca, rest


def mpirun_argv(cluster: Cluster, *, hostfile: str, program: Sequence[str], env: Mapping[str, str],
                rsh_agent: str, if_include: str | None = None, as_root: bool = False,
                mpirun: str = "mpirun", wdir: str | None = None) -> list[str]:
    """The full mpirun command (ours, not `mlx.launch --backend mpi`'s: docs/facts/launchers.md#mlx-launch-mpi-backend):
    hostfile, one rank per slot, our MCA settings merged with the user's, `-x NAME` for every environment
    variable (its value taken from mpirun's own environment, where LauncherCommand.env_values puts it: never
    on a command line; mpirun passes it to the ranks straight, so macOS SIP cannot strip DYLD_* on the way,
    docs/facts/macos.md#sip-strips-dyld), then the program."""
    ours = mca_settings(cluster, rsh_agent, if_include)
    theirs, rest = _split_user_mca(cluster.mpi.extra_args)
    argv = [mpirun]
    if as_root:     # docs/facts/launchers.md#allow-run-as-root
        argv.append("--allow-run-as-root")
    argv += ["--hostfile", hostfile, "-np", str(cluster.world_size)]
    if wdir:
        argv += ["-wdir", wdir]
    for key, value in {**ours, **theirs}.items():
        argv += ["--mca", key, value]
    for key in env:
        argv += ["-x", key]
    return argv + rest + ["--", *program]


def mlx_launch_argv(cluster: Cluster, *, hostfile: str, backend: str, python: str, program: Sequence[str],
                    env: Mapping[str, str], cwd: str | None = None, launcher: Sequence[str] = ("mlx.launch",)) -> list[str]:
    """mlx.launch's command line. It does not put python in front of the program itself (0.32), hence
    --python (docs/facts/launchers.md#mlx-launch-does-not-prepend-python); the JSON hostfile carries the hosts and
    their data-plane addresses (docs/facts/launchers.md#mlx-launch-hostfile-format)."""
    argv = [*launcher, "--hostfile", hostfile, "--backend", backend, "--python", python]
    if backend == "ring" and cluster.launch.connections_per_ip != 1:
        argv += ["--connections-per-ip", str(cluster.launch.connections_per_ip)]
    if cwd:
        argv += ["--cwd", cwd]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    return argv + ["--", *program]


def common_workdir(cluster: Cluster) -> str | None:
    """The directory a launch line run by hand should start ranks in: the hosts' workdir when they share
    one, `~/x` written as `x` (a remote rank starts in its home directory; mpirun and mlx.launch would not
    expand `~`); None when the hosts' workdirs differ or are the home directory itself."""
    dirs = {h.workdir for h in cluster.hosts}
    if len(dirs) != 1:
        return None
    workdir = dirs.pop()
    if workdir in ("~", "~/"):
        return None
    return workdir[2:] if workdir.startswith("~/") else workdir


def ssh_shim(ssh: str, options: Sequence[str]) -> str:
    """An `ssh` for mlx.launch's PATH: mlx.launch runs plain `ssh HOST` (docs/facts/launchers.md#mlx-launch-runs-ssh-tt),
    so the inventory's options (ssh_config, BatchMode, ConnectTimeout, host key policy) reach it only through a
    wrapper (docs/facts/ssh.md#inventory-reaches-openssh-only-through-ssh-config)."""
    return "#!/bin/sh\nexec " + shlex.join([ssh, *options]) + ' "$@"\n'


def find_mlx_launch() -> list[str] | None:
    beside = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    if os.access(beside, os.X_OK):
        return [beside]
    found = shutil.which("mlx.launch")
    return [found] if found else None
