"""A real cluster on one machine: K OpenSSH sshd processes, one per loopback address 127.0.0.x.

Each host gets its own sshd on its own address and free port, throw-away host keys, one throw-away client
key for all, and an ssh_config naming the hosts h1..hK, so clusterctl, `ssh`, mpirun and mlx.launch all
reach them the same way. Where `unshare -m` works, each sshd runs in a private mount namespace with a tmpfs
mounted on the same path (`host_root`): the same path holds different files on each host, so a test can
prove that a file reached host 2 and not host 3. The recipe and where it differs from real hosts:
docs/facts/test-cluster.md#loopback-sshd-recipe, docs/facts/test-cluster.md#private-mount-namespace-per-host.

Fault injectors: stop/start a host, freeze it (SIGSTOP: accepts TCP, never answers), make it refuse our key
(with password authentication on, as a host that would prompt), give its sessions another PATH, break SSH
from one host to another, show one host other files at the same path (another virtualenv).

With private namespaces each host also gets a plain shell: an empty ~/.bashrc is mounted over the real one,
so sessions see exactly the PATH sshd sets. This machine's own ~/.bashrc runs `pyenv init`, whose rehash
lock makes hundreds of concurrent sessions (doctor's all-to-all at 16 hosts) wait up to a minute each.
Teardown kills by PID only (the sshd listeners and their descendants), never by name.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:" + os.environ.get("PATH", ""))
SSH = shutil.which("ssh")
SSH_KEYGEN = shutil.which("ssh-keygen")
# PATH for sessions unless a test changes it; sshd's own compiled-in default on Debian
# (docs/facts/ssh.md#non-interactive-path).
DEFAULT_SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY_TIMEOUT_S = 10.0
HOME_BASHRC = os.path.expanduser("~/.bashrc")
# Fake-Darwin hosts (tests/fakedarwin/README.md): stand-ins first on PATH, then this machine's tools minus
# what macOS does not have
FAKE_DARWIN = Path(__file__).resolve().parent / "fakedarwin"
OPEN_MPI_TOOLS = ("mpirun", "mpiexec", "orterun", "orted", "ompi_info", "prterun", "prted", "prte")
ABSENT_ON_MACOS = {"sha256sum", "sha1sum", "md5sum", "timeout", "setsid", "nproc", "flock", "tac", "ip", "ss",
                   "realpath", "stdbuf", "numfmt", "getent", "lscpu", "free", "runuser", "systemctl"}


def unshare_works() -> bool:
    """True when this process may create a private mount namespace and mount a tmpfs in it."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt && umount /mnt"],
        capture_output=True)
    return probe.returncode == 0


# Every test skipped for want of `unshare -m` says this, through requires_private_roots(), so that
# tests/conftest.py can find them all: it lists them in a block of their own at the end of the run, and
# fails the run if `unshare -m` works after all (CI runs as root, where it must).
NO_PRIVATE_ROOTS = "needs unshare -m (a private mount namespace per host) and has none"


def requires_private_roots(cluster: "SSHCluster | None" = None, why: str = "") -> None:
    """Skip the calling test unless `cluster` gives each host a private root (without a cluster: unless
    `unshare -m` works here), with the one reason conftest recognises; `why` says what the test needs it for."""
    if (cluster.private_roots if cluster is not None else unshare_works()):
        return
    import pytest  # here, not at the top: benchmarks/ use this module without pytest
    pytest.skip(f"{NO_PRIVATE_ROOTS}: {why}" if why else NO_PRIVATE_ROOTS)


