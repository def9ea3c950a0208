"""`clusterctl setup python`: every host gets the environment this machine has, in a virtual environment of its own.

    result = setup_python(connector, requirements=None, dry_run=False, progress=print)

On every host at once (hosts/scripts/pyenv.sh): a Python of this machine's minor version is found (the
inventory's `python:` first, then the usual places; none: the host is named with what to install), a virtual
environment is made in <workdir>/.clusterctl/venv (which `sync` never copies over nor deletes: .clusterctl/
is excluded), and what the project needs is installed there with uv when the host has it, else pip: MLX, numpy
and PyYAML at this machine's versions (MLX with its `cpu` extra on a Linux host), or `--requirements FILE`'s
lines with MLX pinned beside them. A host whose venv already holds exactly that (a digest kept in the venv) is
left alone, so a second run is quick. Then the inventory's `python:` is set to the venv's python and doctor's
python / mlx / parity checks run.

With `offline`, the hosts never reach an index: this machine downloads the wheels for each kind of host
(`pip download` for its platform tags: wheel_platforms), sends them into <workdir>/.clusterctl/wheels/<kind>
(sync: only what is missing there), and each host installs from that folder alone (--no-index).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from ..doctor.options import LM_PACKAGE, version_here
from ..errors import ConnectError, UsageError
from ..hosts.connector import Connector
from ..hosts.fanout import run_all
from ..hosts import hostscript
from ..hosts.hostscript import HostPath
from ..inventory import Cluster, Host
from ..inventory_edit import write_setting
from . import exit_code, script_error

VENV = ".clusterctl/venv"
WHEELS = ".clusterctl/wheels"     # --offline: the wheels sent, per kind of host, relative to the workdir
TIMEOUT_S = 900.0                 # creating a venv and installing MLX over a slow link
DEFAULT_PACKAGES = ("mlx", "numpy", "PyYAML")   # what the bundled trainer imports on a host


@dataclass
class HostPython:
    host: str
    python: str | None = None         # the venv's python there
    changes: list[str] = field(default_factory=list)
    error: str | None = None
    unreachable: bool = False
    seconds: float = 0.0


@dataclass
class PythonResult:
    want: str
    requirements: list[str]
    hosts: list[HostPython]
    inventory_change: str | None = None
    checks_failed: list[str] = field(default_factory=list)    # doctor's python / mlx / mlx-lm / parity lines that failed
    checks_passed: int = 0
    checks_run: list[str] = field(default_factory=list)       # those of CHECKS doctor ran (mlx-lm: when here)

    @property
    def ok(self) -> bool:
        return not any(h.error for h in self.hosts) and not self.checks_failed

    @property
    def exit_code(self) -> int:
        return exit_code(self.ok, self.hosts)

    def as_dict(self, dry_run: bool) -> dict:
        return {"ok": self.ok, "dry_run": dry_run, "python": self.want, "requirements": self.requirements,
                "hosts": [{"host": h.host, "python": h.python, "changes": h.changes, "error": h.error,
                           "seconds": round(h.seconds, 1)} for h in self.hosts],
                "inventory": self.inventory_change, "checks_failed": self.checks_failed}

    def report(self, dry_run: bool) -> tuple[list[str], list[str]]:
        out, err = [], []
        for h in self.hosts:
            if h.error:
                err.append(f"{h.host}: failed: {h.error}")
            out += [f"{h.host}: {c}" for c in h.changes]
            if not h.error and not h.changes and not dry_run:
                out.append(f"{h.host}: nothing to change ({h.python})")
        if self.inventory_change:
            out.append(self.inventory_change)
        err += [f"doctor: {line}" for line in self.checks_failed]
        if self.checks_run and not any(h.error for h in self.hosts):
            out.append(f"doctor's {', '.join(self.checks_run[:-1])} and {self.checks_run[-1]} checks: "
                       f"{self.checks_passed} passed"
                       + (f", {len(self.checks_failed)} failed" if self.checks_failed else ""))
        return out, err


def this_python() -> str:
    return "%d.%d" % sys.version_info[:2]


_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)")


def _name(line: str) -> tuple[str, str, str]:
    """(normalised project name, extras, the rest: version specifiers, a URL, markers) of a requirement line."""
    m = _REQUIREMENT.fullmatch(line)
    if m is None:
        return "", "", line
    return re.sub(r"[-_.]+", "-", m.group(1)).lower(), m.group(2) or "", m.group(3)


def check_extras(with_lm: bool) -> None:
    """`--with lm` asks for this machine's mlx-lm on every host: this machine must have one (UsageError)."""
    if with_lm and version_here(LM_PACKAGE) is None:
        raise UsageError(f"--with lm: this machine has no {LM_PACKAGE}, so there is no version to give every host: "
                         "install it here first (pip install mlx-lm), then run setup python again")


