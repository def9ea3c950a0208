"""setup network's pure parts (clusterctl/setup/topology.py, network.parse_gather, inventory_edit's host
settings) on the canned outputs of tests/fixtures/macos/thunderbolt/ (README there: where they come from)."""
import ipaddress
from pathlib import Path

import pytest

from clusterctl.errors import InventoryError
from clusterctl.hosts.facts import ibv_device_names
from clusterctl.inventory import Host, parse
from clusterctl.inventory_edit import set_host_setting, write_host_settings
from clusterctl.setup import topology as t
from clusterctl.setup.network import parse_gather

MACOS = Path(__file__).resolve().parents[1] / "fixtures" / "macos"
TB = MACOS / "thunderbolt"
RDMA = ibv_device_names((MACOS / "ibv_devices.mlx-issue-2944.txt").read_text().splitlines())


def report(topology: str, i: int, *, name: str | None = None, rdma: bool = False, **kw) -> t.MacReport:
    d = TB / topology
    return t.MacReport(name or f"mac{i}", t.parse_thunderbolt((d / f"mac{i}.system_profiler.json").read_text()),
                       t.parse_hardware_ports((d / f"mac{i}.networksetup.txt").read_text()),
                       (d / f"mac{i}.ifconfig.txt").read_text().splitlines(),
                       rdma_devices=RDMA if rdma else [], rdma_state="enabled" if rdma else "unknown",
                       ssh_ip=f"192.168.1.{100 + i}", **kw)


def ring3(**kw):
    return [report("ring3-tb4", i, **kw) for i in (1, 2, 3)]


def mesh4(**kw):
    return [report("mesh4-tb5", i, rdma=True, **kw) for i in (1, 2, 3, 4)]


def test_system_profiler_ports_name_the_peer_mac_by_its_domain_and_a_drive_is_not_a_mac():
    ports = t.parse_thunderbolt((TB / "ring3-tb4" / "mac1.system_profiler.json").read_text())
    assert [p.receptacle for p in ports] == ["1", "2", "3", "4"]
    assert [p.speed for p in ports] == ["40 Gb/s", "40 Gb/s", "40 Gb/s", "Up to 40 Gb/s"]
    assert ports[0].peer_domain and ports[0].peer_model == "Mac mini" and ports[0].other_device is None
    assert ports[2].peer_domain is None and ports[2].other_device == "Envoy Pro"
    assert ports[3].peer_domain is None and ports[3].other_device is None
    peer = t.parse_thunderbolt((TB / "ring3-tb4" / "mac2.system_profiler.json").read_text())
    assert ports[0].peer_domain == peer[1].domain and peer[1].peer_domain == ports[0].domain   # mac1 1 <-> mac2 2


@pytest.mark.parametrize("text, why", [("", "no JSON"), ("[]", "no SPThunderboltDataType"),
                                       ('{"SPUSBDataType": []}', "no SPThunderboltDataType")])
def test_what_is_not_system_profilers_json_is_refused(text, why):
    with pytest.raises(ValueError, match=why):
        t.parse_thunderbolt(text)


def test_networksetup_maps_thunderbolt_ports_to_interfaces():
    ports = t.parse_hardware_ports((TB / "mesh4-tb5" / "mac1.networksetup.txt").read_text())
    assert ports == {"Ethernet": "en0", "Thunderbolt Bridge": "bridge0", "Wi-Fi": "en1", "Thunderbolt 1": "en2",
                     "Thunderbolt 2": "en3", "Thunderbolt 3": "en4"}


def test_a_ring_of_three_gets_a_subnet_per_cable_and_each_address_faces_the_host_before_it():
    p = t.plan(ring3())
    assert p.backend == "ring" and "RDMA is not enabled" in p.why
    assert [(c.a, c.a_iface, c.b, c.b_iface) for c in p.topology.cables] == [
        ("mac1", "en2", "mac2", "en3"), ("mac1", "en3", "mac3", "en2"), ("mac2", "en2", "mac3", "en3")]
    assert [str(p.subnets[c][0].network) for c in p.topology.cables] == ["10.99.0.0/30", "10.99.1.0/30", "10.99.2.0/30"]
    assert p.topology.notes == ["mac1: Thunderbolt 3 holds Envoy Pro, not a Mac"]
    # rank i connects to rank i+1's address: mac1 -> mac2 at 10.99.0.2 (mac1's en2 is 10.99.0.1), and so on
    assert p.address == {"mac1": "10.99.1.1", "mac2": "10.99.0.2", "mac3": "10.99.2.2"}
    for i, name in enumerate(["mac1", "mac2", "mac3"]):
        after = ["mac1", "mac2", "mac3"][(i + 1) % 3]
        cable = p.topology.between(name, after)[0]
        assert str(p.end(cable, after).ip) == p.address[after]
    assert p.rdma is None
    assert p.commands["mac1"] == ["ifconfig bridge0 deletem en2", "ifconfig bridge0 deletem en3",
                                  "ifconfig en2 inet 10.99.0.1 netmask 255.255.255.252",
                                  "ifconfig en3 inet 10.99.1.1 netmask 255.255.255.252"]


