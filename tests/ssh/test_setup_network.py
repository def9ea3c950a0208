"""`clusterctl setup network` on fake-Darwin hosts whose system_profiler, networksetup, ifconfig and ibv_devices
print canned outputs of two cabled topologies (tests/fixtures/macos/thunderbolt/README.md): a ring of 3 Mac minis
over Thunderbolt 4, a full mesh of 4 over Thunderbolt 5 with RDMA on.

--write turns the inventory into the golden one (tests/fixtures/macos/thunderbolt/golden/), comments kept, and a
second run changes nothing; --apply without passwordless sudo on every Mac fails in one line before any Mac is
touched; with it, each Mac gets exactly the printed commands (the ifconfig stand-in keeps them and shows them in
`ifconfig -a` from then on), and a second --apply has nothing to do.
"""
import json
import sys
from functools import partial
from pathlib import Path

import clirun
import pytest
from pictures import read, share_drawn
from sshcluster import requires_private_roots

pytestmark = pytest.mark.ssh

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "macos"
TB = FIXTURES / "thunderbolt"
clusterctl = partial(clirun.clusterctl, timeout=300, own_cache=True)

INVENTORY = """\
# three (or four) Macs on a desk; setup network fills in the data plane
ssh_config: ssh_config
defaults:
  python: "@PYTHON@"
  workdir: "@WORKDIR@"
hosts:
@HOSTS@
mpi:
  extra_args: [--mca, rtc_hwloc_vmhole, none]
"""


def cabled(make_cluster, topology: str, n: int, *, macos: str = "15.5", sudo: bool = False, rdma: bool = True):
    """n fake Macs printing topology's recordings (host i: mac<i>), and an inventory naming them."""
    requires_private_roots(why="a private /etc/passwd with zsh as the login shell, per fake Mac")
    cluster = make_cluster(n, darwin=set(range(1, n + 1)))
    for i in range(1, n + 1):
        env = cluster.host(i).session_env
        env.update({"FAKE_DARWIN_THUNDERBOLT": str(TB / topology / f"mac{i}.system_profiler.json"),
                    "FAKE_DARWIN_PORTS": str(TB / topology / f"mac{i}.networksetup.txt"),
                    "FAKE_DARWIN_IFCONFIG": str(TB / topology / f"mac{i}.ifconfig.txt"),
                    "FAKE_DARWIN_IBV": str(FIXTURES / ("ibv_devices.mlx-issue-2944.txt" if rdma
                                                       else "ibv_devices.no-devices.txt"))})
        if macos != "15.5":
            env["FAKE_DARWIN_SW_VERS"] = str(Path(__file__).resolve().parents[1] / "fakedarwin" / "outputs"
                                             / f"sw_vers-{macos}.txt")
        if sudo:
            env["FAKE_DARWIN_SUDO"] = "nopasswd"
        cluster.restart(i)
    hosts = "\n".join(f"  - name: h{i}{'   # the one by the window' if i == 1 else ''}\n    address: {h.address}"
                      for i, h in enumerate(cluster.hosts, 1))
    cluster.inventory.write_text(fill(INVENTORY, cluster, hosts))
    return cluster


def fill(text: str, cluster, hosts: str = "") -> str:
    text = text.replace("@PYTHON@", sys.executable)
    text = text.replace("@WORKDIR@", cluster.workdir).replace("@HOSTS@", hosts)
    for i, h in enumerate(cluster.hosts, 1):
        text = text.replace(f"@ADDRESS{i}@", h.address)
    return text


def changes(cluster, i: int) -> list[str]:
    path = cluster.host(i).dir / "ifconfig.changes"
    return path.read_text().splitlines() if path.exists() else []


def refused_nothing(cluster, n):
    for i in range(1, n + 1):
        assert cluster.refused(i) == [], f"h{i} refused: {cluster.refused(i)}"