# `--with supervisor`: what clusterctl itself needs to run on a host as a detached run's supervisor (pyproject.toml's
# dependencies that its `run` imports; detach/supervisor.py NEEDS), at this machine's versions
SUPERVISOR_PACKAGES = ("click", "paramiko", "PyYAML", "rich")


def with_supervisor(reqs: list[str]) -> list[str]:
    """reqs and clusterctl's own requirements at this machine's versions, those reqs does not name already."""
    names = {_name(line)[0].lower() for line in reqs}
    return [*reqs, *(f"{n}=={version_here(n)}" if version_here(n) else n
                     for n in SUPERVISOR_PACKAGES if n.lower() not in names)]


def requirements(host_os: str, path: str | None = None) -> list[str]:
    """What a host's venv gets (pure but for reading this machine's installed versions and `path`): MLX at
    this machine's version (its `cpu` extra on Linux: the plain wheel has no backend there), then either the
    lines of `path` or numpy and PyYAML at this machine's versions; and mlx-lm at this machine's version
    whenever this machine has it (fine-tuning and serve need one version on every rank). A `path` that names
    MLX keeps its own line; one that names mlx-lm without a version gets this machine's (a version it gives
    is kept: the user's choice, which doctor's parity check then holds to one version)."""
    def pinned(name: str) -> str:
        version = version_here(name)
        return f"{name}=={version}" if version else name

    lm = version_here(LM_PACKAGE)
    mlx = pinned("mlx")
    if host_os == "Linux":
        mlx = mlx.replace("mlx", "mlx[cpu]", 1)
    if path is None:
        return [mlx, *(pinned(n) for n in DEFAULT_PACKAGES[1:]), *([f"{LM_PACKAGE}=={lm}"] if lm else [])]
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
    except OSError as e:
        raise UsageError(f"--requirements {path}: {e.strerror}") from None
    lines = [line for line in lines if line]
    names = [_name(line)[0] for line in lines]
    if lm:
        lines = [f"{LM_PACKAGE}{extras}=={lm}{rest}" if name == LM_PACKAGE and (not rest or rest.startswith(";"))
                 else line for line, (name, extras, rest) in zip(lines, map(_name, lines))]
        if LM_PACKAGE not in names:
            lines.append(f"{LM_PACKAGE}=={lm}")
    return lines if "mlx" in names else [mlx, *lines]


def script(host: Host, want: str, reqs: list[str], dry_run: bool, check: bool = False,
           wheels: str | None = None) -> str:
    """pyenv.sh for `host`; `check`: only say whether the venv already holds `reqs`; `wheels`: install from
    that folder (relative to the workdir) alone."""
    text = "\n".join(reqs)
    digest = hashlib.sha256(f"{want}\n{text}".encode()).hexdigest()[:16]
    values = {"WD": HostPath(host.workdir), "WANT": want, "PYTHON": HostPath(host.python), "REQS": text,
              "DIGEST": digest, "DRY": "yes" if dry_run else "no", "CHECK": "yes" if check else "no",
              "WHEELS": wheels or ""}
    return hostscript.shell("pyenv.sh", values)


PLATFORM_FACTS = "uname -s; uname -m; sw_vers -productVersion 2>/dev/null || getconf GNU_LIBC_VERSION 2>/dev/null"


