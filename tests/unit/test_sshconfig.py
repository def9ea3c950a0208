import getpass
import os
import shutil

import pytest

from clusterctl.hosts.sshconfig import (
    DEFAULT_IDENTITIES,
    _resolve_with_paramiko,
    parse_ssh_G,
    resolve,
    ssh_G_argv,
    target_from_ssh_G,
)
from clusterctl.inventory import parse

# Recorded from `ssh -G -F cfg foo` (OpenSSH 9.2p1, Debian 12), trimmed to the keys we read plus neighbours.
CANNED_SSH_G = """\
User bob
hostname 10.1.2.3
port 2200
addressfamily any
batchmode no
identitiesonly no
stricthostkeychecking ask
identityfile ~/.ssh/foo_key
identityfile /keys/second
globalknownhostsfile /etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2
userknownhostsfile /root/.ssh/known_hosts /root/.ssh/known_hosts2
proxycommand none
connecttimeout none
"""


def test_parse_ssh_G_lowercases_keys_and_keeps_repeats():
    values = parse_ssh_G(CANNED_SSH_G)
    assert values["user"] == ["bob"] and values["port"] == ["2200"]
    assert values["identityfile"] == ["~/.ssh/foo_key", "/keys/second"]


def test_target_from_ssh_G_expands_paths_and_splits_known_hosts():
    t = target_from_ssh_G("foo", parse_ssh_G(CANNED_SSH_G), "/cfg")
    assert (t.alias, t.hostname, t.port, t.user) == ("foo", "10.1.2.3", 2200, "bob")
    assert t.identity_files == (os.path.expanduser("~/.ssh/foo_key"), "/keys/second")
    assert t.known_hosts_files == ("/root/.ssh/known_hosts", "/root/.ssh/known_hosts2")
    assert t.global_known_hosts_files == ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")   # read too
    assert t.proxy_command is None and t.strict_host_key_checking == "ask"


def test_ssh_G_argv_reads_the_rendering_only_and_ends_options():
    argv = ssh_G_argv("-oProxyCommand=x", "/c")
    assert argv == ["ssh", "-G", "-F", "/c", "--", "-oProxyCommand=x"]


CONFIG = """\
Host foo
  HostName 10.9.8.7
  Port 2200
  User bob
  IdentityFile {key}
Host *
  UserKnownHostsFile {kh}
"""


@pytest.fixture
def config(tmp_path):
    key = tmp_path / "foo_key"
    key.write_text("not really a key")
    path = tmp_path / "ssh_config"
    path.write_text(CONFIG.format(key=key, kh=tmp_path / "kh"))
    return path, key, tmp_path / "kh"


needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH client not installed")


@needs_ssh
def test_ssh_config_fills_what_the_inventory_leaves_unset(config):
    path, key, kh = config
    host = parse("hosts: [foo]\n", "i.yaml").hosts[0]
    t = resolve(host, str(path))
    assert (t.hostname, t.port, t.user) == ("10.9.8.7", 2200, "bob")
    assert t.identity_files == (str(key),)
    assert t.known_hosts_files == (str(kh),)


@needs_ssh
def test_inventory_values_win_over_ssh_config_like_ssh_command_line_flags(config, tmp_path):
    path, key, _ = config
    mine = tmp_path / "mine"
    mine.write_text("k")
    host = parse(f"hosts: [{{name: foo, user: carol, port: 2022, identity_file: {mine}}}]\n", "i.yaml").hosts[0]
    t = resolve(host, str(path))
    assert (t.hostname, t.port, t.user) == ("10.9.8.7", 2022, "carol")
    assert t.identity_files == (str(mine), str(key))   # -i first, then the config's, as OpenSSH tries them


@needs_ssh
def test_unconfigured_host_gets_openssh_defaults(tmp_path):
    empty = tmp_path / "empty_config"
    empty.write_text("")
    t = resolve(parse("hosts: [plain.example]\n", "i.yaml").hosts[0], str(empty))
    assert (t.hostname, t.port, t.user) == ("plain.example", 22, getpass.getuser())
    assert t.identity_files == tuple(os.path.expanduser(p) for p in DEFAULT_IDENTITIES)


@needs_ssh
def test_paramiko_fallback_agrees_with_openssh_on_a_plain_config(config):
    path, _, _ = config
    for text in ("hosts: [foo]\n", "hosts: [{name: foo, user: zed, port: 23}]\n", "hosts: [other]\n"):
        host = parse(text, "i.yaml").hosts[0]
        via_openssh = resolve(host, str(path))
        via_paramiko = _resolve_with_paramiko(host.name, host, str(path))
        for field in ("hostname", "port", "user", "identity_files", "known_hosts_files"):
            assert getattr(via_paramiko, field) == getattr(via_openssh, field), (text, field)


@needs_ssh
@pytest.mark.parametrize("users, inventory, expected", [
    ("StrictHostKeyChecking yes", "accept-new", "true"),     # the user's stricter setting is kept
    ("", "accept-new", "accept-new"),                        # clusterctl's default where the user says nothing
    ("StrictHostKeyChecking no", "strict", "true"),          # the inventory's strict wins over anything
])
def test_the_stricter_host_key_setting_reaches_openssh(tmp_path, users, inventory, expected):
    """Issue 25 item 4, through a real `ssh -G` of the rendering with the user's config included."""
    from clusterctl.hosts.openssh import controller_config_text

    user_config = tmp_path / "user_config"
    user_config.write_text(f"Host foo\n  {users}\n" if users else "")
    cluster = parse(f"ssh_config: {user_config}\nhost_key_checking: {inventory}\nhosts: [foo]\n", "i.yaml")
    rendering = tmp_path / "rendering"
    rendering.write_text(controller_config_text(cluster))
    t = resolve(cluster.hosts[0], rendered=str(rendering))
    assert t.strict_host_key_checking == expected