def test_thunderbolt_4_links_with_rdma_devices_listed_still_get_the_ring():
    reports = ring3(rdma=True)
    assert t.choose_backend(t.topology(reports), reports, None) == \
        ("ring", "mac1-mac2 is not a Thunderbolt 5 link (40 Gb/s)")


def test_a_thunderbolt_5_mesh_with_rdma_gets_jaccl_rdma_lists_and_keeps_reachable_addresses():
    reports = mesh4(address=None)
    reports[0].address = "192.168.1.21"               # mac1's inventory address: on en0, every Mac reaches it
    p = t.plan(reports)
    assert p.backend == "jaccl" and len(p.topology.cables) == 6
    assert p.rdma == {"mac1": [None, "rdma_en2", "rdma_en3", "rdma_en4"],
                      "mac2": ["rdma_en2", None, "rdma_en3", "rdma_en4"],
                      "mac3": ["rdma_en4", "rdma_en2", None, "rdma_en3"],
                      "mac4": ["rdma_en3", "rdma_en2", "rdma_en4", None]}
    assert p.address == {"mac1": "192.168.1.21", "mac2": "192.168.1.102", "mac3": "192.168.1.103",
                         "mac4": "192.168.1.104"}
    assert t.plan(mesh4(), "ring").address["mac2"] == "10.99.0.2"


def test_jaccl_refusals_name_the_cause_and_the_fix():
    reports = mesh4()
    reports[1].slots = 2
    with pytest.raises(t.PlanError, match="jaccl runs one rank per Mac; mac2 has slots: 2: set slots: 1"):
        t.plan(reports)
    reports = mesh4()
    reports[2].rdma_devices = ["rdma_en2", "rdma_en3"]
    assert t.choose_backend(t.topology(reports), reports, None) == ("ring", "ibv_devices lists no mac3 rdma_en4")
    with pytest.raises(t.PlanError, match=r"mac3 has no RDMA device rdma_en4 for its cable to mac1 \(ibv_devices "
                                          r"lists rdma_en2, rdma_en3\): enable RDMA there"):
        t.plan(reports, "jaccl")
    reports = mesh4()
    reports[3].rdma_state = "disabled"
    assert t.choose_backend(t.topology(reports), reports, None)[1] == "RDMA is not enabled on mac4 (rdma_ctl status)"


def test_a_ring_listed_out_of_cable_order_names_the_order_the_cables_make():
    # mac1-mac2-mac3-mac4 cabled as a ring only (drop the diagonals mac1-mac3, mac2-mac4 from the mesh)
    reports = mesh4()
    top = t.topology(reports)
    keep = [c for c in top.cables if {c.a, c.b} not in ({"mac1", "mac3"}, {"mac2", "mac4"})]
    drop = {frozenset((c.a, c.b)) for c in top.cables} - {frozenset((c.a, c.b)) for c in keep}
    assert len(keep) == 4 and len(drop) == 2
    for r in reports:
        r.ports = [p for p in r.ports if not any(
            {r.name, other.name} in ({"mac1", "mac3"}, {"mac2", "mac4"}) and p.peer_domain in {q.domain for q in other.ports}
            for other in reports)]
    assert not t.topology(reports).full_mesh() and t.topology(reports).ring_in_order()
    swapped = [reports[0], reports[2], reports[1], reports[3]]            # listed mac1, mac3, mac2, mac4
    with pytest.raises(t.PlanError, match=r"no cable joins mac1 and mac3; the cables form the ring "
                                          r"mac1 -> mac2 -> mac3 -> mac4 -> mac1: list the hosts in that order"):
        t.plan(swapped)
    with pytest.raises(t.PlanError, match="jaccl needs a cable between every pair of Macs; none joins mac1 and mac3"):
        t.plan(reports, "jaccl")


