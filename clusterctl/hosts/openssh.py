"""The one OpenSSH rendering of an inventory. Every OpenSSH client clusterctl starts — rsync's `-e`, mpirun's
plm_rsh_agent, mlx.launch's ssh, doctor's all-to-all probe, `hostfile --print-command` lines — reads an
ssh_config clusterctl wrote from the inventory, with `-F`; so does `ssh -G`, which tells paramiko where to
connect. One inventory, one answer (docs/facts/ssh.md#inventory-reaches-openssh-only-through-ssh-config).

    ssh_options(cluster)            ["-F", <the controller's config>], written once per content under
                                    ~/.cache/clusterctl/ssh/ (0600, in a 0700 directory)
    host_config_text(cluster, h)    what host h's own OpenSSH reads for host-to-host logins (mpirun from a
                                    host, doctor's mesh check), kept at <workdir>/.clusterctl/ssh_config there

What a rendering holds, in OpenSSH's first-value-wins order:
  1. a `Host NAME` block per inventory host with what the inventory sets: HostName (`hostname:`), Port,
     User, and a key (`identity_file:` on this machine, `mesh_identity_file:` on the hosts) with
     IdentitiesOnly; what the inventory leaves out is left to the user's own config;
  2. for every host: BatchMode (never prompt), ConnectTimeout, the host-key policy (docs/facts/ssh.md#batchmode-
     and-connecttimeout, #accept-new-host-keys);
  3. `Include` of the inventory's `ssh_config:` if it names one, else of ~/.ssh/config and
     /etc/ssh/ssh_config (which `-F` would otherwise skip), so everything else the user configured applies.
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat

from ..atomic import write_text
from ..errors import InventoryError
from ..inventory import Cluster, Host
from .transport import DEFAULT_CONNECT_TIMEOUT_S

HOST_CONFIG = ".clusterctl/ssh_config"          # relative to each host's workdir
CONTROL_PERSIST_S = 90                          # an idle master lives this long (`clusterctl ssh-close` ends it)
USER_CONFIGS = ("~/.ssh/config", "/etc/ssh/ssh_config")
_PATTERN_CHARS = re.compile(r"[\s*?!,%\"]")


def _value(text: str, what: str, where: Host | Cluster, tokens: bool = False) -> str:
    """A value in ssh_config: quoted when it holds spaces; `%` doubled (OpenSSH expands %-tokens) unless
    the value means its tokens."""
    if '"' in text or "\n" in text:
        raise InventoryError(where.path if isinstance(where, Cluster) else "inventory",
                             None if isinstance(where, Cluster) else where.line,
                             f"{what} {text!r} holds a character ssh_config cannot express (\" or a newline)")
    text = text if tokens else text.replace("%", "%%")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def _host_block(host: Host, identity: str | None) -> list[str]:
    if _PATTERN_CHARS.search(host.name):
        raise InventoryError("inventory", host.line, f"host name {host.name!r} holds a character OpenSSH reads "
                             "as a pattern in ssh_config (* ? ! , % space)")
    lines = [f"Host {host.name}"]
    if host.hostname:
        lines.append(f"  HostName {host.hostname}")
    if host.port:
        lines.append(f"  Port {host.port}")
    if host.user:
        lines.append(f"  User {_value(host.user, 'user', host)}")
    if identity:
        lines += [f"  IdentityFile {_value(identity, 'identity_file', host)}", "  IdentitiesOnly yes"]
    return lines


def render(hosts: list[Host], *, identity, includes: list[str], host_key_checking: str,
           connect_timeout: float, origin: str, control_path: str | None = None) -> str:
    """The config text: `identity(host)` is the key to use for a host (None: the user's config decides);
    with `control_path`, connections are multiplexed over a master kept CONTROL_PERSIST_S seconds."""
    lines = [f"# Written by clusterctl from {origin}; it is rewritten whenever the inventory changes.", ""]
    for host in hosts:
        if not host.local:
            lines += _host_block(host, identity(host)) + [""]
    lines += ["Host *", "  BatchMode yes", f"  ConnectTimeout {max(1, int(round(connect_timeout)))}"]
    # OpenSSH takes a setting's first value: the inventory's `strict` goes before the user's config and wins;
    # the default, accept-new, goes after it, so a user's own StrictHostKeyChecking (yes) is kept
    strict = ["  StrictHostKeyChecking yes"] if host_key_checking == "strict" else []
    lines += strict
    if control_path:
        lines += ["  ControlMaster auto", f"  ControlPath {_value(control_path, 'ControlPath', hosts[0], tokens=True)}",
                  f"  ControlPersist {CONTROL_PERSIST_S}"]
    lines += [f"Include {_value(path, 'Include', hosts[0], tokens=True)}" for path in includes]
    if not strict:
        lines += ["", "Host *", "  StrictHostKeyChecking accept-new"]
    return "\n".join(lines) + "\n"


def controller_config_text(cluster: Cluster, host_key_checking: str | None = None,
                           connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> str:
    """The rendering this machine's OpenSSH clients read: the inventory's keys as paths here."""
    includes = [cluster.ssh_config] if cluster.ssh_config else \
        [p for p in (os.path.expanduser(u) for u in USER_CONFIGS) if os.path.isfile(p)]
    return render(list(cluster.hosts), identity=_usable_identity, includes=includes,
                  host_key_checking=host_key_checking or cluster.host_key_checking,
                  connect_timeout=connect_timeout, origin=cluster.path,
                  control_path=os.path.join(control_dir(), "%C"))


def host_config_text(cluster: Cluster, host: Host, host_key_checking: str | None = None,
                     connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> str:
    """The rendering `host`'s own OpenSSH reads when it logs in to its peers: every host's name, port and
    user as on this machine; the key is the host's `mesh_identity_file:` (a path on that host), else the
    host's own configuration and default keys decide. The includes are the host's own configs (`~` is
    expanded by ssh there), or the inventory's ssh_config at the same path (doctor checks it is there)."""
    includes = [cluster.ssh_config] if cluster.ssh_config else list(USER_CONFIGS)
    # every host, itself included: a launcher there may ssh to its own inventory name like any other
    return render(list(cluster.hosts), identity=lambda peer: host.mesh_identity_file, includes=includes,
                  host_key_checking=host_key_checking or cluster.host_key_checking,
                  connect_timeout=connect_timeout, origin=f"{cluster.path} for {host.name}")


def host_config_path(host: Host) -> str:
    """Where the host's rendering lives on the host (`~` is the host's home)."""
    return posixpath.join(host.workdir, HOST_CONFIG)


def _usable_identity(host: Host) -> str | None:
    """The inventory's identity_file when it exists here (a missing one is named in connection errors)."""
    return host.identity_file if host.identity_file and os.path.exists(host.identity_file) else None


def control_dir() -> str:
    """Where the masters' sockets live (docs/facts/ssh.md#connection-sharing): a directory of this user's only
    (0700), with a short path, since a socket's path must fit in about 100 bytes ($XDG_RUNTIME_DIR/clusterctl,
    else /tmp/clusterctl-UID). A directory someone else made, or a symlink, is refused rather than used."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = os.path.join(runtime, "clusterctl") if runtime and len(runtime) < 40 else f"/tmp/clusterctl-{os.getuid()}"
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise InventoryError("ssh_config", None, f"{base} is not a private directory of this user (0700): remove it "
                             "(clusterctl keeps its SSH connection sockets there)")
    return base


def close_masters(cluster: Cluster | None = None) -> list[str]:
    """End the multiplexing masters: of the cluster's hosts, or every one clusterctl started. Returns the
    sockets that were open. A master that died already leaves a stale socket, removed here too."""
    import shutil
    import socket
    import subprocess

    ssh = shutil.which("ssh") or "ssh"
    directory = control_dir()
    if cluster is not None:
        config = controller_config(cluster)
        paths = []
        for host in cluster.hosts:
            if host.local:
                continue
            g = subprocess.run([ssh, "-G", "-F", config, "--", host.name], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL)
            paths += [line.split(" ", 1)[1] for line in g.stdout.splitlines() if line.startswith("controlpath ")]
    else:
        paths = [os.path.join(directory, n) for n in os.listdir(directory)]
    closed = []
    for path in paths:
        if not os.path.exists(path):
            continue
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(path)
            alive = True
        except OSError:
            alive = False
        finally:
            probe.close()
        if alive:
            subprocess.run([ssh, "-o", f"ControlPath={path}", "-O", "exit", "clusterctl-master"], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=30)
            closed.append(path)
        try:
            os.unlink(path)            # a dead master's socket; a live one's master removes it itself
        except FileNotFoundError:
            pass
    return closed


def cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "clusterctl", "ssh")


def write_config(text: str) -> str:
    """The file holding `text`, named by its sha256 in a private cache directory (written once, atomically,
    readable by this user only), so concurrent commands share it and an inventory change makes a new one."""
    directory = cache_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    path = os.path.join(directory, hashlib.sha256(text.encode()).hexdigest()[:24] + ".config")
    if not os.path.isfile(path):
        write_text(path, text, mode=0o600)
    return path


def controller_config(cluster: Cluster, host_key_checking: str | None = None,
                      connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> str:
    return write_config(controller_config_text(cluster, host_key_checking, connect_timeout))


def ssh_options(cluster: Cluster, host_key_checking: str | None = None,
                connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[str]:
    """What every OpenSSH client started on this machine is given: `-F` and the rendering."""
    return ["-F", controller_config(cluster, host_key_checking, connect_timeout)]


def rsh_agent(options: list[str]) -> str:
    """OpenMPI's plm_rsh_agent value for these ssh options. OpenMPI splits it on white space, so a path with
    spaces cannot be part of it (docs/facts/launchers.md#open-mpi-rsh-agent)."""
    argv = ["ssh", *options]
    if any(any(c.isspace() for c in word) for word in argv):
        raise InventoryError("ssh_config", None, f"{' '.join(argv)!r}: a path with white space, which mpirun cannot "
                             "pass to ssh; set XDG_CACHE_HOME (or the workdir) to a path without spaces")
    return " ".join(argv)
