"""doctor's jaccl check (docs/facts/macos.md#jaccl) on canned macOS outputs (tests/fixtures/macos/, where each
comes from is in its README): the parsers, the check, and the probe's own shell code run against stand-in
`uname`, `sw_vers`, `rdma_ctl` and `ibv_devices` that print those outputs."""
import ipaddress
import os
import stat
import subprocess

import pytest

from clusterctl.doctor import checks
from clusterctl.doctor.report import FAIL, PASS, WARN
from clusterctl.hosts.facts import bridge_members, ibv_device_names, interfaces, macos_version, rdma_state
from clusterctl.hosts.probe import Facts, HostProbe, parse_probe, probe_script
from clusterctl.inventory import load, parse
from clusterctl.inventory_load import load_cluster
from clusterctl.launch.backends import validated

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(TESTS, "fixtures", "macos")
GOLDEN = os.path.join(TESTS, "golden")

# Three Macs, pairwise cabled; studio-1 reaches studio-2 through rdma_en2 and studio-3 through rdma_en3.
JACCL = validated(parse("""\
hosts:
  - {name: studio-1, address: 192.168.10.1, rdma: [null, rdma_en2, rdma_en3]}
  - {name: studio-2, address: 192.168.10.2, rdma: [rdma_en2, null, rdma_en3]}
  - {name: studio-3, address: 192.168.10.3, rdma: [rdma_en2, rdma_en3, null]}
launch: {backend: jaccl}
""", "i.yaml"))
RING = load(os.path.join(GOLDEN, "inventory.yaml"))


def canned(name: str) -> str:
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def mac(version="sw_vers-productVersion.26.2.txt", status="rdma_ctl-status.enabled.txt",
        devices="ibv_devices.tn3205.txt", host=0, cluster=JACCL) -> HostProbe:
    f = Facts(complete=True)
    f.values = {"os": ["Darwin"], "path": ["/usr/bin:/bin"], "macos_version": [canned(version).strip()],
                "rdma_ctl": ["/usr/bin/rdma_ctl"], "rdma_status": [canned(status).strip()],
                "ibv_devices": ["/usr/bin/ibv_devices"], "ibv_line": canned(devices).splitlines()}
    return HostProbe(cluster.hosts[host], f)


def test_parsers_on_the_canned_outputs():
    assert rdma_state(canned("rdma_ctl-status.enabled.txt")) == "enabled"
    assert rdma_state(canned("rdma_ctl-status.disabled.txt")) == "disabled"
    assert rdma_state("RDMA is not enabled") == "disabled" and rdma_state("") == "unknown"
    assert rdma_state("zsh: command not found: rdma_ctl") == "unknown"
    three = ["rdma_en2", "rdma_en3", "rdma_en4"]
    assert ibv_device_names(canned("ibv_devices.tn3205.txt").splitlines()) == three
    assert ibv_device_names(canned("ibv_devices.mlx-issue-2944.txt").splitlines()) == three
    assert ibv_device_names(canned("ibv_devices.no-devices.txt").splitlines()) == []
    assert ibv_device_names(["No IB devices found"]) == []
    assert macos_version(canned("sw_vers-productVersion.26.2.txt")) == (26, 2)
    assert macos_version(canned("sw_vers-productVersion.15.6.1.txt")) == (15, 6, 1)
    assert macos_version("26") == (26,) and macos_version("") is None


def test_enabled_with_every_device_present_passes():
    (finding,) = checks.jaccl(mac(), JACCL)
    assert finding.status == PASS and finding.check == "jaccl"
    assert finding.detail == "macOS 26.2, RDMA enabled, rdma_en2, rdma_en3 present (of rdma_en2, rdma_en3, rdma_en4)"
    assert checks.jaccl(mac(version="sw_vers-productVersion.26.5.txt", devices="ibv_devices.mlx-issue-2944.txt"),
                        JACCL)[0].status == PASS


def test_rdma_disabled_fails_with_the_recovery_fix():
    found = checks.jaccl(mac(status="rdma_ctl-status.disabled.txt", devices="ibv_devices.no-devices.txt"), JACCL)
    assert [f.status for f in found] == [FAIL, FAIL]
    assert found[0].detail == "RDMA over Thunderbolt is off (rdma_ctl status: disabled)"
    assert found[0].fix == "enable RDMA: boot into Recovery, run `rdma_ctl enable` in its Terminal, restart"
    assert found[1].detail == "ibv_devices lists no RDMA device"


def test_enabled_but_no_devices_fails_naming_thunderbolt_5():
    (finding,) = checks.jaccl(mac(devices="ibv_devices.no-devices.txt"), JACCL)
    assert finding.status == FAIL and "although rdma_ctl says enabled" in finding.detail
    assert "Thunderbolt 5" in finding.fix


def test_a_device_the_inventory_names_but_the_mac_lacks_fails_naming_peer_and_line():
    cluster = load_cluster(os.path.join(GOLDEN, "inventory-jaccl.yaml"))
    (finding,) = checks.jaccl(mac(host=2, cluster=cluster), cluster)
    assert finding.status == PASS      # studio-3: rdma_en2, rdma_en3 (to studio-1), rdma_en4 (to studio-2)
    probe = mac(host=0, cluster=cluster)
    probe.facts.values["ibv_line"] = ["rdma_en2 e0c5797d9c8fac05", "rdma_en3 e1c5797d9c8fac05"]
    (finding,) = checks.jaccl(probe, cluster)
    assert finding.status == FAIL
    assert finding.detail == "rdma_en4 (to studio-3.local) not among this Mac's RDMA devices (rdma_en2, rdma_en3)"
    assert finding.fix.startswith("correct `rdma:` of studio-1.local (inventory line 9) to devices ibv_devices lists")


