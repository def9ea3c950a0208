"""A detached run's supervisor on its host, from this machine: where its files are, starting it, asking how it is.

    host = choose(cluster, "h2")                 # --supervisor, else the first host (never this machine)
    pid = start(connector, host, handoff)        # hands the job over (hosts/scripts/detach.py keeps it there)
    state(connector, host, run_id)               # {"state": "running"|"ended"|"lost"|"unknown", ...}

Its folder on the host is <workdir>/.clusterctl/detached/<id>/: the handoff (0600), supervisor.log (everything
it printed), supervisor.pid and keeper.pid, exit.json once it ended, .live.json (the live panel's snapshot), and the run
directory it keeps as `run` keeps runs/<id>/ here (the supervisor's --runs-dir is <workdir>/.clusterctl/detached).
The supervisor runs `python -m clusterctl COMMAND --handoff FOLDER/handoff.json ARGS` (COMMAND: run, or serve) with
the host's python and the clusterctl `run` ships there (<workdir>/.clusterctl/lib), in the workdir, where the project
was copied.
"""
from __future__ import annotations

import os
import tempfile

from ..errors import ClusterctlError, UsageError
from ..hosts.connector import Connector
from ..hosts import hostscript
from ..hosts.scripts.contract import SupervisorState
from ..hosts.scripts.contract import LIVE_FILE  # noqa: F401 (in its folder: the live panel's last snapshot; cli/printedrun.py LiveFile)
from ..inventory import Cluster, Host
from . import handoff as handoffs

DETACHED_DIR = ".clusterctl/detached"      # relative to a host's workdir
LIB_DIR = ".clusterctl/lib"                # where transfer/stage.py ship_clusterctl puts clusterctl
# what the supervisor imports besides clusterctl: its own requirements (pyproject.toml), which the host's python
# must have (`clusterctl setup python --with supervisor` installs them)
NEEDS = ("click", "paramiko", "yaml", "rich")
START_TIMEOUT_S = 60.0


def folder(host: Host, run_id: str) -> str:
    return f"{host.workdir.rstrip('/')}/{DETACHED_DIR}/{run_id}"


def choose(cluster: Cluster, name: str | None) -> Host:
    """The supervising host: `name` (--supervisor) or the first host; one this machine reaches over SSH."""
    if name is not None:
        try:
            host = cluster.host(name)
        except KeyError:
            raise UsageError(f"--supervisor {name}: not a host of {cluster.path} (its hosts: "
                             f"{', '.join(cluster.names)})") from None
    else:
        host = cluster.hosts[0]
    if host.local:
        raise UsageError(f"--detach: {host.name} is this machine (local: true), which the job must not depend on; "
                         "name another host with --supervisor, or run attached")
    return host


def check_python(connector: Connector, host: Host) -> None:
    """The host's python can run the supervisor (clusterctl's own requirements), else one line with the fix."""
    with connector.transport(host) as t:
        result = hostscript.run(t, host.python, "missing.py", *NEEDS, timeout=30)
    try:
        missing = hostscript.answer(result)
    except hostscript.NoAnswer:
        raise ClusterctlError(f"--detach: {host.name}'s python ({host.python}) did not answer (status "
                              f"{result.exit_code}): {(result.stderr.strip().splitlines() or ['no output'])[-1]}"
                              ) from None
    if missing:
        names = ["pyyaml" if n == "yaml" else n for n in missing]
        raise ClusterctlError(f"--detach: {host.name}'s python ({host.python}) lacks {', '.join(names)}, which the "
                              f"supervisor needs there: run `clusterctl setup python --with supervisor`, or pip "
                              f"install {' '.join(names)} into it")


def start(connector: Connector, host: Host, handoff: handoffs.Handoff) -> int:
    """Write the handoff into the run's folder on `host` and start the supervisor there, detached; its pid."""
    where = folder(host, handoff.run_id)
    fd, local = tempfile.mkstemp(prefix="clusterctl-handoff-")
    try:
        os.close(fd)
        handoffs.write(local, handoff)
        with connector.transport(host) as t:
            t.put(local, f"{where}/handoff.json", mode=0o600)
            # in the workdir: the handoff and clusterctl by paths relative to it (a workdir may start with ~)
            env = {"PYTHONPATH": LIB_DIR, "PYTHONUNBUFFERED": "1"}
            result = hostscript.run(t, host.python, "detach.py", where, host.workdir, host.python, "-m", "clusterctl",
                                    handoff.command, "--handoff", f"{DETACHED_DIR}/{handoff.run_id}/handoff.json",
                                    *handoff.argv, timeout=START_TIMEOUT_S, env=env)
    finally:
        os.unlink(local)
    try:
        answer = hostscript.answer(result)
    except hostscript.NoAnswer:
        answer = {"error": (result.stderr.strip().splitlines() or [f"status {result.exit_code}, no output"])[-1]}
    if "pid" not in answer:
        raise ClusterctlError(f"--detach: the supervisor did not start on {host.name}: {answer.get('error')}")
    return int(answer["pid"])


def state(connector: Connector, host: Host, run_id: str, timeout: float = 30.0, op: str = "state") -> dict:
    """How the supervisor of `run_id` is, as its host says (hosts/scripts/follow.py state); op "stop": SIGTERM
    to it first when it runs (it stops the ranks with their checkpoint, as `run` does on SIGTERM)."""
    with connector.transport(host) as t:
        result = hostscript.run(t, host.python, "follow.py", folder(host, run_id), op, timeout=timeout)
    try:
        return hostscript.answer(result)
    except hostscript.NoAnswer:
        return {"state": SupervisorState.UNKNOWN, "why": (result.stderr.strip().splitlines() or ["no answer"])[-1]}
