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
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import EXIT_CONNECT, EXIT_FAILED, EXIT_OK, ConnectError, UsageError
from ..hosts.connector import Connector
from ..hosts.fanout import run_all
from ..hosts.scripts import script_text
from ..hosts.transport import quote_path
from ..inventory import Cluster, Host
from ..inventory_edit import write_setting

VENV = ".clusterctl/venv"
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
    checks_failed: list[str] = field(default_factory=list)    # doctor's python / mlx / parity lines that failed
    checks_passed: int = 0

    @property
    def ok(self) -> bool:
        return not any(h.error for h in self.hosts) and not self.checks_failed

    @property
    def exit_code(self) -> int:
        if self.ok:
            return EXIT_OK
        return EXIT_CONNECT if any(h.unreachable for h in self.hosts) else EXIT_FAILED

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
        if not dry_run and not any(h.error for h in self.hosts):
            out.append(f"doctor's python, mlx and parity checks: {self.checks_passed} passed"
                       + (f", {len(self.checks_failed)} failed" if self.checks_failed else ""))
        return out, err


def this_python() -> str:
    return "%d.%d" % sys.version_info[:2]


def requirements(host_os: str, path: str | None = None) -> list[str]:
    """What a host's venv gets (pure but for reading this machine's installed versions and `path`): MLX at
    this machine's version (its `cpu` extra on Linux: the plain wheel has no backend there), then either the
    lines of `path` or numpy and PyYAML at this machine's versions."""
    def pinned(name: str) -> str:
        try:
            return f"{name}=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            return name

    mlx = pinned("mlx")
    if host_os == "Linux":
        mlx = mlx.replace("mlx", "mlx[cpu]", 1)
    if path is None:
        return [mlx, *(pinned(n) for n in DEFAULT_PACKAGES[1:])]
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
    except OSError as e:
        raise UsageError(f"--requirements {path}: {e.strerror}") from None
    lines = [line for line in lines if line]
    names_mlx = any(line.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower() == "mlx"
                    for line in lines)
    return lines if names_mlx else [mlx, *lines]


def script(host: Host, want: str, reqs: list[str], dry_run: bool) -> str:
    text = "\n".join(reqs)
    digest = hashlib.sha256(f"{want}\n{text}".encode()).hexdigest()[:16]
    values = [f"WD={quote_path(host.workdir)}", f"WANT={shlex.quote(want)}", f"PYTHON={quote_path(host.python)}",
              f"REQS={shlex.quote(text)}", f"DIGEST={digest}", f"DRY={'yes' if dry_run else 'no'}"]
    return "\n".join(values) + "\n" + script_text("pyenv.sh")


def setup_python(connector: Connector, requirements_file: str | None = None, dry_run: bool = False,
                 progress: Callable[[HostPython], None] = lambda h: None, check: bool = True) -> PythonResult:
    cluster = connector.cluster
    want = this_python()
    seen_reqs: dict[str, list[str]] = {}

    def one(host: Host) -> HostPython:
        began = time.monotonic()
        with connector.transport(host) as t:
            host_os = t.run("uname -s", 30).stdout.strip()
            reqs = seen_reqs.setdefault(host_os, requirements(host_os, requirements_file))
            r = t.run(script(host, want, reqs, dry_run), TIMEOUT_S)
        lines = r.stdout.splitlines()
        done = HostPython(host.name, seconds=time.monotonic() - began)
        done.changes = [line.split(" ", 1)[1] if line.startswith("change ") else line
                        for line in lines if line.startswith(("change ", "would "))]
        done.python = next((line[7:] for line in lines if line.startswith("python ")), None)
        errors = [line[6:] for line in lines if line.startswith("error ")]
        if errors or r.exit_code != 0:
            done.error = errors[0] if errors else f"exit {r.exit_code}: {(r.stderr.strip() or '?')[-300:]}"
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
        result.checks_passed, result.checks_failed = python_checks(connector)
    return result


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
    from ..launch.backends import load_cluster

    write_setting(cluster.path, "defaults", "python", json.dumps(python))
    own = [h.name for h in load_cluster(cluster.path).hosts if h.python != python]
    note = f" ({', '.join(own)} set their own `python:`, which wins: change it there)" if own else ""
    return f"set defaults.python: {python} in {cluster.path}{note}"


def python_checks(connector: Connector) -> tuple[int, list[str]]:
    """Doctor's python, mlx and parity findings on the inventory as it is now: (passed, failed lines)."""
    from ..doctor import DoctorOptions, run_doctor
    from ..launch.backends import load_cluster

    cluster = load_cluster(connector.cluster.path) if os.path.isfile(connector.cluster.path) else connector.cluster
    report = run_doctor(Connector(cluster, connector.host_key_checking, connector.connect_timeout),
                        DoctorOptions(deep=False))
    rows = [f for f in report.findings if f.check in ("python", "mlx", "parity")]
    return (sum(f.status == "pass" for f in rows),
            [f"{f.check} {f.host}: {f.detail}" for f in rows if f.status == "fail"])