def test_no_cable_at_all_and_a_mac_outside_the_inventory():
    reports = ring3()[:2]
    p = t.plan(reports)                              # mac1-mac2 cabled: a ring of two
    assert len(p.topology.cables) == 1 and p.address == {"mac1": "10.99.0.1", "mac2": "10.99.0.2"}
    assert "mac2: Thunderbolt 1 is cabled to a Mac that is not in the inventory (Mac mini)" in p.topology.notes
    for r in reports:
        r.ports = []
    with pytest.raises(t.PlanError, match="no Thunderbolt cable joins two of the inventory's Macs"):
        t.plan(reports)


def test_a_port_without_a_network_interface_is_noted_not_cabled():
    reports = ring3()
    del reports[1].hardware_ports["Thunderbolt 2"]
    top = t.topology(reports)
    assert len(top.cables) == 2
    assert "mac2: networksetup lists no interface for Thunderbolt 2 (its port is cabled, but no network " \
           "service uses it)" in top.notes


def test_addresses_already_on_the_cables_are_kept_and_taken_networks_are_skipped():
    reports = ring3()
    # mac1's Ethernet is in 10.99.0.0/24 already: the cables' subnets step over it
    reports[0].ifconfig = [line.replace("inet 192.168.1.10 netmask 0xffffff00", "inet 10.99.0.7 netmask 0xffffff00")
                           for line in reports[0].ifconfig]
    p = t.plan(reports)
    assert [str(p.subnets[c][0].network) for c in p.topology.cables] == ["10.99.1.0/30", "10.99.2.0/30", "10.99.3.0/30"]
    # a second run after --apply: the ends hold their addresses, nothing to run, the same plan
    for r in reports:
        lines = []
        for line in r.ifconfig:
            lines.append(line)
            for c in p.topology.cables:
                if r.name in (c.a, c.b) and line.startswith(f"{c.end(r.name)}:"):
                    e = p.end(c, r.name)
                    lines.append(f"\tinet {e.ip} netmask {hex(int(e.netmask))} broadcast {e.network.broadcast_address}")
        r.ifconfig = [line for line in lines if not line.strip().startswith("member:")]
    again = t.plan(reports)
    assert again.subnets == p.subnets and again.address == p.address
    assert again.commands == {"mac1": [], "mac2": [], "mac3": []}


def test_a_small_subnet_gives_consecutive_slash_30s_and_runs_out_clearly():
    p = t.plan(mesh4(), "ring", base="172.31.0.0/27")
    assert [str(v[0].network) for v in p.subnets.values()] == [f"172.31.0.{4 * k}/30" for k in range(6)]
    with pytest.raises(t.PlanError, match="172.31.0.0/29 has no free /30 left for 6 cable"):
        t.plan(mesh4(), "ring", base="172.31.0.0/29")


def test_dot_quotes_every_name():
    top = t.Topology(['a"b', "c\\d"], [t.Cable('a"b', "en2", "c\\d", "en3", "80 Gb/s")])
    text = t.dot(top)
    assert '"a\\"b" -- "c\\\\d" [label="en2 - en3\\n80 Gb/s"];' in text and text.startswith("graph thunderbolt {")


def test_gbps():
    assert [t.gbps(s) for s in ("80 Gb/s", "Up to 120 Gb/s", "40 Gb/s", None, "fast")] == [80, 120, 40, None, None]


def gathered_text(topology, i, *, os_name="Darwin", macos="26.2"):
    d = TB / topology
    return "\n".join([f"os {os_name}", "ssh_ip 192.168.1.50", "sudo no", f"macos {macos}", "rdma_ctl enabled",
                      "== system_profiler", (d / f"mac{i}.system_profiler.json").read_text(),
                      "== networksetup", (d / f"mac{i}.networksetup.txt").read_text(),
                      "== ifconfig", (d / f"mac{i}.ifconfig.txt").read_text(),
                      "== ibv_devices", (MACOS / "ibv_devices.tn3205.txt").read_text(), "== end"])


