"""The README's Quickstart B, run as written against the loopback test cluster (tests/sshcluster.py).

The fenced block under "Quickstart B" is read from README.md and each line run as it stands, with only the
host placeholders (HOST1, HOST2) replaced by the test hosts' names: `init` writes the inventory, the editor
line is done by this test the way the README's step 2 says (workdir, each host's address, and how to reach
hosts that ~/.ssh/config does not), then setup mesh and setup python, doctor, run, runs, logs and plot. With no
help at all (inventory_only: hosts by address, a key with no default name, one non-default port), where only the
keys under `defaults:` say how to connect: the harder of step 2's two ways (the other, an ssh_config that names
the hosts, is how nearly every other SSH test here reaches its hosts, setup mesh and setup python included).

Each host starts as a new Mac would: its own empty ~/.ssh (a private directory mounted over root's, which sshd
reads authorized_keys from besides the test cluster's own file, and ssh its keys and known_hosts), so the hosts
cannot log in to each other until setup mesh; and no MLX where `python3` is, until setup python.
"""
import json
import os
import re
import shlex

import clirun
import pytest
from sshcluster import requires_private_roots

from clusterctl.inventory_edit import set_setting

pytestmark = pytest.mark.ssh

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
PLACEHOLDERS = ("HOST1", "HOST2")
RUN_ID = re.compile(r"run (\d{8}-\d{6}-[0-9a-f]{6})")


def quickstart_b() -> list[str]:
    """The command lines of the README's Quickstart B block, in order."""
    readme = open(README, encoding="utf-8").read()
    section = readme.split("\n## Quickstart B", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```", section, re.S | re.M).group(1)
    return [line for line in block.splitlines() if line.strip()]


def edit(text: str, cluster, hosts: list[str]) -> str:
    """Step 2 of the README, done to what `init` wrote (comments and order kept)."""
    text = set_setting(text, "defaults", "workdir", json.dumps(cluster.workdir))
    for name, host in zip(hosts, cluster.hosts):
        entry = f'  - name: "{name}"\n'
        assert entry in text, text
        text = text.replace(entry, f"{entry}    address: {host.address}\n")
    for key, value in (("user", "root"), ("port", str(cluster.hosts[0].port)),     # no ~/.ssh/config reaches
                       ("identity_file", json.dumps(str(cluster.client_key)))):      # these hosts: defaults: do
        text = set_setting(text, "defaults", key, value)
    return text


def test_quickstart_b_as_written_with_nothing_but_the_inventory(make_cluster, tmp_path):
    cluster = make_cluster(2, inventory_only=True)
    requires_private_roots(cluster, "each host its own ~/.ssh, as each Mac has")
    cluster.own_dot_ssh()
    hosts = [h.address for h in cluster.hosts]
    env = cluster.client_env()
    lines = quickstart_b()
    assert [shlex.split(line)[:2] for line in lines] == [
        ["clusterctl", "init"], ["$EDITOR", "inventory.yaml"], ["clusterctl", "setup"], ["clusterctl", "setup"],
        ["clusterctl", "doctor"], ["clusterctl", "run"],
        ["clusterctl", "runs"], ["clusterctl", "logs"], ["clusterctl", "plot"]], lines
    outputs = {}
    for line in lines:
        for placeholder, host in zip(PLACEHOLDERS, hosts):
            line = line.replace(placeholder, host)
        words = shlex.split(line, comments=True)
        if words[0] == "$EDITOR":
            inventory = tmp_path / words[1]
            inventory.write_text(edit(inventory.read_text(), cluster, hosts))
            continue
        r = clirun.clusterctl(*words[1:], cwd=tmp_path, env=env, timeout=600)
        assert r.returncode == 0, (line, r.stdout[-3000:], r.stderr[-3000:])
        outputs[" ".join(words[1:3]) if words[1] == "setup" else words[1]] = r
    assert "doctor's mesh check: 2 of 2 host pairs log in (all)" in outputs["setup mesh"].stdout
    venv = f"{cluster.workdir}/.clusterctl/venv/bin/python"
    assert f"python: {venv}" in (tmp_path / "inventory.yaml").read_text().replace('"', "")
    run_ids = RUN_ID.findall(outputs["run"].stdout + outputs["run"].stderr)
    assert run_ids, outputs["run"].stderr
    assert run_ids[-1] in outputs["runs"].stdout, outputs["runs"].stdout
    steps = outputs["run"].args[outputs["run"].args.index("--steps") + 1]      # the README's short first run
    assert re.search(rf"^\[rank 0 [^]]+\] step +{steps}/{steps} \| loss ", outputs["logs"].stdout, re.M), \
        outputs["logs"].stdout[-2000:]
    assert "loss" in outputs["plot"].stdout