def platform_key(facts: str) -> tuple[str, str, str]:
    """(os, machine, release) from PLATFORM_FACTS's output: ("Darwin", "arm64", "15.6.1"),
    ("Linux", "x86_64", "2.36") (pure)."""
    words = (facts.split("\n") + ["", "", ""])[:3]
    os_name, machine, release = (w.strip() for w in words)
    return os_name, machine, release.removeprefix("glibc ").strip()


def wheel_platforms(os_name: str, machine: str, release: str) -> list[str]:
    """The wheel platform tags a host takes, newest first, for `pip download --platform` (pure): on a Mac
    macosx_<N>_0_<arch> (and universal2) from its own macOS major version down (wheels name the oldest
    macOS they run on); on Linux manylinux_2_<N>_<arch> from its glibc down to manylinux2014's 2.17."""
    if os_name == "Darwin":
        major = int(release.split(".")[0]) if release.split(".")[0].isdigit() else 11
        tags = [f"macosx_{v}_0_{a}" for v in range(max(major, 11), 10, -1) for a in (machine, "universal2")]
        if machine == "x86_64":
            tags += [f"macosx_10_{m}_{a}" for m in range(15, 8, -1) for a in ("x86_64", "intel", "universal2")]
        return tags
    if os_name == "Linux":
        parts = release.split(".")
        minor = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 17
        return [f"manylinux_2_{m}_{machine}" for m in range(max(minor, 17), 16, -1)] + [f"manylinux2014_{machine}"]
    raise UsageError(f"--offline: no wheels are known for {os_name or 'an unknown system'} {machine}")


def download_wheels(reqs: list[str], want: str, platforms: list[str], dest: str) -> None:
    """pip download, on this machine, of `reqs` and what they need, as wheels for `platforms` and Python `want`,
    into `dest` (what is there already is not fetched again)."""
    import subprocess
    import tempfile

    os.makedirs(dest, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(reqs) + "\n")
    try:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--dest", dest,
                "--only-binary=:all:", "--implementation", "cp", "--python-version", want,
                *(x for p in platforms for x in ("--platform", p)), "-r", f.name]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        last = [line for line in r.stderr.splitlines() if line.strip()][-1:] or ["no message"]
        raise UsageError(f"--offline: pip download for {platforms[0]} failed here: {last[0]}")


def setup_python(connector: Connector, requirements_file: str | None = None, dry_run: bool = False,
                 progress: Callable[[HostPython], None] = lambda h: None, check: bool = True,
                 offline: bool = False, with_lm: bool = False, supervisor: bool = False) -> PythonResult:
    check_extras(with_lm)
    cluster = connector.cluster
    want = this_python()
    seen_reqs: dict[str, list[str]] = {}
    wheels = _send_wheels(connector, want, requirements_file, supervisor) if offline and not dry_run else {}

    def one(host: Host) -> HostPython:
        began = time.monotonic()
        with connector.transport(host) as t:
            host_os = t.run("uname -s", 30).stdout.strip()
            reqs = seen_reqs.setdefault(host_os, (with_supervisor if supervisor else list)(
                requirements(host_os, requirements_file)))
            r = t.run(script(host, want, reqs, dry_run, wheels=wheels.get(host.name)), TIMEOUT_S)
        lines = r.stdout.splitlines()
        done = HostPython(host.name, seconds=time.monotonic() - began)
        done.changes = [line.split(" ", 1)[1] if line.startswith("change ") else line
                        for line in lines if line.startswith(("change ", "would "))]
        done.python = next((line[7:] for line in lines if line.startswith("python ")), None)
        done.error = script_error(r)
        progress(done)
        return done

    group = run_all(list(cluster.hosts), one, connector.deadline(TIMEOUT_S + 30))
    hosts = []
    for name, outcome in group.items():
        if outcome.error is None:
            hosts.append(outcome.value)
        else:
            failed = HostPython(name, error=str(outcome.error).removeprefix(f"{name}: "),
                                unreachable=isinstance(outcome.error, ConnectError))
            progress(failed)
            hosts.append(failed)
    reqs = sorted({line for r in seen_reqs.values() for line in r})
    result = PythonResult(want, reqs, hosts)
    if any(h.error for h in hosts):
        return result
    result.inventory_change = _set_python(cluster, dry_run)
    if check and not dry_run:
        result.checks_passed, result.checks_failed, result.checks_run = python_checks(connector)
    return result


