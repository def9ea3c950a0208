"""Doctor's pure parts on canned outputs: probe parsing, the checks, the smoke judge, the report."""
import ipaddress
import json
import os
import shlex
import subprocess
import sys

from clusterctl.doctor import checks
from clusterctl.launch import dataplane
from clusterctl.doctor.report import CLUSTER, FAIL, PASS, WARN, Finding, Report, render_matrix, render_table
from clusterctl.doctor.smoke import judge
from clusterctl.hosts import facts as host_facts
from clusterctl.hosts.probe import DataplaneSpec, Facts, HostProbe, dataplane_command, parse_probe, probe_script
from clusterctl.hosts.transport import Result
from clusterctl.inventory import parse
from clusterctl.launch.backends import get
from clusterctl.launch.hostfile import render as render_hostfile

# A macOS Mac Studio's `ifconfig -a` (trimmed), with two Thunderbolt ports in bridge0.
MACOS_IFCONFIG = """\
lo0: flags=8049<UP,LOOPBACK,RUNNING,MULTICAST> mtu 16384
\tinet 127.0.0.1 netmask 0xff000000
en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\tether 3c:a6:f6:00:00:01
\tinet 10.0.1.23 netmask 0xffffff00 broadcast 10.0.1.255
en2: flags=8963<UP,BROADCAST,SMART,RUNNING,PROMISC,SIMPLEX,MULTICAST> mtu 1500
\tmedia: autoselect <full-duplex>
bridge0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\tinet 192.168.10.2 netmask 0xffffff00 broadcast 192.168.10.255
\tmember: en2 flags=3<LEARNING,DISCOVER>
\tmember: en3 flags=3<LEARNING,DISCOVER>
"""
LINUX_IP = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
4: eth0    inet 192.168.10.3/24 brd 192.168.10.255 scope global eth0\\       valid_lft forever
"""
OPENMPI_VERSION = "mpirun (Open MPI) 4.1.4  Report bugs to http://www.open-mpi.org/community/help/"
MPICH_VERSION = "HYDRA build details:     Version:                                 4.0.2"

CLUSTER4 = parse("hosts:\n" + "".join(f"  - {{name: h{i}, address: 192.168.10.{i}}}\n" for i in range(1, 5)),
                 "i.yaml")


def facts(**values) -> Facts:
    f = Facts(complete=True)
    for k, v in values.items():
        f.values[k] = v if isinstance(v, list) else [v]
    return f


def probe(i: int, cluster=CLUSTER4, **values) -> HostProbe:
    return HostProbe(cluster.hosts[i - 1], facts(**values))


def info(py="3.11.7", mlx="0.32.4"):
    return json.dumps({"python": py, "mlx": mlx, "distributed": True, "prefix": "/venv"})


def test_parse_probe_ignores_noise_and_collects_repeats():
    out = "\n".join([
        "Welcome to bash!  (a chatty .bashrc)",
        '{"key":"os","value":"Darwin"}',
        '{"key":"libmpi","value":"/opt/homebrew/lib/libmpi.dylib"}',
        '{"key":"libmpi","value":"/usr/local/lib/libmpi.dylib"}',
        '{"key":"mesh","peer":"h2","rc":255,"value":"Permission denied (publickey)."}',
        '{"key":"dataplane","bind":null,"connect":{}}',
        '{"key":"python_info","value":"Traceback ... {\\"python\\": \\"3.12.1\\"}"}',
        '{"key":"done","value":"1"}',
    ])
    f = parse_probe(out)
    assert f.get("os") == "Darwin" and f.all("libmpi") == ["/opt/homebrew/lib/libmpi.dylib", "/usr/local/lib/libmpi.dylib"]
    assert f.mesh == {"h2": (255, "Permission denied (publickey).")}
    assert f.dataplane == {"key": "dataplane", "bind": None, "connect": {}}
    assert f.python_info == {"python": "3.12.1"} and f.complete


def test_parse_probe_survives_wrong_types_and_deep_nesting():
    """Issue 25 item 5: a probe line of the wrong type raised out of the parser (a host's garbage)."""
    f = parse_probe("\n".join([
        '{"key":"mesh","peer":"h2","rc":"x","value":"?"}',
        '{"key":"mesh","peer":"h3","rc":[1],"value":"?"}',
        "{" + '"a":' * 1 + "[" * 50000,
        '{"key":"python_info","value":"[1, 2]"}',
        '{"key":"done","value":"1"}',
    ]))
    assert f.mesh == {"h2": (255, "?"), "h3": (255, "?")} and f.complete
    assert f.python_info == {"error": "[1, 2]"}


def test_probe_script_is_valid_sh_and_quotes_hostile_inventory_values():
    script = probe_script(python="~/envs/$(reboot)/bin/python", workdir="~/work dir/'x'", mpi_lib_dir="/a;b",
                          peers=["h2", "h3"], mesh_config="Host h2\n  Port 2222\n# it's $(reboot)\n",
                          ssh_config="/cfg dir/ssh_config")
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    assert "PY=\"$HOME\"/" + shlex.quote("envs/$(reboot)/bin/python") in script
    assert "LIBDIR='/a;b'" in script


def test_dataplane_probe_over_loopback_reports_each_peer(tmp_path):
    """Two real probes on 127.0.0.x talk to each other; a third peer that never listens is reported."""
    import sys

    port_a, port_b = _free_port("127.0.0.51"), _free_port("127.0.0.52")
    peers = (("a", "127.0.0.51", port_a), ("b", "127.0.0.52", port_b), ("ghost", "127.0.0.53", _free_port("127.0.0.53")))
    commands = [dataplane_command(sys.executable, DataplaneSpec(me, addr, port, 2.0,
                                                                tuple(p for p in peers if p[0] != me)))
                for me, addr, port in peers[:2]]
    procs = [subprocess.Popen(["sh", "-c", c], stdout=subprocess.PIPE, text=True) for c in commands]
    results = [parse_probe(p.communicate(timeout=20)[0]).dataplane for p in procs]
    assert results[0]["connect"]["b"]["ok"] and results[1]["connect"]["a"]["ok"]
    assert not results[0]["connect"]["ghost"]["ok"] and "refused" in results[0]["connect"]["ghost"]["error"]
    assert sorted(results[0]["accepted"]) == ["b"] and results[0]["bind"] is None


def _free_port(address):
    import socket
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def test_probe_script_without_peers_is_valid_sh():
    script = probe_script(python="python3", workdir="/w", mpi_lib_dir=None, peers=[], mesh_config=None,
                          ssh_config=None)
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0


def test_interfaces_from_macos_ifconfig_and_linux_ip():
    mac = host_facts.interfaces(MACOS_IFCONFIG.splitlines())
    assert ("bridge0", ipaddress.IPv4Interface("192.168.10.2/24")) in mac
    assert ("en0", ipaddress.IPv4Interface("10.0.1.23/24")) in mac
    linux = host_facts.interfaces(LINUX_IP.splitlines())
    assert linux == [("lo", ipaddress.IPv4Interface("127.0.0.1/8")), ("eth0", ipaddress.IPv4Interface("192.168.10.3/24"))]
    assert host_facts.bridge_members(MACOS_IFCONFIG.splitlines()) == ["en2", "en3"]


def test_shared_subnet_matches_by_subnet_not_interface_name():
    # h1 and h2 are Macs with the address on bridge0 / en5; h3, h4 Linux on eth0: one /24 for all
    cluster = CLUSTER4
    lines = {1: MACOS_IFCONFIG.replace("192.168.10.2", "192.168.10.1"), 2: MACOS_IFCONFIG.replace("bridge0", "en5"),
             3: LINUX_IP, 4: LINUX_IP.replace("192.168.10.3", "192.168.10.4")}
    probes = [probe(i, cluster, iface=lines[i].splitlines()) for i in range(1, 5)]
    assert host_facts.shared_subnet(probes) == ipaddress.IPv4Network("192.168.10.0/24")
    probes[3] = probe(4, cluster, iface=LINUX_IP.replace("192.168.10.3/24", "10.9.9.4/24").splitlines())
    assert host_facts.shared_subnet(probes) is None


def test_mesh_findings_name_the_pair_and_the_fix():
    p1 = probe(1)
    p1.facts.mesh = {"h2": (0, "clusterctl-mesh-ok"), "h3": (255, "root@h3: Permission denied (publickey)."),
                     "h4": (255, "ssh: Could not resolve hostname h4: Name or service not known")}
    dead = HostProbe(CLUSTER4.hosts[1], error="connection refused")
    rows = checks.ssh_mesh([p1, dead, probe(3), probe(4)])
    by_pair = {(f.host, f.peer): f for f in rows}
    assert by_pair[("h1", "h2")].status == PASS
    assert by_pair[("h1", "h3")].status == FAIL and "ssh-copy-id h3" in by_pair[("h1", "h3")].fix
    assert "cannot resolve h4" in by_pair[("h1", "h4")].fix
    assert not any(f.host == "h2" for f in rows)      # an unreachable host is not probed from
    assert by_pair[("h3", "h1")].status == FAIL       # no result reported for a pair is a failure


def test_parity_names_the_odd_host():
    probes = [probe(i, python_info=info(mlx="0.32.3" if i == 3 else "0.32.4"), mpirun_version=OPENMPI_VERSION)
              for i in range(1, 5)]
    rows = checks.parity(probes)
    odd = [f for f in rows if f.status == FAIL]
    assert len(odd) == 1 and odd[0].host == "h3" and odd[0].check == "parity"
    assert odd[0].detail == "mlx 0.32.3 here, 0.32.4 on h1, h2, h4"
    assert {f.detail for f in rows if f.status == PASS} == {"python 3.11.7 on all 4 hosts",
                                                             "mpi Open MPI 4.1.4 on all 4 hosts"}


def test_parity_tie_is_broken_by_rank_order():
    cluster = parse("hosts: [a, b]\n", "i.yaml")
    rows = checks.parity([probe(1, cluster, python_info=info(py="3.12.1")), probe(2, cluster, python_info=info())])
    assert [(f.host, f.status) for f in rows if f.status != PASS] == [("b", FAIL)]


def test_mlx_lm_is_checked_on_every_host_when_this_machine_has_it():
    """Issue 45: fine-tuning and serve need mlx-lm, at one version, on every host; doctor never looked."""
    with_lm = json.dumps({**json.loads(info()), "mlx_lm": "0.32.2"})
    have, lack = probe(1, python_info=with_lm), probe(2, python_info=info())
    assert checks.mlx_lm(have, None) == checks.mlx_lm(lack, None) == []       # this machine has none: no opinion
    assert checks.mlx_lm(have, "0.32.2") == [Finding("mlx-lm", "h1", PASS, "mlx-lm 0.32.2")]
    missing, = checks.mlx_lm(lack, "0.32.2")
    assert (missing.status, missing.detail) == (FAIL, "mlx-lm is not installed in python3 (this machine has 0.32.2)")
    assert missing.fix == ("clusterctl setup python --with lm installs this machine's mlx-lm 0.32.2 on every host, "
                           "or on this one: python3 -m pip install mlx-lm==0.32.2")
    assert checks.mlx_lm(probe(3, python_info=json.dumps({"error": "no python"})), "0.32.2") == []   # python's finding


def test_mlx_lm_parity_names_the_odd_host_and_the_command():
    def lm(version):
        return json.dumps({**json.loads(info()), "mlx_lm": version})

    probes = [probe(1, python_info=lm("0.32.2")), probe(2, python_info=lm("0.31.0")),
              probe(3, python_info=lm("0.32.2")), probe(4, python_info=info())]     # h4 has none: mlx_lm's finding
    odd = [f for f in checks.parity(probes, "0.32.2") if f.status == FAIL]
    assert [(f.host, f.detail) for f in odd] == [("h2", "mlx-lm 0.31.0 here, 0.32.2 on h1, h3")]
    assert odd[0].fix == "clusterctl setup python --with lm installs this machine's mlx-lm 0.32.2 on every host"
    assert "mlx-lm" not in " ".join(f.detail for f in checks.parity(probes))    # this machine has none: not compared
    same = [probe(i, python_info=lm("0.32.2")) for i in (1, 2)]
    assert "mlx-lm 0.32.2 on all 2 hosts" in [f.detail for f in checks.parity(same, "0.32.2")]


def test_software_checks_on_the_non_interactive_path():
    no_mpirun = checks.host_software(probe(2, python_path="/venv/bin/python", python_info=info(), rsync="",
                                           path="/usr/bin:/bin"), backend="mpi")
    by = {f.check: f for f in no_mpirun}
    assert by["mpirun"].status == FAIL and "/usr/bin:/bin" in by["mpirun"].detail and by["mpirun"].host == "h2"
    assert by["rsync"].status == WARN
    mpich = checks.host_software(probe(1, python_path="/p", python_info=info(), mpirun="/usr/bin/mpirun",
                                       mpirun_version=MPICH_VERSION), backend="mpi")
    assert {f.check: f for f in mpich}["mpirun"].status == FAIL and "MPICH" in mpich[2].detail
    pypi = checks.host_software(probe(1, python_path="/p", python_info=info(), mpirun="/venv/bin/mpirun",
                                      mpirun_real="/venv/bin/mpirun",
                                      mpirun_version="mpirun (Open MPI) 5.0.11"), backend="mpi")
    assert {f.check: f for f in pypi}["mpirun"].status == WARN and "PyPI" in {f.check: f for f in pypi}["mpirun"].detail
    broken = checks.host_software(probe(1, python_path="/p", python_info=json.dumps(
        {"python": "3.11.7", "mlx_error": "ModuleNotFoundError: No module named 'mlx'"})), backend="ring")
    assert {f.check: f for f in broken}["mlx"].status == FAIL
    assert {f.check: f for f in broken}["mpirun"].status == WARN       # ring does not need mpirun


def test_libmpi_env_is_the_dyld_fallback_path_on_macos_and_ld_on_linux():
    # DYLD_LIBRARY_PATH would make every library resolve in Homebrew's lib first (its libssl into a conda
    # python): the fallback path is searched only when a library is not found where it was linked
    assert host_facts.libmpi_env("Darwin", "/opt/homebrew/lib/libmpi.dylib") == {
        "DYLD_FALLBACK_LIBRARY_PATH": "/opt/homebrew/lib", "MLX_MPI_LIBNAME": "/opt/homebrew/lib/libmpi.dylib"}
    assert host_facts.libmpi_env("Linux", "/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so")["LD_LIBRARY_PATH"] == \
        "/usr/lib/x86_64-linux-gnu/openmpi/lib"
    assert checks.libmpi(probe(1, os="Linux"), "mpi")[0].status == FAIL


def test_disk_clock_and_macos():
    low = checks.disk(probe(1, disk="/dev/disk3s5 1000000 900000 100000 90% /System/Volumes/Data"))
    assert low[0].status == FAIL and "0.1 GiB" in low[0].detail
    p = probe(1, time="1000")
    p.sent_at, p.received_at = 1009.0, 1009.5
    assert checks.clock(p)[0].status == WARN and "-8s" in checks.clock(p)[0].detail   # date +%s truncates: 1 s of doubt
    p.sent_at, p.received_at = 1000.2, 1000.4
    assert checks.clock(p)[0].status == PASS
    ring = parse("hosts: [{name: m, address: 192.168.10.2}, {name: n, address: 192.168.10.3}]\n"
                 "launch: {backend: ring}\n", "i.yaml")
    mac = checks.macos(HostProbe(ring.hosts[0], facts(os="Darwin", sip="System Integrity Protection status: enabled.",
                                                      iface=MACOS_IFCONFIG.splitlines())), ring)
    assert any("bridge0 holds en2, en3" in f.detail for f in mac)
    assert any("Local Network" in f.detail for f in mac)
    assert checks.macos(HostProbe(ring.hosts[0], facts(os="Linux")), ring) == []


def test_sip_is_named_only_for_an_interpreter_it_protects():
    """SIP strips DYLD_* only from protected binaries: Xcode's /usr/bin/python3, or a shim run through
    /usr/bin/env; a venv or Homebrew python keeps them (docs/facts/macos.md#sip-strips-dyld)."""
    ring = parse("hosts: [{name: m, address: 192.168.10.2}]\n", "i.yaml")
    sip = "System Integrity Protection status: enabled."

    def sip_findings(**fact):
        found = checks.macos(HostProbe(ring.hosts[0], facts(os="Darwin", sip=sip, **fact)), ring)
        return [f.detail for f in found if "SIP" in f.detail]

    assert sip_findings(python_path="/opt/homebrew/bin/python3") == []
    assert sip_findings(python_path="/Users/me/venv/bin/python3") == []
    assert "is SIP-protected" in sip_findings(python_path="/usr/bin/python3")[0]
    shim = sip_findings(python_path="/Users/me/.pyenv/shims/python3", python_shebang="#!/usr/bin/env bash")
    assert "a script run through /usr/bin/env, which SIP protects" in shim[0]
    assert checks.sip_protected("/System/Library/Frameworks/Python.framework/python3", None) == "SIP-protected"


def test_a_workdir_sshd_may_not_write_is_named_with_the_full_disk_access_fix():
    """macOS privacy controls (TCC) keep sshd out of ~/Documents, ~/Desktop, iCloud and /Volumes."""
    mac = parse("hosts: [{name: m, workdir: /Users/me/Documents/proj}, {name: n, workdir: /Users/me/work}]\n",
                "i.yaml")
    denied = "mkdir: /Users/me/Documents/proj: Operation not permitted"
    [f] = checks.workdir_write(HostProbe(mac.hosts[0], facts(os="Darwin", home="/Users/me", workdir_write=denied)))
    assert f.status == FAIL and f.detail == f"cannot write in /Users/me/Documents/proj: {denied}"
    assert "Full Disk Access" in f.fix and "~/Documents" in f.fix
    [g] = checks.workdir_write(HostProbe(mac.hosts[1], facts(os="Darwin", home="/Users/me",
                                                             workdir_write="Permission denied")))
    assert g.status == FAIL and g.fix == "make /Users/me/work writable on n"
    [ok] = checks.workdir_write(HostProbe(mac.hosts[1], facts(os="Darwin", workdir_write="yes")))
    assert ok.status == PASS and checks.workdir_write(HostProbe(mac.hosts[1], facts(os="Darwin"))) == []


def test_dataplane_pairs_bind_failures_and_subnet():
    probes = []
    for i in range(1, 5):
        p = probe(i, iface=LINUX_IP.replace("192.168.10.3", f"192.168.10.{i}").splitlines())
        p.facts.dataplane = {"address": f"192.168.10.{i}", "port": 32322 + i, "bind": None, "accepted": [],
                             "connect": {f"h{j}": {"ok": True, "ms": 1.0} for j in range(1, 5) if j != i}}
        probes.append(p)
    probes[1].facts.dataplane["connect"]["h3"] = {"ok": False, "error": "[Errno 113] No route to host"}
    probes[2].facts.dataplane["bind"] = "[Errno 98] Address already in use"
    rows = checks.dataplane(probes, CLUSTER4)
    failing = [(f.host, f.peer) for f in rows if f.status == FAIL]
    assert failing == [("h2", "h3"), ("h3", None)]
    assert "192.168.10.3:32325: [Errno 113]" in next(f.detail for f in rows if f.peer == "h3" and f.host == "h2")
    assert [f.detail for f in rows if f.check == "subnet"] == [
        "all addresses are in 192.168.10.0/24; run will use --mca btl_tcp_if_include 192.168.10.0/24"]


def test_a_ring_checks_each_host_to_the_next_and_needs_no_shared_subnet():
    """A Thunderbolt ring (setup network): each host's address sits on the cable from the host before it, so only
    the next host can reach it, and that is all MLX's ring needs (docs/facts/macos.md#thunderbolt-addresses)."""
    ring = parse("hosts:\n" + "".join(f"  - {{name: h{i}, address: 10.99.{i - 1}.2}}\n" for i in range(1, 4))
                 + "launch: {backend: ring}\n", "i.yaml")
    assert dataplane.peers(ring) == {"h1": ["h2"], "h2": ["h3"], "h3": ["h1"]}
    assert dataplane.peers(CLUSTER4)["h2"] == ["h1", "h3", "h4"]          # mpi: every other host
    two = parse("hosts: [{name: a, address: 10.99.0.1}, {name: b, address: 10.99.0.2}]\nlaunch: {backend: ring}\n",
                "i.yaml")
    assert dataplane.peers(two) == {"a": ["b"], "b": ["a"]}
    probes = []
    for i in range(1, 4):
        p = probe(i, ring, iface=[f"2: en2    inet 10.99.{i - 1}.2/30 brd 10.99.{i - 1}.3 scope global en2"])
        p.facts.dataplane = {"address": f"10.99.{i - 1}.2", "port": 32322 + i, "bind": None, "accepted": [],
                             "connect": {f"h{i % 3 + 1}": {"ok": True, "ms": 0.2}}}
        probes.append(p)
    rows = checks.dataplane(probes, ring)
    assert [f.status for f in rows] == [PASS] * 4
    assert rows[-1].detail.startswith("the addresses are in several subnets: ring needs each host to reach the next")


def _smoke_out(*ranks):
    return "\n".join(json.dumps({"smoke": 1, **r}) for r in ranks)


def test_judge_smoke_output():
    ok = Result(0, _smoke_out(*({"rank": r, "size": 4, "sum": 10.0, "host": "vm"} for r in range(4))), "")
    assert judge("mpi-smoke", ok, None, 4, 1.0, "mpirun", get("mpi").smoke.fix(None)).status == PASS
    alone = Result(3, _smoke_out(*({"rank": 0, "size": 1, "sum": 1.0} for _ in range(4))), "")
    f = judge("mpi-smoke", alone, None, 4, 1.0, "mpirun", get("mpi").smoke.fix(None))
    assert f.status == FAIL and "world of size 1" in f.detail
    nolib = Result(1, _smoke_out({"rank": "0", "error": "RuntimeError: [mpi] Cannot initialize MPI"}), "")
    f = judge("mpi-smoke", nolib, None, 2, 1.0, "mpirun", get("mpi").smoke.fix("/opt/homebrew/lib/libmpi.dylib"))
    assert f.status == FAIL and "Cannot initialize MPI" in f.detail
    assert "mpi_lib_dir" in f.fix and "/opt/homebrew/lib/libmpi.dylib" in f.fix
    # two ranks' answers run into one line by mpirun, one of them cut short by a launcher's prefix
    merged = "[1,0]<stdout>:" + _smoke_out(*({"rank": r, "size": 4, "sum": 10.0, "host": "vm"} for r in range(4))
                                          ).replace("\n", "", 1) + "\n{\"smoke\": 1, \"rank\""
    assert judge("mpi-smoke", Result(0, merged, ""), None, 4, 1.0, "mpirun", get("mpi").smoke.fix(None)).status == PASS
    crashed = Result(1, "", "ORTE was unable to reliably start one or more daemons.\nmore")
    f = judge("mpi-smoke", crashed, None, 2, 1.0, "mpirun", get("mpi").smoke.fix(None))
    assert f.status == FAIL and "0/2 ranks" in f.detail and "ORTE was unable" in f.detail


def test_mlx_hostfile_and_ring_readiness():
    local = parse("hosts: [{name: localhost, local: true, slots: 2}]\n", "i.yaml")
    assert get("ring").smoke_ready(local)
    assert json.loads(render_hostfile(local, "mlx", backend="ring", env={"A": "1"})) == {
        "backend": "ring", "envs": ["A=1"], "hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2}
    assert get("ring").smoke_ready(CLUSTER4)
    assert not get("ring").smoke_ready(parse("hosts: [a, b]\n", "i.yaml"))
    assert json.loads(render_hostfile(CLUSTER4, "mlx"))["hosts"][2] == {"ssh": "h3", "ips": ["192.168.10.3"]}


def test_report_json_shape_table_and_matrix():
    findings = [Finding("ssh", "h1", PASS, "reached"), Finding("ssh", "h2", FAIL, "refused", "start sshd"),
                Finding("ssh-mesh", "h1", FAIL, "denied", "ssh-copy-id", peer="h2"),
                Finding("parity", CLUSTER, WARN, "w")]
    report = Report(["h1", "h2"], findings, 1.25)
    doc = json.loads(report.to_json())
    assert doc["ok"] is False and doc["hosts"] == ["h1", "h2"] and doc["elapsed_s"] == 1.25
    assert doc["checks"][2] == {"check": "ssh-mesh", "host": "h1", "peer": "h2", "status": "fail",
                                "detail": "denied", "fix": "ssh-copy-id"}
    text = render_table(report)
    assert text.splitlines()[-1] == "1 passed, 1 warnings, 2 failed (1.2s)"
    assert "fix: start sshd" in text and "\x1b[" not in text
    assert "\x1b[31m" in render_table(report, colour=True)
    matrix = render_matrix(["h1", "h2"], [findings[2]])
    assert matrix[1].split() == ["h1", "-", "FAIL"] and matrix[2].split() == ["h2", "?", "-"]


def test_ring_ports_follow_mlx_launch_one_per_address_and_connection():
    cluster = parse("hosts: [{name: a, slots: 2}, b, c]\n")
    assert [host_facts.ring_port(h) for h in cluster.hosts] == [32323, 32325, 32326]
    assert [host_facts.ring_port(h, 4) for h in cluster.hosts] == [32323, 32331, 32335]


def test_a_mesh_failure_on_what_the_inventory_sets_names_the_inventory_key():
    cluster = parse("hosts:\n  - {name: h1, mesh_identity_file: ~/.ssh/mesh}\n  - {name: h2, port: 2222}\n", "i.yaml")
    p1, p2 = probe(1, cluster), probe(2, cluster, mesh_config="could not write /w/.clusterctl/ssh_config")
    p1.facts.mesh = {"h2": (255, "ssh: connect to host h2 port 2222: Connection refused")}
    p2.facts.mesh = {"h1": (255, "root@h1: Permission denied (publickey).")}
    by = {(f.host, f.peer): f for f in checks.ssh_mesh([p1, p2])}
    assert "refused port 2222, which the inventory's `port:` sets (line 3)" in by[("h1", "h2")].fix
    assert "enable sshd" not in by[("h1", "h2")].fix
    assert "mesh_identity_file" in by[("h2", "h1")].fix      # h2 names no key: the fix says where one goes
    assert by[("h2", None)].status == FAIL and "could not write" in by[("h2", None)].detail
    p1.facts.mesh = {"h2": (255, "root@h2: Permission denied (publickey).")}
    assert "mesh_identity_file (~/.ssh/mesh, line 2)" in checks.ssh_mesh([p1, p2])[0].fix


def test_a_probe_that_ran_long_is_reported_slow_with_what_it_finished():
    p1 = probe(1, os="Linux")
    p1.overran_s = 35.0
    p1.facts.mesh = {"h2": (0, "clusterctl-mesh-ok")}                 # h3 and h4 still running when stopped
    rows = checks.probe_time(p1) + checks.ssh_mesh([p1, probe(2), probe(3), probe(4)])
    assert rows[0].check == "probe" and rows[0].status == WARN and "answered SSH" in rows[0].detail
    by_pair = {(f.host, f.peer): f for f in rows if f.check == "ssh-mesh"}
    assert by_pair[("h1", "h2")].status == PASS
    slow = by_pair[("h1", "h3")]
    assert slow.status == FAIL and "slow, not refused" in slow.detail and "--connect-timeout" in slow.fix
    assert "powered on" not in slow.fix and "Remote Login" not in slow.fix
    assert checks.probe_time(probe(2)) == []


def test_rsync_row_names_openrsync_and_rsync_2_6_9_by_their_first_version_line():
    """The probe sends `rsync --version | head -n 1`; macOS 15's openrsync prints `openrsync: protocol version
    29` there (tests/fixtures/rsync/), which the first three words made 'openrsync: protocol version'."""
    fixtures = os.path.join(os.path.dirname(__file__), "..", "fixtures", "rsync")

    def row(name):
        with open(os.path.join(fixtures, name)) as f:
            first = f.read().splitlines()[0]
        found = checks.host_software(probe(1, python_path="/p", python_info=info(), rsync="/usr/bin/rsync",
                                           rsync_version=first), backend="ring")
        return {f.check: f for f in found}["rsync"].detail

    assert row("version.openrsync.txt") == "openrsync (protocol 29) at /usr/bin/rsync"
    assert row("version.rsync-2.6.9.txt") == "rsync version 2.6.9 at /usr/bin/rsync"
    assert host_facts.rsync_label("rsync  version 3.2.7  protocol version 31") == "rsync version 3.2.7"


def test_a_missing_mlx_in_an_externally_managed_python_is_fixed_with_a_venv():
    """Homebrew's python (and Debian's) are marked EXTERNALLY-MANAGED (PEP 668): `pip install` into them is
    refused, so doctor suggests a venv and the inventory's `python:` pointing into it."""
    missing = {"python": "3.13.1", "mlx_error": "ModuleNotFoundError: No module named 'mlx'"}
    managed = checks.host_software(probe(1, os="Darwin", python_path="/opt/homebrew/bin/python3", python_info=json.dumps(
        {**missing, "externally_managed": True})), backend="ring")
    fix = {f.check: f for f in managed}["mlx"].fix
    assert "-m venv" in fix and "pip install mlx" in fix and "python:" in fix and "externally managed" in fix
    plain = checks.host_software(probe(1, os="Darwin", python_path="/venv/bin/python", python_info=json.dumps(missing)),
                                 backend="ring")
    assert {f.check: f for f in plain}["mlx"].fix.endswith("-m pip install mlx")


def test_python_info_reports_an_externally_managed_python():
    """Run with this machine's interpreters: a venv is never externally managed; Debian's /usr/bin/python3 is."""
    script = os.path.join(os.path.dirname(checks.__file__), "..", "hosts", "scripts", "python_info.py")
    venv = json.loads(subprocess.run([sys.executable, script], capture_output=True, text=True, check=True).stdout)
    assert venv["externally_managed"] is False
    from importlib.metadata import version             # and mlx-lm's version, read without importing it
    assert venv["mlx_lm"] == version("mlx-lm")
    system = "/usr/bin/python3"
    if not os.path.exists(system):
        return
    marked = subprocess.run([system, "-c", "import sysconfig, os; print(os.path.exists(os.path.join("
                             "sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"], capture_output=True, text=True)
    info = json.loads(subprocess.run([system, script], capture_output=True, text=True, check=True).stdout)
    assert info["externally_managed"] is (marked.stdout.strip() == "True")
