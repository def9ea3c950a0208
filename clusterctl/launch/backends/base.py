"""What every registry entry is (the registry: launch/backends/__init__.py): a Backend, one subclass per
launcher family (backends/mpi.py, mlxlaunch.py, rankstarter.py), holding the BackendSpec of the MLX backend
it starts; the LauncherCommand its `command` returns; and what the inventory must give a backend with RDMA
(check_rdma).

A BackendSpec is what an entry is whoever starts its ranks: MLX's backend (its name, how its ranks connect)
and what doctor and bench do with it, as frozen records (SmokeTest, Tuning). One per MLX backend: the entry
that starts it with its own launcher and the entries of its other launchers (its fallbacks) hold the same one.

    spec = BackendSpec("ring", benchmarked=True, neighbours_only=True, smoke=SmokeTest(("data-plane",)),
                       tuning=Tuning("connections_per_ip", "launch"))
    backend.smoke.fix(libmpi_hint)                            # doctor's advice when a rank's MLX init failed
    backend.tuning.applied(cluster, {"connections_per_ip": 4})   # a `bench --tune` candidate
    backend.tuning.inventory_lines(setting, plan)             # how the winner is stored: (section, key, YAML value)

    backend.launcher_here()                     # the launcher's argv prefix here, or None
    command = backend.command(cluster, plan, program=[...], rank_env={...}, where=site)
    write_files(command)                        # its hostfile, shim, spec: then run command.argv with command.env()
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from ...atomic import write_text
from ...errors import InventoryError
from ...inventory import Cluster
from .. import mlxenv
from ..hostfile import render as render_hostfile

if TYPE_CHECKING:
    from ..plan import LaunchPlan
    from ..site import LaunchSite


# ---- what an entry starts: MLX's backend, and two records for doctor and bench ---------------------------

@dataclass(frozen=True)
class SmokeTest:
    """doctor's smoke test of a backend (doctor/smoke.py launches it with the backend's own command)."""

    needs: tuple[str, ...]            # doctor's checks that must pass before it runs (besides ssh, python, mlx)
    # what to do when a rank's MLX init failed in it; `{libmpi}` is where " (doctor found PATH)" goes
    init_fix: str = "check the data-plane addresses and that the ring ports are free"

    def fix(self, libmpi_hint: str | None) -> str:
        """The advice for a failed init, naming the libmpi doctor found (`libmpi_hint`) where it has a place."""
        return self.init_fix.replace("{libmpi}", f" (doctor found {libmpi_hint})" if libmpi_hint else "")


@dataclass(frozen=True)
class Tuning:
    """What `bench --tune` varies on a backend (bench/tune.py) and where the inventory keeps what it chose."""

    count: str                        # the count it tries (1, 2, 4, 8): a key of the inventory's `section`
    section: str                      # the inventory section holding it ("mpi" or "launch")
    subnets: bool = False             # it also tries every subnet the hosts share, kept as mpi.if_include

    def applied(self, cluster: Cluster, setting: Mapping[str, object]) -> Cluster:
        """`cluster` with a candidate setting ({count: N}, and "if_include" when it tries subnets)."""
        cluster = _replaced(cluster, self.section, **{self.count: setting[self.count]})
        return _replaced(cluster, "mpi", if_include=setting["if_include"]) if self.subnets else cluster

    def conflict(self, cluster: Cluster) -> str | None:
        """Why `bench --tune` cannot vary the count in this inventory, if it cannot: a count of the `mpi`
        section is an MCA parameter, and an `--mca` of the same key in mpi.extra_args overrides ours
        (backends/mpi.py's mpirun_argv)."""
        if self.section == "mpi" and self.count in cluster.mpi.extra_args:
            return (f"mpi.extra_args sets --mca {self.count} itself, which overrides mpi.{self.count}: remove it "
                    "there so --tune can try and store values")
        return None

    def inventory_lines(self, setting: Mapping[str, object], plan: LaunchPlan) -> list[tuple[str, str, str]]:
        """(section, key, YAML value) that store a chosen setting in the inventory; a subnet `plan` already
        uses without the inventory saying so is not written."""
        lines = [(self.section, self.count, str(setting[self.count]))]
        if self.subnets and setting.get("if_include") and setting["if_include"] != plan.if_include:
            lines.append(("mpi", "if_include", json.dumps(setting["if_include"])))
        return lines


def _replaced(cluster: Cluster, section: str, **values) -> Cluster:
    return dataclasses.replace(cluster, **{section: dataclasses.replace(getattr(cluster, section), **values)})


@dataclass(frozen=True)
class BackendSpec:
    """One MLX backend, as every launcher that can start it sees it."""

    name: str                         # MLX's backend name (`mx.distributed.init(backend=name)`)
    benchmarked: bool = False         # `clusterctl bench` measures it
    neighbours_only: bool = False     # ranks exchange data only with their ring neighbours (bench --p2p)
    rdma: str | None = None           # jaccl: which rank pairs need an RDMA device, "mesh" (all) or "ring" (neighbours)
    smoke: SmokeTest | None = None    # doctor's smoke test; None: it has none
    tuning: Tuning | None = None      # what `bench --tune` varies; None: nothing


# ---- the launcher's side -----------------------------------------------------------------------------

@dataclass
class LauncherCommand:
    argv: list[str]
    files: list[tuple[str, str, int | None]] = field(default_factory=list)   # (path, text, mode) to write first
    path_prepend: str | None = None   # a directory to put first on the launcher's PATH (mlx.launch's ssh shim)
    # what the launcher must find in its own environment (mpirun's `-x NAME` passes NAME's value from there):
    # given to it on its stdin (hosts/remote.py), never on a command line
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


def write_files(command: LauncherCommand) -> None:
    """Write a command's files on this machine (atomically, with their modes)."""
    for path, text, mode in command.files:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_text(path, text, mode=mode)


class _FromSpec:
    """A Backend attribute that is the field of the same name of its spec (read-only, like the spec)."""

    def __set_name__(self, owner, name: str) -> None:
        self.field = name

    def __get__(self, backend, owner=None):
        return self if backend is None else getattr(backend.spec, self.field)

    def __set__(self, backend, value) -> None:
        raise AttributeError(f"{self.field} is the backend's spec's (BackendSpec): make the entry with another spec")


class Backend:
    """One way of starting ranks: the MLX backend it starts (`spec`, shared with the entries of its other
    launchers) and, in each subclass, the launcher family that starts them."""

    spec: BackendSpec
    fallbacks: Mapping[str, "Backend"] = {}   # other launchers that can start it, by launcher name
    # the launcher family's
    launcher_name: str                # "mpirun", "mlx.launch", "clusterctl" (run's --launcher)
    hostfile_format: str | None       # hostfile.FORMATS key; None: its launcher reads none of those
    hostfile_name: str                # its file name in a run directory
    install_hint: str                 # how to install the launcher on this machine
    mpi4py_reference = False          # bench can time raw mpi4py beside MLX on it (mpi4py runs under mpirun)
    needs_mpi = False                 # every host needs Open MPI (mpirun, libmpi) for it
    needs_addresses = False           # every host needs its data-plane `address` for it
    env_on_command_line = False       # its launcher takes the ranks' env values as arguments (`ps` shows them)
    stdin_to_rank0_only = False       # its launcher gives its stdin to rank 0 alone: run relays it (launch/stdinrelay.py)
    exit_is_every_ranks = False       # its launcher exits 0 only when every rank exited 0 (launch/ranklines.py)

    # what the MLX backend is whichever launcher starts it: its spec's fields, read through
    name: str = _FromSpec()
    benchmarked: bool = _FromSpec()
    neighbours_only: bool = _FromSpec()
    rdma: str | None = _FromSpec()
    smoke: SmokeTest | None = _FromSpec()
    tuning: Tuning | None = _FromSpec()

    @property
    def peers_variable(self) -> str | None:
        """The variable naming a rank's peers to MLX (the world check's hint); None: the launcher tells them."""
        return None

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
        if self.smoke is None:
            return False
        if not self.needs_addresses:
            return True
        if len(cluster.hosts) == 1 and cluster.hosts[0].local:
            return cluster.world_size > 1
        return len(cluster.hosts) > 1 and all(h.address for h in cluster.hosts)


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