def _send_wheels(connector: Connector, want: str, requirements_file: str | None,
                 supervisor: bool = False) -> dict[str, str]:
    """For the hosts whose venv does not hold what is asked yet: the wheels of each kind of host, downloaded
    here and sent to <workdir>/.clusterctl/wheels/<kind> there; host -> that folder (relative to the workdir)."""
    from dataclasses import replace

    from ..transfer.sync import SyncOptions, plan_sync, sync_tree

    cluster = connector.cluster

    def ask(host: Host):
        with connector.transport(host) as t:
            key = platform_key(t.run(PLATFORM_FACTS, 30).stdout)
            reqs = (with_supervisor if supervisor else list)(requirements(key[0], requirements_file))
            needed = t.run(script(host, want, reqs, False, check=True), 60).stdout.splitlines()
        return key, reqs, not any(line.startswith("python ") for line in needed)

    group = run_all(list(cluster.hosts), ask, connector.deadline(60))
    kinds: dict[tuple[str, str, str], list[str]] = {}
    for name, outcome in group.ok.items():        # a host that failed here fails (named) in the setup itself
        key, reqs, needed = outcome.value
        if needed:
            kinds.setdefault(key, []).append(name)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    where: dict[str, str] = {}
    for key, names in kinds.items():
        kind = "-".join(key)
        local = os.path.join(root, "clusterctl", "wheels", want, kind)
        download_wheels(group[names[0]].value[1], want, wheel_platforms(*key), local)
        dest = f"{WHEELS}/{kind}"
        subset = connector.narrowed(replace(cluster, hosts=tuple(h for h in cluster.hosts if h.name in names)))
        sent = sync_tree(subset, plan_sync(local, SyncOptions(dest=dest)), SyncOptions(dest=dest))
        for name, outcome in sent.failed.items():
            raise UsageError(f"--offline: could not send the wheels to {name}: {outcome.error}")
        where.update({name: dest for name in names})
    return where


def _set_python(cluster: Cluster, dry_run: bool) -> str | None:
    """The inventory's `python:` under defaults: the venv, when every host shares one workdir."""
    workdirs = {h.workdir for h in cluster.hosts}
    if not os.path.isfile(cluster.path):
        return None
    if len(workdirs) != 1:
        return ("the hosts' workdirs differ: set each host's `python:` to <its workdir>/"
                f"{VENV}/bin/python by hand")
    python = f"{workdirs.pop().rstrip('/')}/{VENV}/bin/python"
    if all(h.python == python for h in cluster.hosts):
        return None
    if dry_run:
        return f"would set defaults.python: {python} in {cluster.path}"
    from ..inventory_load import load_cluster

    write_setting(cluster.path, "defaults", "python", json.dumps(python))
    own = [h.name for h in load_cluster(cluster.path).hosts if h.python != python]
    note = f" ({', '.join(own)} set their own `python:`, which wins: change it there)" if own else ""
    return f"set defaults.python: {python} in {cluster.path}{note}"


CHECKS = ("python", "mlx", "mlx-lm", "parity")      # doctor's checks of what setup python installs


def python_checks(connector: Connector) -> tuple[int, list[str], list[str]]:
    """Doctor's python, mlx, mlx-lm and parity findings on the inventory as it is now: (passed, failed lines, the
    checks that ran)."""
    from ..doctor import DoctorOptions, run_doctor
    from ..inventory_load import load_cluster

    cluster = load_cluster(connector.cluster.path) if os.path.isfile(connector.cluster.path) else connector.cluster
    report = run_doctor(Connector(cluster, connector.host_key_checking, connector.connect_timeout),
                        DoctorOptions(deep=False))
    rows = [f for f in report.findings if f.check in CHECKS]
    return (sum(f.status == "pass" for f in rows),
            [f"{f.check} {f.host}: {f.detail}" for f in rows if f.status == "fail"],
            [c for c in CHECKS if any(f.check == c for f in rows)] or list(CHECKS[-1:]))