def test_a_thunderbolt_4_ring_of_three_is_written_as_the_golden_inventory(make_cluster, tmp_path):
    """RDMA devices listed (macOS lists them for Thunderbolt 4 ports too) but 40 Gb/s links: ring, not jaccl."""
    cluster = cabled(make_cluster, "ring3-tb4", 3, macos="26.2")
    plan = clusterctl("setup", "network", "--hosts", str(cluster.inventory), "--png", "cables.png", cwd=tmp_path)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    image = read(tmp_path / "cables.png")                        # the plan drawn, nothing changed
    assert image.shape[:2] == (800, 1000) and share_drawn(image) > 0.04
    out = plan.stdout
    assert "Thunderbolt cables between 3 Macs (every pair cabled):" in out
    assert "h1 en2   <->   en3 h2    40 Gb/s   10.99.0.1 <-> 10.99.0.2  (10.99.0.0/30)" in out, out
    assert "note: h1: Thunderbolt 3 holds Envoy Pro, not a Mac" in out
    assert "backend: ring (h1-h2 is not a Thunderbolt 5 link (40 Gb/s))" in out and "ring: h1 -> h2 -> h3 -> h1" in out
    assert "  h1: sudo -n ifconfig bridge0 deletem en2" in out
    before = cluster.inventory.read_text()
    assert "10.99" not in before                                  # without --write the inventory is untouched

    w = clusterctl("setup", "network", "--write", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert w.returncode == 0, w.stdout + w.stderr
    assert cluster.inventory.read_text() == fill((TB / "golden" / "ring3-tb4.yaml").read_text(), cluster)
    again = clusterctl("setup", "network", "--write", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert again.returncode == 0 and "inventory:\n  nothing to change" in again.stdout, again.stdout
    assert cluster.inventory.read_text() == fill((TB / "golden" / "ring3-tb4.yaml").read_text(), cluster)
    dot = clusterctl("setup", "network", "--dot", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert dot.returncode == 0 and dot.stdout.startswith("graph thunderbolt {")
    assert '"h1" -- "h2" [label="en2 - en3\\n10.99.0.0/30\\n40 Gb/s"];' in dot.stdout, dot.stdout
    refused_nothing(cluster, 3)


def test_a_thunderbolt_5_mesh_of_four_with_rdma_is_written_for_jaccl(make_cluster, tmp_path):
    cluster = cabled(make_cluster, "mesh4-tb5", 4, macos="26.2")
    r = clusterctl("setup", "network", "--write", "--json", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "jaccl" and len(doc["cables"]) == 6, doc
    assert doc["rdma"]["h1"] == [None, "rdma_en2", "rdma_en3", "rdma_en4"]
    assert cluster.inventory.read_text() == fill((TB / "golden" / "mesh4-tb5.yaml").read_text(), cluster)
    # what clusterctl makes of it: the jaccl hostfile's rdma lists, checked at the inventory's lines
    hostfile = clusterctl("hostfile", "--format", "mlx", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert hostfile.returncode == 0, hostfile.stderr
    assert [h["rdma"] for h in json.loads(hostfile.stdout)["hosts"]][3] == ["rdma_en3", "rdma_en2", "rdma_en4", None]
    # the same Macs asked for a ring: no RDMA lists, each address on a cable
    ring = clusterctl("setup", "network", "--backend", "ring", "--json", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert ring.returncode == 0 and json.loads(ring.stdout)["address"]["h2"] == "10.99.0.2", ring.stdout
    refused_nothing(cluster, 4)


def test_apply_without_passwordless_sudo_changes_nothing_anywhere(make_cluster, tmp_path):
    cluster = cabled(make_cluster, "ring3-tb4", 3)
    cluster.host(1).session_env["FAKE_DARWIN_SUDO"] = "nopasswd"      # one Mac allows it, the others ask
    cluster.restart(1)
    r = clusterctl("setup", "network", "--apply", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "passwordless sudo" in errors[0] and "h2, h3" in errors[0], r.stderr
    assert "nothing was changed on any Mac" in errors[0]
    assert [changes(cluster, i) for i in (1, 2, 3)] == [[], [], []]
    assert "Traceback" not in r.stderr
    refused_nothing(cluster, 3)


def test_apply_with_sudo_runs_the_printed_commands_and_a_second_run_has_nothing_to_do(make_cluster, tmp_path):
    cluster = cabled(make_cluster, "ring3-tb4", 3, sudo=True)
    plan = json.loads(clusterctl("setup", "network", "--json", "--hosts", str(cluster.inventory), cwd=tmp_path).stdout)
    r = clusterctl("setup", "network", "--apply", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for i in (1, 2, 3):
        wanted = plan["commands"][f"h{i}"]
        assert [f"sudo -n ifconfig {c}" for c in changes(cluster, i)] == wanted, (changes(cluster, i), wanted)
        assert all(f"running h{i}: {c}" in r.stderr for c in wanted)
    assert "en2 inet 10.99.0.1 netmask 255.255.255.252" in changes(cluster, 1)
    again = clusterctl("setup", "network", "--apply", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert again.returncode == 0 and "the Macs: nothing to change" in again.stdout, again.stdout + again.stderr
    assert len(changes(cluster, 1)) == len(plan["commands"]["h1"])
    refused_nothing(cluster, 3)


def test_a_missing_cable_slots_for_jaccl_and_a_linux_host_are_each_one_line(make_cluster, tmp_path):
    cluster = cabled(make_cluster, "ring3-tb4", 3)
    cluster.host(3).session_env.pop("FAKE_DARWIN_THUNDERBOLT")        # h3's cables pulled out
    cluster.restart(3)
    r = clusterctl("setup", "network", "--write", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr.strip() == ("setup network: the cables form no ring through all 3 Macs (none joins h2 and h3): "
                                "cable each Mac to the next in inventory order and the last to the first "
                                "(--dot draws them)"), r.stderr
    assert "10.99" not in cluster.inventory.read_text()
    text = cluster.inventory.read_text().replace("  - name: h2\n", "  - name: h2\n    slots: 2\n")
    cluster.inventory.write_text(text)
    r = clusterctl("setup", "network", "--backend", "jaccl", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "jaccl needs a cable between every pair of Macs; none joins h1 and h3" in r.stderr
    refused_nothing(cluster, 3)

    mixed = make_cluster(2, darwin={1})
    mixed.write_inventory()
    r = clusterctl("setup", "network", "--hosts", str(mixed.inventory), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("h2: failed: runs Linux, not macOS: setup network configures Macs' Thunderbolt ports")