def free_port_on(addresses: list[str]) -> int:
    """A port free on every one of these addresses (one sshd port for the whole cluster)."""
    for _ in range(200):
        port = free_port(addresses[0])
        try:
            for address in addresses[1:]:
                with socket.socket() as s:
                    s.bind((address, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free on all of {addresses}")


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def namespace_mates(pids: list[int]) -> list[int]:
    """The processes whose mount namespace is one of `pids`' own, where that is not this process's (a host's
    private root: tests/sshcluster.py start_host)."""
    def ns(pid) -> str | None:
        try:
            return os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            return None

    ours = ns(os.getpid())
    theirs = {n for n in map(ns, pids) if n is not None and n != ours}
    if not theirs:
        return []
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid() and ns(e) in theirs]


def descendants(pid: int) -> list[int]:
    """All live descendants of pid, from /proc (deepest last)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def rank_pid(run_id: str, rank: int) -> int:
    """The python of rank `rank` of this run (every simulated host is this machine)."""
    for pid in subprocess.run(["pgrep", "-f", f"clusterctl-run-{run_id}"], capture_output=True, text=True).stdout.split():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"python" in os.path.basename(argv[0]) and b"clusterctl.train" in argv and env.get(b"MLX_RANK") == str(rank).encode():
            return int(pid)
    raise AssertionError(f"no rank {rank} of run {run_id}")


def caffeinates(pids) -> dict[int, int]:
    """The caffeinate processes on this machine (every simulated host lives here) that watch one of `pids`
    (`caffeinate ... -w PID`, as the bootstrap starts them on a Mac): watched pid -> caffeinate's pid."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
        except (OSError, ValueError):
            continue
        if any(a.endswith("/caffeinate") for a in argv[:2]) and len(argv) > 2 and argv[-2] == "-w" \
                and argv[-1].isdigit() and int(argv[-1]) in pids:
            out[int(argv[-1])] = int(entry)
    return out



def telemetry_probes(workdir) -> list[int]:
    """The pids of this machine's telemetry probes in loop mode (`--every`, observe/telemetry.py) for `workdir`:
    every simulated host lives here. A probe's own child between its fork and its exec (the `ps` it runs each
    sample) carries the probe's command line for that moment: a process whose parent is a probe is not one."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"--every" in argv and str(workdir).encode() in argv:
            found[int(entry)] = ppid
    return [pid for pid, ppid in found.items() if ppid not in found]

@dataclass
class TestHost:
    index: int                 # 1-based: h1 is the first host
    name: str
    address: str
    port: int
    dir: Path
    proc: subprocess.Popen | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    binds: dict[str, str] = field(default_factory=dict)  # path on this host -> what is mounted over it
    session_env: dict[str, str] = field(default_factory=dict)  # sshd SetEnv for this host's sessions
    route_address: str | None = None      # this machine's own way to the host's sshd (SSHCluster own_route)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class SSHCluster:
    _instances = 0

    def __init__(self, root: Path, size: int, private_roots: bool | None = None, inventory_only: bool = False,
                 stock_sshd: bool = False, darwin: set[int] | frozenset[int] = frozenset(),
                 homebrew_mpi: bool = False, persistent_roots: bool = False, own_route: bool = False,
                 spinwait: bool = False):
        if not (SSHD and SSH and SSH_KEYGEN):
            raise RuntimeError("OpenSSH server and client are needed: apt-get install openssh-server "
                               "openssh-client (tests/run.sh does this)")
        self.root = Path(root)
        self.private_roots = unshare_works() if private_roots is None else private_roots
        self.host_root = self.root / "hostroot"          # same path on every host; private when possible
        self.workdir = str(self.host_root / "work")
        # inventory_only: nothing but the inventory says how to reach the hosts (no ssh_config for clusterctl,
        # a key with no default name, one non-default port, each session's HOME an empty directory; run
        # clusterctl with client_env(), whose HOME is empty too). The fixture's own ssh() still works.
        self.inventory_only = inventory_only or stock_sshd
        # stock_sshd (implies inventory_only): sshd with OpenSSH's own defaults, its post-quantum key exchange
        # included, and no client tuning at all: what a Mac's Remote Login offers
        self.stock_sshd = stock_sshd
        # darwin: the hosts (1-based) that behave like Macs: zsh login shell, macOS's tools and refusals
        self.darwin = frozenset(darwin)
        # homebrew_mpi: on the fake Macs, Open MPI is where Homebrew puts it (/opt/homebrew/bin), which is not
        # on sshd's PATH, as on a real Mac
        self.homebrew_mpi = homebrew_mpi
        # persistent_roots: each host's private root is a directory of its own on this disk instead of a tmpfs,
        # so a host stopped with stop_host() comes back with start_host() holding what it held (a Mac that
        # slept and woke), where otherwise it comes back empty
        self.persistent_roots = persistent_roots
        # own_route: this machine reaches each host at a second address of the host's sshd (route_address), the
        # hosts reach each other at their first (each host's namespace sees an ssh_config of its own): cutting
        # this machine off (cut_this_machine) leaves the hosts' SSH, and their data plane, as they were, as when a
        # laptop's Wi-Fi drops while the Macs stay joined by their cables. Needs private roots; not with
        # inventory_only (there the inventory's names are the addresses both sides use).
        self.own_route = own_route
        # spinwait: the hosts' sessions preload tests/spinwait (spinwait_library): a rank waiting for a peer sleeps
        # instead of taking the shared cores from it. The tests' make_cluster turns it on; benchmarks leave it off,
        # so that their recorded figures were measured as they are measured again.
        self.spinwait = spinwait
        if own_route and self.inventory_only:
            raise ValueError("own_route needs the ssh_config mode (inventory_only names the hosts by address)")
        self.hosts_ssh_config = self.root / "ssh_config.hosts"      # the hosts' view (own_route)
        self.client_key = self.root / ("cluster_key" if inventory_only else "client_ed25519")
        self.client_home = self.root / "client_home"
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        self.inventory = self.root / "inventory.yaml"
        self.empty_keys = self.root / "no_authorized_keys"
        self.plain_bashrc = self.root / "plain_bashrc"
        # Each cluster gets its own loopback /24 (127.C.P.0: a per-process counter and this process), so
        # no two clusters, in sequence or side by side, share an address: a port in TIME_WAIT from one
        # test's ring job can never stand in the next one's way.
        SSHCluster._instances += 1
        self.subnet = f"127.{1 + SSHCluster._instances % 250}.{os.getpid() % 250}"
        self.hosts = [TestHost(i, f"h{i}", f"{self.subnet}.{10 + i}", 0, self.root / f"h{i}",
                               route_address=f"{self.subnet}.{110 + i}" if own_route else None)
                      for i in range(1, size + 1)]

    # ---- setup --------------------------------------------------------------------------------
    def start(self) -> "SSHCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        self.host_root.mkdir(exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)   # sshd's privilege separation directory
        _keygen(self.client_key)
        self.authorized_keys = self.root / "authorized_keys"
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        self.empty_keys.write_text("")
        self.plain_bashrc.write_text("# a plain shell for test hosts (see the module docstring)\n")
        common_port = free_port_on([h.address for h in self.hosts]) if self.inventory_only else None
        if self.darwin:
            self._prepare_darwin()
        for host in self.hosts:
            host.dir.mkdir(exist_ok=True)
            (host.dir / "tmp").mkdir(exist_ok=True)
            seed_mlx_kernels(host.dir / "tmp")
            _keygen(host.dir / "host_ed25519")
            host.port = common_port or (free_port_on([host.address, host.route_address]) if host.route_address
                                        else free_port(host.address))
            # Each machine has its own /tmp; here they would share one, and OpenMPI's daemons (all with the
            # same hostname) would collide on their session directories in it
            # (docs/facts/test-cluster.md#one-machine-open-mpi-collisions).
            host.session_env = {"PATH": DEFAULT_SESSION_PATH, "TMPDIR": str(host.dir / "tmp")}
            # each machine has cores of its own; here the ranks share two (spinwait_library)
            if self.spinwait and (spinwait := spinwait_library()):
                host.session_env["LD_PRELOAD"] = spinwait
            if self.inventory_only:      # no ~/.ssh/config, no known_hosts: the host starts from nothing
                (host.dir / "home").mkdir(exist_ok=True)
                host.session_env["HOME"] = str(host.dir / "home")
            if host.index in self.darwin:
                self._make_darwin(host)
        self.client_home.mkdir(exist_ok=True)
        self.write_ssh_config()
        self.write_inventory()
        try:
            for host in self.hosts:
                self.start_host(host.index)
        except BaseException:
            self.stop_all()
            raise
        return self

    def _prepare_darwin(self) -> None:
        """What every fake Mac shares: a PATH directory of this machine's tools minus the GNU-only ones
        macOS lacks, and /etc/passwd with zsh as root's login shell."""
        if not self.private_roots:
            raise RuntimeError("fake-Darwin hosts need unshare -m (a private /etc/passwd per host)")
        if not shutil.which("zsh"):
            raise RuntimeError("fake-Darwin hosts log in with zsh: apt-get install zsh (tests/run.sh does this)")
        farm = self.root / "darwin_path"
        farm.mkdir(exist_ok=True)
        for directory in DEFAULT_SESSION_PATH.split(":"):
            if not os.path.isdir(directory):
                continue
            for name in sorted(os.listdir(directory)):
                target = os.path.join(directory, name)
                link = farm / name
                if name in ABSENT_ON_MACOS or link.exists() or link.is_symlink() or not os.access(target, os.X_OK):
                    continue
                if self.homebrew_mpi and name in OPEN_MPI_TOOLS:
                    continue
                link.symlink_to(target)
        if self.homebrew_mpi:      # /opt, as the fake Macs see it: homebrew/bin with Open MPI's tools
            brew = self.root / "opt" / "homebrew" / "bin"
            brew.mkdir(parents=True, exist_ok=True)
            for name in OPEN_MPI_TOOLS:
                found = shutil.which(name, path=DEFAULT_SESSION_PATH)
                if found and not (brew / name).exists():
                    (brew / name).symlink_to(found)
        self.darwin_path = f"{FAKE_DARWIN / 'bin'}:{farm}"
        lines = []
        with open("/etc/passwd", encoding="utf-8") as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if fields[0] == "root" and len(fields) == 7:
                    fields[6] = shutil.which("zsh")
                lines.append(":".join(fields))
        self.darwin_passwd = self.root / "passwd.zsh"
        self.darwin_passwd.write_text("\n".join(lines) + "\n")

    def _make_darwin(self, host: TestHost) -> None:
        host.session_env.update({
            "PATH": self.darwin_path,
            "FAKE_DARWIN_OUTPUTS": str(FAKE_DARWIN / "outputs"),
            "FAKE_DARWIN_FIXTURES": str(FAKE_DARWIN.parent / "fixtures" / "macos"),
            "FAKE_DARWIN_LOG": str(host.dir / "refused.log"),
            "FAKE_DARWIN_STATE": str(host.dir),      # what the ifconfig stand-in was told to change
        })
        host.binds["/etc/passwd"] = str(self.darwin_passwd)
        if self.homebrew_mpi:
            host.binds["/opt"] = str(self.root / "opt")

    def refused(self, index: int) -> list[str]:
        """What fake-Darwin host `index`'s stand-ins refused (GNU-only usage we sent it), one line each."""
        log = self.host(index).dir / "refused.log"
        return log.read_text().splitlines() if log.exists() else []

    def write_ssh_config(self) -> None:
        self.ssh_config.write_text(self._ssh_config_text(route=self.own_route))
        if self.own_route:
            self.hosts_ssh_config.write_text(self._ssh_config_text(route=False))

    def _ssh_config_text(self, route: bool) -> str:
        """The ssh_config naming h1..hK at their addresses (route: at this machine's own, own_route)."""
        lines = []
        for h in self.hosts:
            lines += [f"Host {h.name}", f"  HostName {h.route_address if route else h.address}", f"  Port {h.port}",
                      "  User root", f"  IdentityFile {self.client_key}", "  IdentitiesOnly yes", ""]
        # KexAlgorithms: OpenSSH 9's default post-quantum key exchange costs ~100 ms of client CPU per
        # connection. Real hosts pay that in parallel on their own cores; here all N*(N-1) sessions of an
        # all-to-all share this machine's two, so the simulated cluster uses the classic exchange
        # (docs/facts/test-cluster.md#post-quantum-kex-cost).
        lines += ["Host *", f"  UserKnownHostsFile {self.known_hosts}", "  StrictHostKeyChecking accept-new",
                  "  BatchMode yes", "  ConnectTimeout 5", "  LogLevel ERROR", "  KexAlgorithms curve25519-sha256",
                  ""]
        return "\n".join(lines)

    def write_inventory(self, env: dict[str, str] | None = None, **defaults: str) -> Path:
        """The inventory, with `defaults` (strings) and `env` (every host's environment) under defaults."""
        d = {"python": sys.executable, "workdir": self.workdir, **defaults}
        if not self.inventory_only and "model_store" not in defaults:
            # each host's model store in its own root (the user's ~/.cache is never a test's); the inventory-only
            # hosts' HOME is an empty directory of their own already
            d["model_store"] = str(self.host_root / "model-store")
        if self.inventory_only:     # the issue's own example: hosts by address, the rest in defaults
            d = {"user": "root", "port": str(self.hosts[0].port), "identity_file": str(self.client_key),
                 "mesh_identity_file": str(self.client_key), **d}
        lines = [] if self.inventory_only else ["ssh_config: ssh_config"]
        lines += ["defaults:"]
        lines += [f"  {k}: {v}" if k == "port" else f"  {k}: {_yaml_str(v)}" for k, v in d.items()]
        if env:
            lines += ["  env:"] + [f"    {k}: {_yaml_str(v)}" for k, v in env.items()]
        lines += ["hosts:"]
        for h in self.hosts:
            lines += [f"  - name: {h.address if self.inventory_only else h.name}", f"    address: {h.address}"]
        # Every simulated host is this one machine: OpenMPI 4.1's daemons race to share one hwloc topology
        # segment and one of them can segfault (hwloc_shmem_topology_write) at 8+ hosts. Real hosts run one
        # daemon each and need none of this.
        lines += ["mpi:", "  extra_args: [--mca, rtc_hwloc_vmhole, none]"]
        self.inventory.write_text("\n".join(lines) + "\n")
        return self.inventory

    def sshd_config(self, host: TestHost) -> str:
        settings = {
            "ListenAddress": f"{host.address}:{host.port}" + (f"\nListenAddress {host.route_address}:{host.port}"
                                                              if host.route_address else ""),
            "HostKey": str(host.dir / "host_ed25519"),
            "PidFile": "none",
            "AuthorizedKeysFile": str(self.authorized_keys),
            "PubkeyAuthentication": "yes",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "UsePAM": "no",
            "StrictModes": "no",
            "PermitRootLogin": "yes",
            "LogLevel": "VERBOSE",
            "MaxStartups": "100:30:200",
            "MaxSessions": "100",
            "SetEnv": " ".join(f"{k}={v}" for k, v in host.session_env.items()),
            # the classic key exchange (docs/facts/test-cluster.md#post-quantum-kex-cost), set on the server side
            # so that clients need no configuration for it; both names, for paramiko
            # (docs/facts/ssh.md#paramiko-key-exchange)
            **({"KexAlgorithms": "curve25519-sha256,curve25519-sha256@libssh.org"}
               if self.inventory_only and not self.stock_sshd else {}),
            "Subsystem": "sftp internal-sftp",     # docs/facts/test-cluster.md#sftp-subsystem-required
        }
        settings.update(host.overrides)
        return "".join(f"{k} {v}\n" for k, v in settings.items())

    def start_host(self, index: int) -> None:
        host = self.host(index)
        config = host.dir / "sshd_config"
        config.write_text(self.sshd_config(host))
        log = host.dir / "sshd.log"
        log.write_text("")
        sshd = [SSHD, "-D", "-f", str(config), "-E", str(log)]
        if self.private_roots:
            binds = dict(host.binds)
            if os.path.isfile(HOME_BASHRC):
                binds.setdefault(HOME_BASHRC, str(self.plain_bashrc))
            if self.own_route:          # the hosts reach each other at their first addresses
                binds.setdefault(str(self.ssh_config), str(self.hosts_ssh_config))
            if self.persistent_roots:
                disk = host.dir / "disk"
                disk.mkdir(mode=0o755, exist_ok=True)
                mounts = [f'mount --bind {shlex.quote(str(disk))} "$1"']
            else:
                mounts = ['mount -t tmpfs -o mode=0755 tmpfs "$1"']
            mounts += [f"mount --bind {shlex.quote(src)} {shlex.quote(dst)}" for dst, src in binds.items()]
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                    " && ".join(mounts) + ' && shift && exec "$@"', "sh", str(self.host_root), *sshd]
        else:
            if host.binds or self.own_route:
                raise RuntimeError("this fault needs unshare -m (a private mount namespace per host)")
            argv = sshd
        with open(host.dir / "launch.err", "wb") as err:      # sshd keeps its own copy of the descriptor
            host.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True)
        self._wait_ready(host, log)

    def _wait_ready(self, host: TestHost, log: Path) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if host.proc.poll() is not None:
                break
            try:
                with socket.create_connection((host.address, host.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        # sshd's own log says why (docs/facts/test-cluster.md#fail-on-sshd-bind-error)
        why = (log.read_text() + (host.dir / "launch.err").read_text()).strip()
        self.stop_host(host.index)
        raise RuntimeError(f"sshd for {host.name} did not come up on {host.address}:{host.port}: {why}")

    # ---- fault injectors ----------------------------------------------------------------------
    def host(self, index: int) -> TestHost:
        return self.hosts[index - 1]

    def stop_host(self, index: int) -> None:
        """Kill host `index`'s sshd and every session under it, and, with private roots, every process in the host's
        own mount namespace (one that left its session: a detached supervisor): connections are then refused, and
        nothing of the host runs on, as when a machine dies."""
        host = self.host(index)
        if host.proc is None:
            return
        tree = [host.pid] + descendants(host.pid)
        for pid in tree + [p for p in namespace_mates(tree) if p not in tree]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            host.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        host.proc = None

    def restart_sshd(self, index: int) -> None:
        """Restart host `index`'s sshd as an administrator does (Remote Login switched off and on): the listener
        stops, refusing connections until the new one is up; the sessions it started go on."""
        host = self.host(index)
        host.proc.terminate()            # sshd's SIGTERM ends the listener only; its sessions are on their own
        host.proc.wait(timeout=10)
        self.start_host(index)

    def freeze(self, index: int) -> None:
        """SIGSTOP the listener: TCP connects still complete (kernel backlog), but no banner ever comes."""
        os.kill(self.host(index).pid, signal.SIGSTOP)

    def thaw(self, index: int) -> None:
        os.kill(self.host(index).pid, signal.SIGCONT)

    def sleep_host(self, index: int) -> list[int]:
        """A Mac going to sleep (or its power cut, as its peers see it: nothing of it closes a connection): SIGSTOP
        host `index`'s sshd and every session under it (the ranks there included) and, with private roots, every
        process in its mount namespace (one that left its session: a detached supervisor). Connections hang
        without a banner, open ones carry nothing. Returns what was stopped."""
        host = self.host(index)
        tree = [host.pid] + descendants(host.pid)
        stopped = tree + [p for p in namespace_mates(tree) if p not in tree]
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        return stopped

    def wake_host(self, index: int, stopped: list[int]) -> None:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def restart(self, index: int, binds: dict[str, str] | None = None, **overrides: str) -> None:
        """Restart a host's sshd with sshd_config overrides and bind mounts (its private root starts empty)."""
        self.stop_host(index)
        host = self.host(index)
        host.overrides = {**host.overrides, **overrides}
        host.binds = {**host.binds, **(binds or {})}
        self.start_host(index)

    def own_dot_ssh(self) -> None:
        """Give every host its own, empty ~/.ssh, as each Mac has: a private directory (host.dir / "dotssh")
        mounted over root's, from which sshd reads authorized_keys besides the cluster's own file, and ssh its
        keys and known_hosts. Needs private roots (requires_private_roots first)."""
        root_ssh = os.path.join(os.path.expanduser("~root"), ".ssh")
        os.makedirs(root_ssh, mode=0o700, exist_ok=True)              # the mount point
        for host in self.hosts:
            (host.dir / "dotssh").mkdir(mode=0o700)
            host.session_env.pop("HOME", None)       # the passwd entry's home, where ssh itself looks
            self.restart(host.index, binds={root_ssh: str(host.dir / "dotssh")},
                         AuthorizedKeysFile=f"{self.authorized_keys} .ssh/authorized_keys")

    def refuse_key(self, index: int) -> None:
        """The host no longer accepts our key and offers passwords: a naive ssh would sit at a prompt
        (docs/facts/ssh.md#batchmode-and-connecttimeout)."""
        self.restart(index, AuthorizedKeysFile=str(self.empty_keys), PasswordAuthentication="yes",
                     KbdInteractiveAuthentication="yes")

    def set_session_path(self, index: int, path: str) -> None:
        """Sessions on this host get exactly this PATH (needs the plain shell of a private namespace
        where this machine's ~/.bashrc changes PATH)."""
        if not self.private_roots and os.path.isfile(HOME_BASHRC):
            raise RuntimeError(f"{HOME_BASHRC} would override the PATH and unshare -m is not available")
        self.host(index).session_env["PATH"] = path
        self.restart(index)

    def python_on_path(self, index: int, interpreter: str) -> None:
        """`python3` and `python` on this host's session PATH are `interpreter` (another python)."""
        directory = self.root / f"python-for-h{index}"
        directory.mkdir(exist_ok=True)
        for name in ("python3", "python"):
            link = directory / name
            if link.is_symlink():
                link.unlink()
            link.symlink_to(interpreter)
        self.set_session_path(index, f"{directory}:{DEFAULT_SESSION_PATH}")

    def break_ssh(self, src: int, dst: int) -> None:
        """Host `src` can no longer log in to host `dst` (its ssh_config offers a key `dst` does not know),
        while this machine still reaches both."""
        stranger = self.root / "stranger_ed25519"
        _keygen(stranger)
        text = self.ssh_config.read_text().replace(
            f"Host {self.host(dst).name}\n  HostName {self.host(dst).address}\n  Port {self.host(dst).port}\n"
            f"  User root\n  IdentityFile {self.client_key}\n",
            f"Host {self.host(dst).name}\n  HostName {self.host(dst).address}\n  Port {self.host(dst).port}\n"
            f"  User root\n  IdentityFile {stranger}\n")
        assert str(stranger) in text
        view = self.host(src).dir / "ssh_config.broken"
        view.write_text(text)
        self.restart(src, binds={str(self.ssh_config): str(view)})

    def cut_this_machine(self):
        """A context manager during which this machine's SSH to every host is dropped (own_route): packets to and
        from each host's route address and port go nowhere, as behind a firewall or with the laptop's Wi-Fi gone;
        connections already open stall (TCP retransmits) and carry on after it. The hosts still reach each other
        (their own addresses), and the fixture's ssh() still reaches every host. Needs root and `ip`
        (tests/dataplane.py, whose drop this is)."""
        import dataplane

        if not self.own_route:
            raise RuntimeError("cut_this_machine needs a cluster made with own_route=True")
        return dataplane.DataPlaneDrop([(h.route_address, h.port) for h in self.hosts])

    def this_machines_processes(self, cwd: Path) -> list[int]:
        """What this machine runs for the cluster, never what a host runs: the processes in this process's mount
        namespace (each host has its own: private roots) working in `cwd` or below (clusterctl, and what it
        started there) or naming this cluster's directory on their command line (ssh, rsync, master connections)."""
        ours = os.readlink("/proc/self/ns/mnt")
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") != ours:
                    continue
                where = os.readlink(f"/proc/{entry}/cwd")
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read()
            except OSError:
                continue
            if where == str(cwd) or where.startswith(f"{cwd}/") or str(self.root).encode() in argv:
                found.append(int(entry))
        return found

    def mount_over(self, index: int, target: str, source: str) -> None:
        """On this host only, `target` shows the contents of `source` (same path, different files)."""
        self.restart(index, binds={target: source})

    def path_without(self, *tools: str) -> str:
        """A PATH with everything of the default session PATH except `tools` (a directory of symlinks)."""
        target = self.root / ("path-without-" + "-".join(tools))
        if not target.exists():
            target.mkdir()
            for directory in DEFAULT_SESSION_PATH.split(":"):
                if not os.path.isdir(directory):
                    continue
                for name in os.listdir(directory):
                    link = target / name
                    if name in tools or link.exists() or link.is_symlink():
                        continue
                    link.symlink_to(os.path.join(directory, name))
        return str(target)

    # ---- inspection, with the real OpenSSH client --------------------------------------------
    def client_env(self) -> dict[str, str]:
        """The environment to run clusterctl in: in inventory_only mode a HOME with nothing in it (no
        ~/.ssh/config, no known_hosts, no cache), so only the inventory can say how to connect."""
        env = dict(os.environ)
        if self.inventory_only:
            env["HOME"] = str(self.client_home)
            env.pop("XDG_CACHE_HOME", None)
        return env

    def ssh(self, index: int, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`command` on host `index` with the real ssh client (with own_route: as the hosts reach it, which
        cut_this_machine leaves alone)."""
        config = self.hosts_ssh_config if self.own_route else self.ssh_config
        return subprocess.run([SSH, "-F", str(config), self.host(index).name, command],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def session_pids(self, index: int) -> list[int]:
        """PIDs running under host `index`'s sshd (its sessions and whatever they started)."""
        return descendants(self.host(index).pid)

    def log(self, index: int) -> str:
        return (self.host(index).dir / "sshd.log").read_text()

    # ---- teardown -----------------------------------------------------------------------------
    def stop_all(self) -> None:
        for host in self.hosts:
            if host.proc is not None:
                try:
                    self.thaw(host.index)
                except ProcessLookupError:
                    pass
                self.stop_host(host.index)
        self._sweep_strays()
        for host in self.hosts:
            harvest_mlx_kernels(host.dir / "tmp")
        if self.inventory_only:
            self._forget_host_keys()

    def _sweep_strays(self) -> None:
        """Kill what still runs in this cluster's directories once every sshd is gone: a process whose session
        ended before it (a test stopped mid-run) is no longer among any sshd's descendants. Only a safety net for
        the next tests' sake: the tests that check for leftovers do so before stopping the cluster."""
        root = str(self.root)
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd == root or cwd.startswith(root + "/") or cwd.startswith(str(self.host_root) + "/"):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _forget_host_keys(self) -> None:
        """In inventory_only mode the hosts' own OpenSSH records its peers in the login user's known_hosts
        (OpenSSH finds it through the password database, not HOME): remove what this cluster added there."""
        import pwd

        known = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"
        if not known.exists():
            return
        for h in self.hosts:
            subprocess.run([SSH_KEYGEN, "-R", f"[{h.address}]:{h.port}", "-f", str(known)], capture_output=True)
        Path(str(known) + ".old").unlink(missing_ok=True)


# ---- MLX's CPU kernels, compiled once per suite ------------------------------------------------------
# MLX's CPU backend compiles fused kernels with the system C++ compiler on first use and keeps the
# libraries under $TMPDIR/mlx/<version>/cpu (docs/facts/test-cluster.md#mlx-cpu-kernel-cache). Each test
# host has a $TMPDIR of its own, so every cluster would compile them again: two ranks on two cores spend
# 25-50 s in their first training step. A host is given the kernels earlier clusters compiled (as a real
# machine that has run MLX before has them), and what its ranks compiled is kept for the next cluster.
MLX_KERNELS = Path(tempfile.gettempdir()) / "clusterctl-tests-mlx-kernels"


# Ranks wait without spinning (tests/spinwait/README.md): MLX's ring backend waits for a peer by calling recv()/send()
# in a loop, which on a real cluster costs a machine nobody else uses and here takes the shared cores from the
# rank it waits for. The hosts' sessions preload a library that lets such a call sleep up to 1 ms in poll() first.
SPINWAIT_SOURCE = Path(__file__).resolve().parent / "spinwait" / "spinwait.c"


@functools.cache
def spinwait_library() -> str | None:
    """The compiled spinwait library (built once per source, shared by every worker), or None with no C compiler
    (tests/run.sh installs one): then ranks spin as they would without it, and the suite is only slower."""
    cc = shutil.which("cc") or shutil.which("gcc")
    source = SPINWAIT_SOURCE.read_bytes()
    built = Path(tempfile.gettempdir()) / f"clusterctl-tests-spinwait-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if not built.exists() and cc:
        partial = built.with_name(f"{built.name}.partial-{os.getpid()}")
        made = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SPINWAIT_SOURCE), "-ldl"],
                              capture_output=True, text=True)
        if made.returncode == 0:
            os.replace(partial, built)
        else:
            partial.unlink(missing_ok=True)
            print(f"tests: spinwait not built ({made.stderr.strip()[:200]}); ranks will spin", file=sys.stderr)
    return str(built) if built.exists() else None


