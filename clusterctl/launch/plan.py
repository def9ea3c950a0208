"""What a launch needs to know about the hosts, found the way doctor finds it: the environment every rank
gets (libmpi location for MLX, docs/facts/mlx-distributed.md#mlx-mpi-libname; then the inventory's env, which wins)
and the subnet to pin MPI to (docs/facts/launchers.md#btl-tcp-if-include)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
from dataclasses import dataclass, field

from ..atomic import write_text
from ..errors import ConnectError, LaunchError, NotOnHosts, PreflightError
from ..hosts.connector import Connector
from ..hosts.facts import choose_libmpi, host_memory, libmpi_env, shared_subnet
from ..hosts.fanout import run_all
from ..hosts.probe import MPIRUN_DIRS, HostProbe, parse_probe, probe_script
from ..hosts.quoting import quote_path
from ..hosts.remote import export_text
from ..inventory import Cluster


@dataclass(frozen=True)
class LaunchPlan:
    env: dict[str, str] = field(default_factory=dict)
    if_include: str | None = None
    homes: dict[str, str] = field(default_factory=dict)   # host -> its $HOME, as the probe found it
    memory: dict[str, int] = field(default_factory=dict)  # host -> bytes its processes may use (facts.host_memory)
    first_os: str | None = None                           # rank 0's host's `uname -s`

    def python(self, cluster: Cluster) -> str:
        """The one python path a launcher that starts the same program on every host (mpirun, mlx.launch)
        is given: the inventory's, with a leading `~` made each host's home, which must then come out the
        same everywhere (such launchers exec it without a shell, so nothing else would expand it)."""
        if not any(h.python == "~" or h.python.startswith("~/") for h in cluster.hosts):
            return cluster.hosts[0].python
        missing = [h.name for h in cluster.hosts if h.python.startswith("~") and h.name not in self.homes]
        if missing:
            raise LaunchError(f"python {cluster.hosts[0].python!r} starts with ~, which this launcher does not "
                                 f"expand: the pre-flight finds each host's home (drop --no-preflight), or write "
                                 "`python:` as an absolute path")
        found = {h.name: self.homes[h.name] + h.python[1:] if h.python.startswith("~") else h.python
                 for h in cluster.hosts}
        if len(set(found.values())) > 1:
            shown = ", ".join(f"{n}: {p}" for n, p in list(found.items())[:3])
            raise LaunchError(f"`python:` with ~ is a different path on each host ({shown}), and this launcher "
                                 "starts one path everywhere: write an absolute `python:` per host that is the same "
                                 "on all of them (a symlink will do), or use --backend ring")
        return found[cluster.hosts[0].name]

    @classmethod
    def from_inventory(cls, cluster: Cluster) -> LaunchPlan:
        """What the inventory alone says, no host asked: its env and its mpi.if_include (--no-preflight,
        and the base every probed plan starts from)."""
        return cls(dict(cluster.hosts[0].env_dict), cluster.mpi.if_include)


def plan_from_probes(cluster: Cluster, probes: list[HostProbe]) -> LaunchPlan:
    first, inventory = probes[0], LaunchPlan.from_inventory(cluster)
    env = inventory.env
    libmpi = choose_libmpi(first.facts) if first.facts is not None else None
    if libmpi:
        env = {**libmpi_env(first.facts.get("os"), libmpi), **env}   # the inventory's env wins
    subnet = shared_subnet(probes)
    homes = {p.host.name: p.facts.get("home") for p in probes if p.facts is not None and p.facts.get("home")}
    memory = {p.host.name: m for p in probes if p.facts is not None and (m := host_memory(p.facts)) is not None}
    return LaunchPlan(env, inventory.if_include or (str(subnet) if subnet else None), homes, memory,
                      first.facts.get("os") or None if first.facts is not None else None)


# Whether python can find a module the way a rank will: from the workdir, with the inventory's env. Exit 0:
# found; 1: no such module; 2: a package on its path raised while being imported (its message printed:
# find_spec imports the parents of a dotted name, not the module itself).
_FIND_MODULE = ("import importlib.util, sys\n"
                "try:\n    found = importlib.util.find_spec(sys.argv[1])\n"
                "except ModuleNotFoundError:\n    sys.exit(1)\n"
                "except BaseException as e:\n    print('%s: %s' % (type(e).__name__, e))\n    sys.exit(2)\n"
                "sys.exit(0 if found else 1)")


def discover(connector: Connector, timeout: float = 30.0, script: str | None = None,
             module: str | None = None, needs_mpi: bool = False) -> LaunchPlan:
    """Probe every host at once (no peer checks) and plan from what they report. With `script` (or
    `module`), this is also the pre-flight of a run: every host must be reachable, with its python and the
    script (a path relative to the host's workdir, or absolute) or module in place; the first host that
    fails is named."""
    group = _probe_all(connector, timeout, script, module, needs_mpi)
    for name, outcome in group.failed.items():
        _raise(name, outcome.error)
    return plan_from_probes(connector.cluster, [o.value for o in group.values()])


def discover_with_paths(connector: Connector, paths: list[str], timeout: float = 30.0
                        ) -> tuple[LaunchPlan, dict[str, list[str]]]:
    """The pre-flight's probe before anything is copied, also looking for each of `paths` (directories the
    program reads that the copy of the project does not carry: absolute, ~, or relative to the host's workdir)
    on every host in the same pass: (the plan, {path: the hosts where it is not a directory}). A host that
    cannot be reached is raised as discover raises it."""
    group = _probe_all(connector, timeout, None, None, False, paths)
    for name, outcome in group.failed.items():
        _raise(name, outcome.error)
    probes = [o.value for o in group.values()]
    missing = {path: [p.host.name for p in probes if p.facts.get(f"path_{i}") != "yes"] for i, path in enumerate(paths)}
    return plan_from_probes(connector.cluster, probes), {path: hosts for path, hosts in missing.items() if hosts}


def check_inputs_on_hosts(connector: Connector, uncopied: list[tuple[str, str]], synced: bool) -> None:
    """The pre-flight's probe, run before anything is copied when the program reads paths `run` does not
    copy (`uncopied`: (flag, path); `synced`: run copies the project at all): each must be a directory on every
    host, or the run is refused with the hosts that lack it named (NotOnHosts, exit 2) instead of every rank
    failing after the copy. The plan it finds is kept, so the launch's own pre-flight verifies it beside the
    starting job instead of first."""
    plan, missing = discover_with_paths(connector, [path for _, path in uncopied])
    remember_plan(connector.cluster, plan)
    for flag, path in uncopied:
        hosts = missing.get(path)
        if not hosts:
            continue
        names = ", ".join(hosts)
        if not synced and not os.path.isabs(path):
            why, fix = "--no-sync copies nothing", "drop --no-sync, or run `clusterctl sync` first"
        else:
            where = path if os.path.isabs(path) else f"{path} from the workdir"
            why = "run copies only the project, and this path is outside it"
            fix = f"put it in the project and give its path there, or copy it to {where} on {names}"
        raise NotOnHosts(f"{flag} {path}: no such directory on {names} ({why}): {fix} (--no-preflight skips this check)")


def discover_reachable(connector: Connector, timeout: float = 30.0, script: str | None = None,
                       module: str | None = None, needs_mpi: bool = False) -> tuple[Cluster, LaunchPlan, dict[str, str]]:
    """The pre-flight of an elastic restart: (the cluster of the hosts that answered, in inventory order
    and ranks renumbered, its plan, {host that did not answer: why}). A host that answers but fails a check
    (no python, no script) still stops the run: leaving it out would hide a mistake, not a sleeping Mac."""
    group = _probe_all(connector, timeout, script, module, needs_mpi)
    for outcome in group.failed.values():
        if isinstance(outcome.error, PreflightError):
            raise outcome.error
    lost = {n: str(o.error).removeprefix(f"{n}: ") for n, o in group.failed.items()}
    sub = connector.cluster.subset(group.ok)
    if not sub.hosts:
        return sub, LaunchPlan(), lost
    return sub, plan_from_probes(sub, [HostProbe(sub.host(n), o.value.facts) for n, o in group.ok.items()]), lost


def _raise(name: str, error: BaseException):
    if isinstance(error, PreflightError):
        raise error
    raise ConnectError(name, str(error).removeprefix(f"{name}: ") + " (run `clusterctl doctor` for the whole picture)",
                       getattr(error, "reason", "other"))


def _on_host(host, path: str, home: bool = True) -> str:
    """Where a path a rank is given is on `host`: as it is when absolute (or, with `home`, ~: the bootstrap
    expands a script's), else in the host's workdir."""
    return path if path.startswith(("/", "~") if home else "/") else f"{host.workdir.rstrip('/')}/{path}"


def _probe_all(connector: Connector, timeout: float, script: str | None, module: str | None, needs_mpi: bool,
               paths: list[str] = ()):
    """Every host's probe at once: a GroupResult of HostProbe, or of the error that stopped a host (its
    PreflightError when it answered but failed a check). `paths`: directories looked for, as facts path_0, ..."""
    cluster = connector.cluster

    def probe(host):
        text = probe_script(python=host.python, workdir=host.workdir, mpi_lib_dir=host.mpi_lib_dir, peers=[],
                            mesh_config=None, ssh_config=None, mpi_libname=host.env_dict.get("MLX_MPI_LIBNAME"),
                            full=False)
        for i, path in enumerate(paths):
            where = quote_path(_on_host(host, path, home=False))      # a program's argument: ~ stays a name
            text += f"\nif [ -d {where} ]; then j path_{i} yes; else j path_{i} no; fi\n"
        if script is not None:
            where = _on_host(host, script)
            text += f"\nif [ -f {quote_path(where)} ]; then j script yes; else j script no; fi\n"
        if module is not None:
            text += module_check(host, module)
        # over the connection the run's copies and launcher share: beside a starting job, a login of its own
        # per host would take this machine's CPU from the launch (hosts/sharedssh.py)
        facts = parse_probe(connector.run_shared(host, text, timeout, env=module_env(host) if module else None).stdout)
        if script is not None or module is not None:
            # found the way a rank's launcher finds it: on the non-interactive PATH (docs/facts/ssh.md#non-interactive-path)
            if not facts.get("python_path"):
                raise PreflightError(f"{host.name}: python {host.python!r} not found on the non-interactive PATH "
                                     "(fix: set `python:` to a full path; `clusterctl doctor` shows more)")
            if needs_mpi and not facts.get("mpirun"):
                raise PreflightError(f"{host.name}: no mpirun on the PATH a session gets there, nor in "
                                     f"{', '.join(MPIRUN_DIRS)} (install Open MPI there, or use --backend ring; "
                                     "`clusterctl doctor` shows more)")
            if script is not None and facts.get("script") != "yes":
                raise PreflightError(f"{host.name}: {where} does not exist there (run copies the current directory "
                                     "unless --no-sync; or `clusterctl sync`; --no-preflight skips this check)")
            if module is not None and facts.get("module") != "yes":
                raise PreflightError(module_problem(host.name, host.python, module, facts.get("module"),
                                                    facts.get("module_error")))
        return HostProbe(host, facts)

    return run_all(cluster.hosts, probe, deadline=connector.deadline(timeout))


def module_check(host, module: str) -> str:
    """The probe's lines that look for `module` as a rank imports it: from the workdir, with the inventory's
    env and the clusterctl that `run` ships there first."""
    # the inventory's env arrives as text in RANK_ENV (on the probe's stdin, never its command line: see
    # module_env), exported by the shell itself, not through /usr/bin/env: macOS SIP would strip DYLD_* there
    # (docs/facts/macos.md#sip-strips-dyld)
    return (f"\nm=$(cd {quote_path(host.workdir)} 2>/dev/null; PYTHONPATH=.clusterctl/lib${{PYTHONPATH:+:$PYTHONPATH}}; "
            f'export PYTHONPATH; eval "${RANK_ENV}"; unset {RANK_ENV}; {quote_path(host.python)} '
            f"-c {shlex.quote(_FIND_MODULE)} {shlex.quote(module)} 2>&1)\n"
            'case $? in 0) j module yes;; 1) j module no;; *) j module error; j module_error "$m";; esac\n')


RANK_ENV = "CLUSTERCTL_RANK_ENV"


def module_env(host) -> dict[str, str]:
    """The environment the probe runs module_check's lines with: the inventory's env for the module check
    alone, as text (the rest of the probe must see the host as a login does)."""
    return {RANK_ENV: export_text(dict(host.env))}


def module_problem(host: str, python: str, module: str, found: str | None, message: str | None) -> str:
    """The pre-flight's one line for a module a host's python cannot run (pure)."""
    if found == "error":
        lines = [line for line in (message or "").splitlines() if line.strip()]
        return (f"{host}: importing {module.rsplit('.', 1)[0]} (on the way to {module}) raised there: "
                f"{lines[-1] if lines else 'no message'} (fix the package on that host; --no-preflight skips this check)")
    hint = f"; to run the file, write `clusterctl run {module}`" if module.endswith(".py") else ""
    return (f"{host}: no module named {module} for {python} there, from its workdir (install it on that host, or "
            f"put it in the project that run copies{hint}; --no-preflight skips this check)")


def _cache_path(cluster: Cluster) -> str:
    """One cached plan per cluster as resolved (hosts, ssh settings, MPI settings), not per file name."""
    hosts = [dataclasses.replace(h, line=0) for h in cluster.hosts]
    key = repr((hosts, cluster.mpi, cluster.ssh_config, cluster.host_key_checking))
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "clusterctl", "plans", f"{digest}.json")


def cached_plan(cluster: Cluster) -> LaunchPlan | None:
    """The plan the last verified launch on this cluster used, if any (a damaged cache is no cache)."""
    try:
        with open(_cache_path(cluster), encoding="utf-8") as f:
            data = json.load(f)
        env, if_include, homes = data["env"], data["if_include"], data.get("homes", {})
        memory, first_os = data.get("memory", {}), data.get("first_os")
        if isinstance(env, dict) and all(isinstance(v, str) for v in env.values()):
            homes = {k: v for k, v in homes.items() if isinstance(v, str)} if isinstance(homes, dict) else {}
            memory = {k: v for k, v in memory.items() if isinstance(v, int)} if isinstance(memory, dict) else {}
            return LaunchPlan(dict(env), if_include if isinstance(if_include, str) else None, homes, memory,
                              first_os if isinstance(first_os, str) else None)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def remember_plan(cluster: Cluster, plan: LaunchPlan) -> None:
    path = _cache_path(cluster)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        # 0600: a plan holds the inventory's env values
        write_text(path, json.dumps({"env": plan.env, "if_include": plan.if_include, "homes": plan.homes,
                                     "memory": plan.memory, "first_os": plan.first_os}) + "\n", mode=0o600)
    except OSError:
        pass   # a cache we cannot write only costs the next launch a pre-flight round trip

