"""`clusterctl top` on 3 test hosts, two fake Macs and a Linux box (tests/fakedarwin/README.md): every figure of every
host comes from that host's own tools (the Macs' vm_stat, memory_pressure, sysctl, ioreg and pmset stand-ins printing
tests/fixtures/macos/'s captured outputs; the Linux box's /proc), a Mac made to swap and another made to throttle
(their `telemetry` file names the canned outputs) are flagged, and an unreachable host is one line, not a traceback
(docs/observe.md#clusterctl-top)."""
import json
import subprocess
import sys
import time
from functools import partial

import clirun
import pytest
import test_fake_darwin
from sshcluster import telemetry_probes

pytestmark = pytest.mark.ssh
macs = test_fake_darwin.macs      # the fixture: 2 fake Macs and a Linux box, nothing refused by their stand-ins

clusterctl = partial(clirun.clusterctl, timeout=120, own_cache=True)
TOKEN = "clusterctl-run-20261127-000000-70b0b0"
MAC_SOURCES = {"memory": "vm_stat, sysctl hw.memsize", "memory_free_percent": "memory_pressure",
               "pressure": "sysctl kern.memorystatus_vm_pressure_level", "swap": "sysctl vm.swapusage",
               "load": "sysctl vm.loadavg", "cores": "sysctl hw.ncpu", "gpu": "ioreg IOAccelerator",
               "thermal": "pmset -g therm", "disk": "statvfs", "ranks": "ps"}
MAC_FIGURES = ["memory_used", "memory_total", "memory_free_percent", "pressure", "swap_used", "swap_total", "swapouts",
               "load_1m", "cores", "gpu_percent", "thermal", "disk_free", "disk_total"]
LINUX_FIGURES = ["memory_used", "memory_total", "pressure", "swap_used", "swap_total", "load_1m", "cores", "disk_free"]


@pytest.fixture
def rank():
    """A process carrying a run's token as a rank's python does (the hosts share this machine's processes)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", TOKEN])
    yield proc
    proc.kill()
    proc.wait()


def top_json(cluster, cwd):
    r = clusterctl("top", "--json", "--hosts", str(cluster.inventory), cwd=cwd)
    assert r.returncode == 0, r.stderr
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


def test_top_reads_each_host_from_its_own_tools_and_flags_swapping_and_heat(macs, rank, tmp_path):
    hosts = top_json(macs, tmp_path)
    assert list(hosts) == ["h1", "h2", "h3"]
    for name in ("h1", "h2"):
        mac = hosts[name]
        assert (mac["state"], mac["os"], mac["errors"], mac["sources"]) == ("ok", "macos", [], MAC_SOURCES), mac
        assert [f for f in MAC_FIGURES if mac[f] is None] == [], mac
        assert (mac["memory_total"], mac["cores"], mac["gpu_percent"], mac["pressure"], mac["thermal"]) == (
            34359738368, 10, 30, "normal", "nominal")
        assert mac["flags"] == [] and mac["workdir"] == macs.workdir
    linux = hosts["h3"]
    assert (linux["state"], linux["os"], linux["errors"]) == ("ok", "linux", [])
    assert [f for f in LINUX_FIGURES if linux[f] is None] == [] and linux["sources"]["memory"] == "/proc/meminfo"
    assert linux["sources"]["load"] == "/proc/loadavg" and linux["sources"]["cores"] == "os.cpu_count()"
    assert linux["flags"] == []
    for h in hosts.values():        # one machine's processes: every host's ps sees the fake rank
        assert [(r["run_id"], r["rss_kb"] > 0) for r in h["ranks"] if r["pid"] == rank.pid] == [(TOKEN[15:], True)]

    (macs.host(1).dir / "telemetry").write_text("swapping\n")
    (macs.host(2).dir / "telemetry").write_text("throttled\n")
    hosts = top_json(macs, tmp_path)
    assert (hosts["h1"]["flags"], hosts["h1"]["pressure"], hosts["h1"]["memory_free_percent"]) == (
        ["swapping"], "critical", 9)
    assert hosts["h1"]["why"] == ["memory pressure critical"]
    assert (hosts["h2"]["flags"], hosts["h2"]["speed_limit"], hosts["h2"]["why"]) == (
        ["throttled"], 28, ["CPU speed limit 28%", "thermal warning level 2"])
    assert hosts["h3"]["flags"] == []

    macs.stop_host(3)
    r = clusterctl("top", "--once", "--hosts", str(macs.inventory), cwd=tmp_path)
    rows = r.stdout.splitlines()
    assert r.returncode == 1 and rows[0].split()[:3] == ["HOST", "STATE", "MEMORY"] and len(rows) == 4, r.stdout
    assert [row.split()[:2] for row in rows[1:]] == [["h1", "ok"], ["h2", "ok"], ["h3", "unreachable"]]
    assert "memory pressure critical" in rows[1] and "CPU speed limit 28%" in rows[2]
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("[h3] unreachable: ") and "Traceback" not in r.stderr, r.stderr


def test_watching_starts_one_probe_per_host_and_a_killed_top_leaves_none(macs, tmp_path):
    """On a pipe, top reads each host's one probe (printing every --interval), not a Python per sample; killed with
    SIGKILL (nothing of it can clean up), its connections drop and each host's watchdog ends the probe."""
    proc = clirun.start("top", "--interval", "0.5", "--hosts", str(macs.inventory), cwd=tmp_path, own_cache=True)
    try:
        tables, probes, deadline = [], [], time.monotonic() + 60
        while len(tables) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("HOST "):
                tables.append([proc.stdout.readline().split()[:2] for _ in range(3)])
                probes.append(sorted(telemetry_probes(macs.workdir)))
        assert tables == [[["h1", "ok"], ["h2", "ok"], ["h3", "ok"]]] * 3, tables
        assert len(probes[0]) == 3 and probes == [probes[0]] * 3, probes      # the same three processes throughout
    finally:
        proc.kill()
        proc.wait()
    left = time.monotonic() + 15
    while telemetry_probes(macs.workdir) and time.monotonic() < left:
        time.sleep(0.1)
    assert telemetry_probes(macs.workdir) == [], "a probe outlived a killed top"
