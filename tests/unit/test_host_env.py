"""Each host's own inventory `env` reaches its ranks: every launcher gives every rank one environment (the
first host's env), and the rank bootstrap applies its host's differences (clusterctl.launch.job.HOST_ENV)."""
import json
import os

from clusterctl.hosts.scripts import bootstrap
from clusterctl.inventory import parse
from clusterctl.launch.job import HOST_ENV, host_env_overrides, rank_environment
from clusterctl.launch.plan import LaunchPlan

INVENTORY = """\
defaults:
  env: {SHARED: "1", FIRST_ONLY_LATER: "d"}
hosts:
  - name: h1
    env: {ONLY_H1: "a"}
  - {name: h2, slots: 2, env: {SHARED: "2", CLUSTERCTL_TRAIN_SLOWDOWN: "2"}}
  - name: h3
"""


def test_the_ranks_of_a_host_whose_env_differs_get_the_difference():
    cluster = parse(INVENTORY, "inv.yaml")
    assert host_env_overrides(cluster) == {
        "1": {"SHARED": "2", "CLUSTERCTL_TRAIN_SLOWDOWN": "2", "ONLY_H1": None},
        "2": {"SHARED": "2", "CLUSTERCTL_TRAIN_SLOWDOWN": "2", "ONLY_H1": None},
        "3": {"ONLY_H1": None}}
    env = rank_environment(cluster, LaunchPlan.from_inventory(cluster), "20260101-000000-abcdef", "/tmp/r")
    assert env["SHARED"] == "1" and env["ONLY_H1"] == "a"            # the first host's, as every launcher gives
    assert json.loads(env[HOST_ENV]) == host_env_overrides(cluster)
    same = parse("defaults: {env: {A: '1'}}\nhosts: [h1, h2]\n", "inv.yaml")
    assert host_env_overrides(same) == {}
    assert HOST_ENV not in rank_environment(same, LaunchPlan.from_inventory(same), "x", "/tmp/r")


def test_values_of_a_hosts_own_reach_its_ranks_and_no_other_hosts():
    """run's per-host values (the model's path in each host's store): the first host's go to every rank as
    launched, each other host's ranks get theirs, and a host with none (this machine, reading the model where it
    is) has the first host's removed, not inherited."""
    cluster = parse(INVENTORY, "inv.yaml")
    own = {"h1": {"CLUSTERCTL_MODEL_DIR": "/s1/m"}, "h2": {"CLUSTERCTL_MODEL_DIR": "/s2/m"}}
    env = rank_environment(cluster, LaunchPlan.from_inventory(cluster), "20260101-000000-abcdef", "/tmp/r",
                           host_env=own)
    assert env["CLUSTERCTL_MODEL_DIR"] == "/s1/m"
    differ = json.loads(env[HOST_ENV])
    assert differ["1"]["CLUSTERCTL_MODEL_DIR"] == differ["2"]["CLUSTERCTL_MODEL_DIR"] == "/s2/m"
    assert differ["3"] == {"ONLY_H1": None, "CLUSTERCTL_MODEL_DIR": None}
    assert host_env_overrides(cluster, {"h1": {"X": "1"}, "h2": {"X": "1"}, "h3": {"X": "1"}}) == \
        host_env_overrides(cluster)                             # the same everywhere: nothing to override


def test_the_bootstrap_applies_its_ranks_entry_and_removes_the_variable(monkeypatch):
    monkeypatch.setenv("ONLY_H1", "a")
    monkeypatch.setenv("SHARED", "1")
    monkeypatch.setenv(HOST_ENV, json.dumps({"1": {"SHARED": "2", "ONLY_H1": None}}))
    bootstrap.host_env("1")
    assert os.environ["SHARED"] == "2" and "ONLY_H1" not in os.environ and HOST_ENV not in os.environ
    monkeypatch.setenv(HOST_ENV, json.dumps({"1": {"SHARED": "3"}}))
    bootstrap.host_env("0")                                          # rank 0: nothing of its own
    assert os.environ["SHARED"] == "2" and HOST_ENV not in os.environ