def test_macos_too_old_fails_before_asking_rdma_ctl():
    (finding,) = checks.jaccl(mac(version="sw_vers-productVersion.15.6.1.txt"), JACCL)
    assert finding.status == FAIL
    assert finding.detail == "macOS 15.6.1 here; jaccl needs macOS 26.2 or later (RDMA over Thunderbolt 5)"
    assert "Software Update" in finding.fix


def test_linux_host_fails_with_one_clear_line_and_other_backends_are_not_checked():
    probe = HostProbe(JACCL.hosts[1], Facts(values={"os": ["Linux"]}, complete=True))
    (finding,) = checks.jaccl(probe, JACCL)
    assert (finding.status, finding.host) == (FAIL, "studio-2")
    assert finding.detail == ("jaccl needs macOS 26.2+ with Thunderbolt 5 (RDMA); this host runs Linux: use "
                              "--backend ring or mpi")
    assert checks.jaccl(mac(cluster=RING), RING) == []
    assert checks.jaccl(HostProbe(JACCL.hosts[0]), JACCL) == []       # unreachable: the ssh check says so


def test_unknown_rdma_status_warns():
    probe = mac()
    probe.facts.values["rdma_status"] = ["Usage: rdma_ctl enable|disable|status"]
    found = checks.jaccl(probe, JACCL)
    assert found[0].status == WARN and "should print enabled" in found[0].fix


# ---- the probe's shell code, on stand-ins for the Mac's commands ------------------------------------------

STANDINS = {
    "uname": 'case "$1" in -s) echo Darwin;; -m) echo arm64;; *) echo 25.2.0;; esac',
    "sw_vers": 'cat "$FIX/sw_vers-productVersion.26.2.txt"',
    "csrutil": "echo 'System Integrity Protection status: enabled.'",
    "rdma_ctl": '[ "$1" = status ] && cat "$FIX/rdma_ctl-status.enabled.txt"',
    "ibv_devices": 'cat "$FIX/ibv_devices.mlx-issue-2944.txt"',
}


@pytest.mark.parametrize("shell", [["dash"], ["bash", "--posix"]])
def test_the_probe_reports_what_the_check_needs_on_a_mac(tmp_path, shell):
    """macOS runs the probe under /bin/sh (bash in POSIX mode); Debian's is dash: both must parse the same."""
    for name, body in STANDINS.items():
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    script = probe_script(python="python3", workdir=str(tmp_path / "w d"), mpi_lib_dir=None, peers=[],
                          mesh_config=None, ssh_config=None, full=False, rdma=True)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FIX": FIXTURES}
    out = subprocess.run([*shell, "-c", script], capture_output=True, text=True, env=env, timeout=30).stdout
    probe = HostProbe(JACCL.hosts[0], parse_probe(out))
    assert probe.facts.get("macos_version") == "26.2" and probe.facts.get("rdma_status") == "enabled"
    assert ibv_device_names(probe.facts.all("ibv_line")) == ["rdma_en2", "rdma_en3", "rdma_en4"]
    assert [f.status for f in checks.jaccl(probe, JACCL)] == [PASS]
    plain = probe_script(python="python3", workdir="/w", mpi_lib_dir=None, peers=[], mesh_config=None,
                         ssh_config=None, full=False)
    out = subprocess.run([*shell, "-c", plain], capture_output=True, text=True, env=env, timeout=30).stdout
    assert parse_probe(out).get("rdma_status") == "" and parse_probe(out).get("macos_version") == "26.2"


@pytest.mark.parametrize("shell", [["dash"], ["bash", "--posix"]])
def test_the_probe_lists_interfaces_with_ifconfig_on_a_mac_even_when_an_ip_command_exists(tmp_path, shell):
    """iproute2mac puts an `ip` on a Mac's PATH, whose listing has no bridge members: on Darwin the probe
    must use `ifconfig -a`, or doctor's bridge0 warning never fires (docs/facts/macos.md#ifconfig-not-ip-on-macos)."""
    standins = {**STANDINS,
                "ip": "echo '2: en0    inet 192.168.1.237/24 brd 192.168.1.255 en0'",
                "ifconfig": 'cat "$FIX/ifconfig-a.bridge0-en1-en2.txt"'}
    for name, body in standins.items():
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    script = probe_script(python="python3", workdir=str(tmp_path / "w"), mpi_lib_dir=None, peers=[],
                          mesh_config=None, ssh_config=None, full=False)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FIX": FIXTURES}
    out = subprocess.run([*shell, "-c", script], capture_output=True, text=True, env=env, timeout=30).stdout
    lines = parse_probe(out).all("iface")
    assert bridge_members(lines) == ["en1", "en2"]
    assert ("en0", ipaddress.IPv4Interface("192.168.1.237/24")) in interfaces(lines)
    # Linux keeps `ip` (the stand-in uname says Linux, and no ifconfig output appears)
    (tmp_path / "uname").write_text('#!/bin/sh\ncase "$1" in -s) echo Linux;; *) echo x;; esac\n')
    out = subprocess.run([*shell, "-c", script], capture_output=True, text=True, env=env, timeout=30).stdout
    assert parse_probe(out).all("iface") == ["2: en0    inet 192.168.1.237/24 brd 192.168.1.255 en0"]


def test_the_ifconfig_parser_finds_the_thunderbolt_ports_in_bridge0():
    with open(os.path.join(FIXTURES, "ifconfig-a.bridge0-en1-en2.txt")) as f:
        lines = f.read().splitlines()
    assert bridge_members(lines) == ["en1", "en2"]
    assert [n for n, _ in interfaces(lines)] == ["lo0", "en0"]
