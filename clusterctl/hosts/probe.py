"""The one script doctor (and run's pre-flight) runs on each host, scripts/probe.sh, and the pure parser of
what it prints.

It is POSIX sh (python may be the very thing that is broken) and runs through the same non-interactive SSH
session a launcher would use, so PATH and friends are what mpirun will see (docs/facts/ssh.md#non-interactive-path).
It prints one JSON object per line; anything else on stdout (a chatty ~/.bashrc) is ignored by the parser.
In one round trip it:
  - starts `ssh` to every peer in the background, with the options mpirun will use (the all-to-all check,
    docs/facts/ssh.md#all-to-all-ssh), and likewise the slow facts (python + mlx import, mpirun --version),
  - gathers facts: OS, tools on PATH, python + mlx + mpi4py versions, mpirun, libmpi, disk, clock, interfaces.
A second, short round trip runs the TCP data-plane probe (scripts/dataplane.py: listen on this host's ring port,
connect to every peer's) on all reachable hosts at once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..inventory import Host
from . import hostscript
from .hostscript import HostPath
from .openssh import HOST_CONFIG
from .scripts import script_text

MESH_MARKER = "clusterctl-mesh-ok"
MESH_AT_ONCE = 4      # logins to peers one host's probe has under way at a time (probe.sh says why)

@dataclass(frozen=True)
class DataplaneSpec:
    me: str
    address: str
    port: int
    budget_s: float
    peers: tuple[tuple[str, str, int], ...]   # (name, address, port)


# Where Homebrew and MacPorts put mpirun: not on sshd's PATH on a Mac (docs/facts/launchers.md#mpirun-absolute-path)
MPIRUN_DIRS = ("/opt/homebrew/bin", "/usr/local/bin", "/opt/local/bin")


def find_mpirun_sh() -> str:
    """POSIX sh setting $m to mpirun's path: on the session's PATH, else in MPIRUN_DIRS; empty if neither."""
    dirs = " ".join(MPIRUN_DIRS)
    return (f'm=$(command -v mpirun 2>/dev/null); if [ -z "$m" ]; then for d in {dirs}; do '
            'if [ -x "$d/mpirun" ]; then m=$d/mpirun; break; fi; done; fi')


def probe_script(*, python: str, workdir: str, mpi_lib_dir: str | None, peers: list[str],
                 mesh_config: str | None, ssh_config: str | None, mpi_libname: str | None = None,
                 full: bool = True, rdma: bool = False) -> str:
    """The probe for one host: scripts/probe.sh after its values. Every value from the inventory is
    quoted; python and paths keep `~`. `mesh_config` is the host's rendering of the inventory for OpenSSH
    (openssh.host_config_text): the probe installs it as <workdir>/.clusterctl/ssh_config unless it is there
    already, and logs in to every peer with it, as mpirun started on that host would. full=False skips what
    only doctor needs (importing mlx, mpirun --version): a launch's pre-flight. rdma=True also asks a Mac
    what jaccl needs (rdma_ctl status, ibv_devices: docs/facts/macos.md#jaccl)."""
    values = {
        "PY": HostPath(python), "WD": HostPath(workdir), "LIBDIR": HostPath(mpi_lib_dir or ""),
        "LIBNAME": HostPath(mpi_libname or ""), "SSH_CONFIG": ssh_config or "", "FULL": "yes" if full else "no",
        "RDMA": "yes" if rdma else "no", "MARKER": MESH_MARKER, "MESH_AT_ONCE": str(MESH_AT_ONCE),
        "PYTHON_INFO": script_text("python_info.py"), "MESH_CONFIG_TEXT": (mesh_config or "").rstrip("\n"),
        "MESH_CONFIG": HostPath(f"{workdir.rstrip('/') or '/'}/{HOST_CONFIG}"),
    }
    return hostscript.shell("probe.sh", values, peers, functions=f"find_mpirun() {{ {find_mpirun_sh()}; }}")


def dataplane_command(python: str, spec: DataplaneSpec) -> str:
    """The second, short phase: run on every reachable host at once, over connections already open, so
    every listener is up within moments of the others."""
    arg = json.dumps([spec.me, spec.address, spec.port, spec.budget_s, [list(p) for p in spec.peers]])
    return hostscript.command(python, "dataplane.py", arg)


@dataclass
class Facts:
    """What a host's probe printed, parsed."""

    values: dict[str, list[str]] = field(default_factory=dict)
    mesh: dict[str, tuple[int, str]] = field(default_factory=dict)     # peer -> (ssh exit code, output)
    dataplane: dict | None = None
    complete: bool = False          # the probe ran to its last line

    def get(self, key: str, default: str = "") -> str:
        v = self.values.get(key)
        return v[0] if v else default

    def all(self, key: str) -> list[str]:
        return self.values.get(key, [])

    @property
    def python_info(self) -> dict:
        """The python probe's JSON, or {"error": what it printed instead}."""
        text = self.get("python_info")
        if not text:
            return {}
        start = text.rfind("{")
        try:
            value = json.loads(text[start:]) if start >= 0 else {"error": text}
        except (ValueError, RecursionError):
            return {"error": text}
        return value if isinstance(value, dict) else {"error": text}


def parse_probe(stdout: str) -> Facts:
    facts = Facts()
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):     # a host's garbage is no fact, never a crash of ours
            continue
        key = obj.get("key") if isinstance(obj, dict) else None
        if key == "mesh":
            rc = obj.get("rc", 255)
            rc = rc if isinstance(rc, int) and not isinstance(rc, bool) else 255
            facts.mesh[str(obj.get("peer"))] = (rc, str(obj.get("value", "")))
        elif key == "dataplane":
            facts.dataplane = obj
        elif key == "done":
            facts.complete = True
        elif isinstance(key, str):
            facts.values.setdefault(key, []).append(str(obj.get("value", "")))
    return facts


@dataclass
class HostProbe:
    """One host's probe: reached or not, and what it printed."""

    host: Host
    facts: Facts | None = None
    error: str | None = None          # why the controller could not run the probe
    error_reason: str | None = None   # ConnectError.reason when it could not connect
    overran_s: float | None = None    # the probe ran past this budget and was stopped; facts are partial
    connect_ms: float | None = None
    sent_at: float = 0.0              # controller's wall clock around the probe, for clock skew
    received_at: float = 0.0
