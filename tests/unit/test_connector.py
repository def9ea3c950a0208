"""The Connector carries the connection settings (host-key policy, connect timeout) to everything that reaches
hosts, keeps them when narrowed to fewer hosts, and owns where the ranks' run directory is on a host."""
import os
import re

import pytest

from clusterctl.cli import app
from clusterctl.hosts import connector as connector_module
from clusterctl.hosts import openssh
from clusterctl.hosts.connector import Connector, ranks_run_dir
from clusterctl.hosts.ssh import SSHTransport
from clusterctl.hosts.sshconfig import SSHTarget
from clusterctl.hosts.local import LocalTransport
from clusterctl.hosts.transport import DEFAULT_CONNECT_TIMEOUT_S
from clusterctl.inventory import parse

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "..", "clusterctl")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))       # no ~/.ssh/config of the user's in the renderings
    (tmp_path / "home").mkdir()
    return parse("hosts: [{name: a, workdir: ~/work/}, {name: b, workdir: /srv/w}, {name: here, local: true}]\n",
                 str(tmp_path / "inv.yaml"))


def targets(cluster):
    """What `ssh -G` would say, made up: the tests never connect."""
    return {h.name: SSHTarget(h.name, f"{h.name}.lan", 22, "u", (), (), "accept-new") for h in cluster.hosts}


@pytest.fixture
def no_resolving(monkeypatch):
    """Fail the test if the Connector runs `ssh -G` for the hosts."""
    def resolve(cluster):
        raise AssertionError(f"resolved {cluster.names}")
    monkeypatch.setattr(connector_module, "resolve_cluster", resolve)


def test_the_settings_travel_to_every_ssh_transport_and_openssh_rendering(cluster, no_resolving):
    c = Connector(cluster, "strict", connect_timeout=7, targets=targets(cluster))
    t = c.transport(cluster.host("a"))
    assert isinstance(t, SSHTransport) and t.host_key_checking == "strict" and t.connect_timeout == 7
    assert isinstance(c.transport(cluster.host("here")), LocalTransport)
    assert c.ssh_options() == openssh.ssh_options(cluster, "strict", 7)
    rendered = open(c.ssh_options()[1]).read()
    assert "ConnectTimeout 7" in rendered and "StrictHostKeyChecking yes" in rendered
    mesh = c.host_config_text(cluster.host("b"))
    assert mesh == openssh.host_config_text(cluster, cluster.host("b"), "strict", 7) and "ConnectTimeout 7" in mesh
    assert c.deadline(30) == 7 + 30 + connector_module.DEADLINE_SLACK_S and c.deadline(30, slack=0) == 37


def test_defaults_are_the_one_connect_timeout_and_the_inventorys_host_key_policy(cluster, no_resolving):
    c = Connector(cluster, targets=targets(cluster))
    assert c.connect_timeout == DEFAULT_CONNECT_TIMEOUT_S and c.host_key_checking == cluster.host_key_checking
    assert f"ConnectTimeout {int(DEFAULT_CONNECT_TIMEOUT_S)}" in openssh.controller_config_text(cluster)


def test_narrowing_keeps_the_settings_and_the_hosts_already_resolved(cluster, no_resolving):
    whole = Connector(cluster, "strict", connect_timeout=4, targets=targets(cluster))
    part = whole.narrowed(cluster.subset(["b"]))
    assert part.cluster.names == ["b"] and part.cluster.hosts[0].rank == 0
    assert (part.host_key_checking, part.connect_timeout) == ("strict", 4)
    t = part.transport(part.cluster.hosts[0])              # no `ssh -G` again (no_resolving)
    assert t.target.hostname == "b.lan" and t.connect_timeout == 4 and t.host_key_checking == "strict"
    assert part.ssh_options() == openssh.ssh_options(part.cluster, "strict", 4)


def test_a_lazy_connector_resolves_once_when_a_host_is_first_reached(cluster, monkeypatch):
    calls = []

    def resolve(c):
        calls.append(c.names)
        return targets(c)
    monkeypatch.setattr(connector_module, "resolve_cluster", resolve)
    lazy = Connector(cluster, lazy=True)
    assert calls == []
    lazy.transport(cluster.host("here"))                   # this machine needs no resolving
    assert calls == []
    lazy.transport(cluster.host("a"))
    lazy.transport(cluster.host("b"))
    assert calls == [["a", "b", "here"]]
    lazy.narrowed(cluster.subset(["a"])).transport(cluster.host("a"))
    assert calls == [["a", "b", "here"]]
    Connector(cluster)                                     # made eagerly: resolved at once
    assert len(calls) == 2


def test_the_ranks_run_directory_is_spelled_by_the_connector(cluster, no_resolving):
    c = Connector(cluster, targets=targets(cluster))
    assert ranks_run_dir("20240101-000000-abc123") == "runs/20240101-000000-abc123"
    assert c.run_dir(cluster.host("a"), "r1") == "~/work/runs/r1"
    assert c.run_dir(cluster.host("b"), "r1") == "/srv/w/runs/r1"


def test_the_cli_builds_the_connector_from_its_options(cluster, monkeypatch):
    monkeypatch.setattr(connector_module, "resolve_cluster", targets)
    strict = app.connector(cluster, 3.0, strict_host_keys=True)
    assert (strict.host_key_checking, strict.connect_timeout) == ("strict", 3.0)
    assert app.connector(cluster).host_key_checking == cluster.host_key_checking
    assert app.connector(cluster).connect_timeout == DEFAULT_CONNECT_TIMEOUT_S


def package_sources():
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                yield os.path.relpath(path, PACKAGE), open(path, encoding="utf-8").read()


def test_one_default_connect_timeout_and_one_spelling_of_the_ranks_run_directory():
    defaults = [rel for rel, text in package_sources() if re.search(r"^\s*\w*CONNECT_TIMEOUT\w* = ", text, re.M)]
    # the hosts layer's default, and doctor's shorter one (named, with its reason)
    assert sorted(defaults) == ["doctor/options.py", "hosts/transport.py"]
    literal = [rel for rel, text in package_sources() if re.search(r"connect_timeout\s*[:=][^=\n]*\b\d+(\.\d+)?\b", text)]
    assert literal == []
    # only hosts/connector.py says where it is (RUNS_DIR, ranks_run_dir, Connector.run_dir); the launcher's own
    # files are in <workdir>/.clusterctl/runs/<id>, another directory
    spelled = [rel for rel, text in package_sources() if re.search(r"(?<!\.clusterctl)/runs/\{|[\"']runs/\{", text)]
    assert spelled == []