def seed_mlx_kernels(host_tmp: Path) -> None:
    if MLX_KERNELS.is_dir():
        shutil.copytree(MLX_KERNELS, host_tmp / "mlx", dirs_exist_ok=True)


def harvest_mlx_kernels(host_tmp: Path) -> None:
    """Keep the whole shared libraries a host's ranks compiled (a rank killed while compiling leaves a
    truncated one: its ELF section table, written last, then lies past the end of the file)."""
    compiled = host_tmp / "mlx"
    for lib in compiled.glob("*/cpu/lib*.so"):
        kept = MLX_KERNELS / lib.relative_to(compiled)
        if kept.exists() or not _whole_elf(lib):
            continue
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f".partial-{os.getpid()}")      # MLX's names are near NAME_MAX already
        shutil.copyfile(lib, partial)
        os.replace(partial, kept)


def _whole_elf(path: Path) -> bool:
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if len(data) < 64 or data[:5] != b"\x7fELF\x02":      # 64-bit ELF
        return False
    order = "little" if data[5] == 1 else "big"
    section_table = int.from_bytes(data[40:48], order)
    entry_size, entries = int.from_bytes(data[58:60], order), int.from_bytes(data[60:62], order)
    return 0 < section_table and section_table + entry_size * entries <= len(data)


def _keygen(path: Path) -> None:
    if not path.exists():
        subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "clusterctl-test", "-f", str(path)],
                       check=True)


def _yaml_str(value: str) -> str:
    import json
    return json.dumps(value)
