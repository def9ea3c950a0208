"""The one OpenSSH rendering of an inventory (clusterctl/hosts/openssh.py), checked as text and through the
real `ssh -G`: the inventory's values win, the user's own config supplies the rest."""
import os
import shutil
import stat

import pytest

from clusterctl.errors import InventoryError
from clusterctl.hosts import openssh
from clusterctl.hosts.sshconfig import resolve_cluster
from clusterctl.inventory import parse

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH client not installed")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))       # no ~/.ssh/config unless a test writes one
    (tmp_path / "home").mkdir()
    return tmp_path


def inventory(tmp_path, text):
    key = tmp_path / "cluster key"
    key.write_text("not really a key")
    return parse(text.replace("KEY", str(key)), str(tmp_path / "inv.yaml")), key


def test_the_controller_rendering_holds_what_the_inventory_sets_and_nothing_it_leaves_out(cache):
    cluster, key = inventory(cache, "defaults: {user: root, port: 2222, identity_file: KEY}\n"
                                    "hosts: [{name: 10.0.0.11}, {name: b, hostname: b.lan, port: 22}, "
                                    "{name: here, local: true}]\n")
    text = openssh.controller_config_text(cluster, connect_timeout=7)
    blocks = text.split("\n\n")
    assert blocks[1] == f'Host 10.0.0.11\n  Port 2222\n  User root\n  IdentityFile "{key}"\n  IdentitiesOnly yes'
    assert blocks[2].startswith("Host b\n  HostName b.lan\n  Port 22\n")
    assert "Host here" not in text                                       # this machine: no SSH at all
    assert "Host *\n  BatchMode yes\n  ConnectTimeout 7\n" in text
    includes = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("Include ")]
    assert includes == [p for p in ("/etc/ssh/ssh_config",) if os.path.isfile(p)]    # no ~/.ssh/config here
    # issue 25 item 4: the default comes after the user's config (OpenSSH keeps a setting's first value), so a
    # user's own StrictHostKeyChecking yes is kept; the inventory's strict comes before it and wins
    assert text.endswith("\nHost *\n  StrictHostKeyChecking accept-new\n") and text.count("StrictHostKeyChecking") == 1
    strict = openssh.controller_config_text(cluster, host_key_checking="strict")
    assert "  ConnectTimeout 10\n  StrictHostKeyChecking yes\n" in strict and "accept-new" not in strict


def test_the_host_rendering_names_peers_and_the_mesh_key_on_that_host(cache):
    cluster, _ = inventory(cache, "defaults: {port: 2222, identity_file: KEY, mesh_identity_file: ~/.ssh/mesh}\n"
                                  "hosts: [a, b, c]\n")
    text = openssh.host_config_text(cluster, cluster.hosts[0])
    assert "Host a\n  Port 2222\n  IdentityFile ~/.ssh/mesh\n" in text                 # itself too: mpirun there may
    assert "Host b\n  Port 2222\n  IdentityFile ~/.ssh/mesh\n  IdentitiesOnly yes" in text
    assert "cluster key" not in text                                     # the controller's key path means nothing there
    assert text.endswith("Include ~/.ssh/config\nInclude /etc/ssh/ssh_config\n\nHost *\n  StrictHostKeyChecking accept-new\n")
    assert openssh.host_config_path(cluster.hosts[1]) == "~/clusterctl/.clusterctl/ssh_config"


def test_the_rendering_is_written_once_per_content_privately(cache):
    cluster, _ = inventory(cache, "hosts: [a]\n")
    path = openssh.controller_config(cluster)
    assert openssh.controller_config(cluster) == path and open(path).read() == openssh.controller_config_text(cluster)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert openssh.controller_config(cluster, connect_timeout=3) != path          # other content, other file


def test_values_ssh_config_cannot_hold_are_refused(cache):
    with pytest.raises(InventoryError, match="pattern"):
        parse("hosts: ['web*']\n")
    cluster = parse('hosts: [{name: a, user: "x\\"y"}]\n', str(cache / "i.yaml"))
    with pytest.raises(InventoryError, match="cannot express"):
        openssh.controller_config_text(cluster)


@needs_ssh
def test_openssh_reads_it_the_inventory_wins_and_the_users_config_fills_in(cache):
    ssh_dir = cache / "home" / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "config").write_text("Host a b\n  User alice\n  Port 2200\nHost *\n  ServerAliveInterval 7\n")
    cluster, key = inventory(cache, "hosts: [{name: a, port: 2222, identity_file: KEY}, b]\n")
    targets = resolve_cluster(cluster)
    a, b = targets["a"], targets["b"]
    assert (a.port, a.user, a.identity_files[0]) == (2222, "alice", str(key))     # inventory port, user's user
    assert (b.port, b.user) == (2200, "alice")                                     # the inventory is silent on b
    assert a.config_file == b.config_file == openssh.controller_config(cluster)


def test_the_connection_sockets_live_in_a_private_short_directory(cache, monkeypatch):
    import tempfile

    runtime = tempfile.mkdtemp(dir="/tmp")                    # a short path, like /run/user/UID
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    directory = openssh.control_dir()
    assert directory == os.path.join(runtime, "clusterctl") and stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    cluster, _ = inventory(cache, "hosts: [a]\n")
    assert f"ControlPath {directory}/%C" in openssh.controller_config_text(cluster)
    assert "ControlPath" not in openssh.host_config_text(cluster, cluster.hosts[0])   # hosts keep no masters
    os.chmod(directory, 0o755)                                # someone opened it up: refuse, never use it
    with pytest.raises(InventoryError, match="not a private directory"):
        openssh.control_dir()
    shutil.rmtree(runtime)


def test_every_openssh_command_line_in_clusterctl_is_one_that_reads_the_rendering():
    """Each place that builds an `ssh ...` argv, found by reading the source: all of them pass `-F` and the
    rendering (or, closing masters, only a ControlPath). A new one fails here until it is made to."""
    import ast

    package = os.path.dirname(openssh.__file__).rsplit(os.sep, 1)[0]
    sites = set()
    for directory, _, files in os.walk(package):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            tree = ast.parse(open(path).read())
            for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
                for node in ast.walk(fn):
                    if isinstance(node, ast.List) and node.elts:
                        first = node.elts[0]
                        if (isinstance(first, ast.Constant) and first.value == "ssh") or \
                                (isinstance(first, ast.Name) and first.id == "ssh"):
                            sites.add((os.path.relpath(path, package), fn.name))
    assert sites == {
        ("hosts/sshconfig.py", "ssh_G_argv"),            # ssh -G -F <rendering>
        ("hosts/ssh.py", "_proxy_sock"),                 # ssh -F <rendering> -W (a ProxyJump)
        ("hosts/openssh.py", "close_masters"),           # ssh -G -F <rendering>; ssh -O exit on a socket
        ("hosts/openssh.py", "rsh_agent"),               # mpirun: ssh + ssh_options (-F <rendering>)
        ("transfer/rsync.py", "ssh_command"),            # rsync -e: ssh + ssh_options
        ("launch/backends/mlxlaunch.py", "ssh_shim"),    # mlx.launch: ssh + where.ssh_options
        ("hosts/sharedssh.py", "master_alive"),          # ssh + Connector.ssh_options (-F <rendering>) -O check
        ("hosts/sharedssh.py", "run_shared"),            # ssh + Connector.ssh_options: a command over the master
    }, sites
