"""The one script doctor runs on each host, and the pure parser of what it prints.

It is POSIX sh (python may be the very thing that is broken) and runs through the same non-interactive SSH
session a launcher would use, so PATH and friends are what mpirun will see. It prints one JSON object per
line; anything else on stdout (a chatty ~/.bashrc) is ignored by the parser. In one round trip it:
  - starts `ssh` to every peer in the background, with the options mpirun will use (the all-to-all check),
    and likewise the slow facts (python + mlx import, mpirun --version),
  - gathers facts: OS, tools on PATH, python + mlx + mpi4py versions, mpirun, libmpi, disk, clock, interfaces.
A second, short round trip runs the TCP data-plane probe (DATAPLANE: listen on this host's ring port,
connect to every peer's) on all reachable hosts at once.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from ..inventory import Host
from .transport import quote_path

MESH_MARKER = "clusterctl-mesh-ok"

# Where libmpi usually lives, after the inventory's mpi_lib_dir and <mpirun's prefix>/lib.
LIBMPI_DIRS = ("/opt/homebrew/lib", "/opt/homebrew/opt/open-mpi/lib", "/usr/local/lib",
               "${CONDA_PREFIX:-/nonexistent}/lib", "/usr/lib/x86_64-linux-gnu/openmpi/lib",
               "/usr/lib/aarch64-linux-gnu/openmpi/lib", "/usr/lib64/openmpi/lib", "/usr/lib/x86_64-linux-gnu",
               "/usr/lib/aarch64-linux-gnu", "/usr/lib64")
LIBMPI_NAMES = ("libmpi.dylib", "libmpi.40.dylib", "libmpi.so", "libmpi.so.40", "libmpi.so.12")

PYTHON_INFO = r"""
import json, platform, sys
d = {"python": platform.python_version(), "executable": sys.executable, "prefix": sys.prefix}
try:
    import mlx.core as mx
    d["mlx"] = mx.__version__
    d["distributed"] = bool(mx.distributed.is_available())
except Exception as e:
    d["mlx_error"] = type(e).__name__ + ": " + str(e)
try:
    import mpi4py
    d["mpi4py"] = mpi4py.__version__
except Exception as e:
    d["mpi4py_error"] = type(e).__name__ + ": " + str(e)
print(json.dumps(d))
"""

# Listen on this host's data-plane address and ring port; connect to every peer's; report what worked.
# The connecting side closes first, so TIME_WAIT never holds the ring port that MLX will listen on next.
DATAPLANE = r"""
import json, socket, sys, threading, time
me, addr, port, budget, peers = json.loads(sys.argv[1])
deadline = time.monotonic() + budget
out = {"key": "dataplane", "address": addr, "port": port, "bind": None, "connect": {}, "accepted": []}
srv = None
try:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(64)
    srv.settimeout(0.1)
except OSError as e:
    out["bind"] = str(e)
    srv = None

def accept():
    while srv is not None and time.monotonic() < deadline and len(out["accepted"]) < len(peers):
        try:
            c, _ = srv.accept()
        except OSError:
            continue
        c.settimeout(2)
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = c.recv(256)
                if not chunk:
                    break
                data += chunk
            c.recv(1)
        except OSError:
            pass
        c.close()
        out["accepted"].append(data.decode(errors="replace").strip())