def test_network_sh_output_is_parsed_into_a_report():
    g = parse_gather(Host(name="m1", rank=0, line=1, address="10.0.0.1"), gathered_text("mesh4-tb5", 1))
    assert g.error is None and g.sudo is False and g.macos == "26.2"
    r = g.report
    assert r.ssh_ip == "192.168.1.50" and r.address == "10.0.0.1" and r.rdma_state == "enabled"
    assert r.rdma_devices == ["rdma_en2", "rdma_en3", "rdma_en4"] and len(r.ports) == 3
    assert r.bridged == ["en2", "en3", "en4"]
    old = parse_gather(Host(name="m1", rank=0, line=1), gathered_text("mesh4-tb5", 1, macos="15.5")).report
    assert old.rdma_state == "unknown"                # rdma_ctl means nothing before macOS 26.2
    linux = parse_gather(Host(name="l1", rank=0, line=1), "os Linux\nssh_ip 10.0.0.2\nsudo yes\n")
    assert linux.report is None and linux.error.startswith("runs Linux, not macOS")
    cut = parse_gather(Host(name="m1", rank=0, line=1), gathered_text("mesh4-tb5", 1).rsplit("== end", 1)[0])
    assert cut.error == "its report stopped short (network.sh did not finish)"
    hostile = gathered_text("mesh4-tb5", 1).replace("Device: en2", "Device: en2;reboot")
    assert "Thunderbolt 1" not in parse_gather(Host(name="m1", rank=0, line=1), hostile).report.hardware_ports


INVENTORY = """\
# my Macs
defaults:
  python: /usr/bin/python3
hosts:
  - name: a   # the first
    address: 192.168.1.2   # Ethernet
  - name: b
    env:
      X: "1"
  - {name: c}
  - name: d
    rdma: [null, x, y, z]
launch:
  backend: ring
"""


def test_host_settings_are_set_in_place_comments_kept():
    text = INVENTORY
    for host, key, value in [("a", "address", '"10.99.0.1"'), ("b", "address", '"10.99.0.2"'),
                             ("c", "address", '"10.99.0.3"'), ("d", "rdma", "[null, rdma_en2, rdma_en3, rdma_en4]"),
                             ("d", "address", '"10.99.0.4"')]:
        text = set_host_setting(text, host, key, value)
    assert text == """\
# my Macs
defaults:
  python: /usr/bin/python3
hosts:
  - name: a   # the first
    address: "10.99.0.1"   # Ethernet
  - name: b
    env:
      X: "1"
    address: "10.99.0.2"
  - {address: "10.99.0.3", name: c}
  - name: d
    rdma: [null, rdma_en2, rdma_en3, rdma_en4]
    address: "10.99.0.4"
launch:
  backend: ring
"""


def test_host_settings_that_cannot_be_edited_in_place_say_so():
    with pytest.raises(InventoryError, match="no host named z under hosts"):
        set_host_setting(INVENTORY, "z", "address", '"1.2.3.4"')
    block = INVENTORY.replace("    rdma: [null, x, y, z]\n", "    rdma:\n      - null\n      - x\n")
    with pytest.raises(InventoryError, match=r"inventory.yaml:12: cannot edit: host d's rdma is not written on one "
                                             r"line; set it by hand to \[null\]"):
        set_host_setting(block, "d", "rdma", "[null]")
    bare = "hosts:\n  - a\n  - b\n"
    with pytest.raises(InventoryError, match="host a is a bare name; write it as `- name: a`"):
        set_host_setting(bare, "a", "address", '"1.2.3.4"')


def test_write_host_settings_writes_once_and_only_what_changes(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY.replace("  - name: d\n    rdma: [null, x, y, z]\n", ""))
    done = write_host_settings(str(path), [("a", "address", '"192.168.1.2"'), ("b", "address", '"10.0.0.2"'),
                                           (None, "backend", "jaccl")])
    assert done == [("a", "address", '"192.168.1.2"'), ("b", "address", '"10.0.0.2"'), (None, "backend", "jaccl")]
    cluster = parse(path.read_text(), str(path))
    assert [h.address for h in cluster.hosts] == ["192.168.1.2", "10.0.0.2", None]
    assert cluster.launch.backend == "jaccl"
    before = path.read_text()
    assert write_host_settings(str(path), [("b", "address", '"10.0.0.2"')]) == []
    assert path.read_text() == before
    with pytest.raises(InventoryError):           # an rdma list the inventory refuses is never written
        write_host_settings(str(path), [("a", "rdma", "[rdma_en2]")])
    assert path.read_text() == before


def test_the_golden_inventories_parse():
    for name in ("ring3-tb4", "mesh4-tb5"):
        text = (TB / "golden" / f"{name}.yaml").read_text().replace("@PYTHON@", "/usr/bin/python3")
        text = text.replace("@WORKDIR@", "/tmp/w")
        for i in range(1, 5):
            text = text.replace(f"@ADDRESS{i}@", f"127.0.0.{i + 1}")
        cluster = parse(text.replace("ssh_config: ssh_config\n", ""), name)
        assert cluster.launch.backend == ("ring" if name.startswith("ring") else "jaccl")
        assert all(ipaddress.IPv4Address(h.address) for h in cluster.hosts)