def connect(name, paddr, pport):
    last, t0 = "no attempt", time.monotonic()
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((paddr, pport), timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            s.sendall((me + "\n").encode())
            s.close()
            out["connect"][name] = {"ok": True, "ms": round((time.monotonic() - t0) * 1000, 1)}
            return
        except OSError as e:
            last = str(e)
            time.sleep(0.05)
    out["connect"][name] = {"ok": False, "error": last}

threads = [threading.Thread(target=accept)] + [threading.Thread(target=connect, args=tuple(p)) for p in peers]
for t in threads:
    t.start()
for t in threads:
    t.join()
if srv is not None:
    srv.close()
print(json.dumps(out))
"""

_SCRIPT = r"""PY={python}
WD={workdir}
LIBDIR={mpi_lib_dir}
T=$(mktemp -d 2>/dev/null || mktemp -d -t clusterctl)
trap 'rm -rf "$T"' EXIT
esc() {{ case "$1" in
  *[\"\\]*|*[[:cntrl:]]*) printf '%s' "$1" | tr '\n\t\r' '   ' | tr -d '\000-\037' | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g';;
  *) printf '%s' "$1";;
esac; }}
j() {{ printf '{{"key":"%s","value":"%s"}}\n' "$1" "$(esc "$2")"; }}
j time "$(date +%s)"
i=0
for peer in {peers}; do
  ( o=$(ssh {ssh_options} -- "$peer" echo {marker} 2>&1 </dev/null); rc=$?
    printf '{{"key":"mesh","peer":"%s","rc":%d,"value":"%s"}}\n' "$(esc "$peer")" "$rc" "$(esc "$o")" >"$T/mesh.$i" ) &
  i=$((i+1))
done
j os "$(uname -s)"
j arch "$(uname -m)"
j release "$(uname -r)"
j path "$PATH"
p=$(command -v "$PY" 2>/dev/null)
j python_path "$p"
if [ -n "$p" ] && [ {full} = yes ]; then ( j python_info "$("$PY" -c {python_info} 2>&1 </dev/null)" >"$T/python" ) & fi
m=$(command -v mpirun 2>/dev/null)
j mpirun "$m"
mdir=
if [ -n "$m" ]; then
  mr=$(readlink -f "$m" 2>/dev/null || printf '%s' "$m")
  j mpirun_real "$mr"
  if [ {full} = yes ]; then ( j mpirun_version "$(mpirun --version 2>&1 </dev/null | head -n 3)" >"$T/mpirun" ) & fi
  mdir=$(dirname "$(dirname "$mr")")/lib
fi
r=$(command -v rsync 2>/dev/null)
j rsync "$r"
if [ -n "$r" ]; then j rsync_version "$(rsync --version 2>&1 | head -n 1)"; fi
for d in "$LIBDIR" "$mdir" {libmpi_dirs}; do
  [ -n "$d" ] || continue
  for n in {libmpi_names}; do
    if [ -e "$d/$n" ]; then j libmpi "$d/$n"; fi
  done
done
if [ -n {mpi_libname} ]; then
  if [ -e {mpi_libname} ]; then j libname_exists yes; else j libname_exists no; fi
fi
d=$WD
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
j disk "$(df -Pk "$d" 2>/dev/null | tail -n 1)"
(ip -o -4 addr show 2>/dev/null || ifconfig -a 2>/dev/null) | while IFS= read -r line; do j iface "$line"; done
if [ "$(uname -s)" = Darwin ]; then j sip "$(csrutil status 2>&1)"; fi
{ssh_config_check}
wait
cat "$T"/python "$T"/mpirun "$T"/mesh.* 2>/dev/null
j done 1
"""


@dataclass(frozen=True)
class DataplaneSpec:
    me: str
    address: str
    port: int
    budget_s: float
    peers: tuple[tuple[str, str, int], ...]   # (name, address, port)


def probe_script(*, python: str, workdir: str, mpi_lib_dir: str | None, peers: list[str],
                 ssh_options: list[str], ssh_config: str | None, mpi_libname: str | None = None,
                 full: bool = True) -> str:
    """The probe for one host. Every value from the inventory is quoted; python and paths keep `~`.
    full=False skips what only doctor needs (importing mlx, mpirun --version): a launch's pre-flight."""
    cfg = ""
    if ssh_config:
        cfg = f'if [ -r {shlex.quote(ssh_config)} ]; then j ssh_config yes; else j ssh_config no; fi'
    return _SCRIPT.format(
        python=quote_path(python), workdir=quote_path(workdir),
        mpi_lib_dir=quote_path(mpi_lib_dir) if mpi_lib_dir else "''",
        peers=" ".join(shlex.quote(p) for p in peers) if peers else "''",
        ssh_options=" ".join(shlex.quote(o) for o in ssh_options), marker=MESH_MARKER,
        python_info=shlex.quote(PYTHON_INFO),
        libmpi_dirs=" ".join(d if d.startswith("${") else shlex.quote(d) for d in LIBMPI_DIRS),
        libmpi_names=" ".join(LIBMPI_NAMES), ssh_config_check=cfg,
        mpi_libname=quote_path(mpi_libname) if mpi_libname else "''", full="yes" if full else "no",
    ).replace('for peer in \'\'; do', 'for peer in; do')


def dataplane_command(python: str, spec: DataplaneSpec) -> str:
    """The second, short phase: run on every reachable host at once, over connections already open, so
    every listener is up within moments of the others."""
    arg = json.dumps([spec.me, spec.address, spec.port, spec.budget_s, [list(p) for p in spec.peers]])
    return f"{quote_path(python)} -c {shlex.quote(DATAPLANE)} {shlex.quote(arg)}"


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
            return json.loads(text[start:]) if start >= 0 else {"error": text}
        except ValueError:
            return {"error": text}


def parse_probe(stdout: str) -> Facts:
    facts = Facts()
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        key = obj.get("key") if isinstance(obj, dict) else None
        if key == "mesh":
            facts.mesh[str(obj.get("peer"))] = (int(obj.get("rc", 255)), str(obj.get("value", "")))
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
    connect_ms: float | None = None
    sent_at: float = 0.0              # controller's wall clock around the probe, for clock skew
    received_at: float = 0.0
