"""Host telemetry (`clusterctl top`): the probe's parsers (hosts/scripts/telemetry.py) on captured macOS and Linux
outputs (tests/fixtures/macos/README.md, tests/fixtures/linux/README.md), a whole sample read from the fake-Darwin
stand-ins, and the controller's model and flags (observe/telemetry.py)."""
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.hosts.connector import Connector
from clusterctl.hosts.scripts import program
from clusterctl.hosts.scripts import telemetry as probe
from clusterctl.inventory import load
from clusterctl.observe import telemetry
from clusterctl.observe.procs import PS_COMMAND

from sshcluster import telemetry_probes

FIXTURES = Path(__file__).parent.parent / "fixtures"
MACOS, LINUX = FIXTURES / "macos", FIXTURES / "linux"
FAKE_DARWIN = Path(__file__).parent.parent / "fakedarwin"
GiB = 1024 ** 3


def macos(name):
    return (MACOS / name).read_text()


def linux(name):
    return (LINUX / name).read_text()


# ---- macOS parsers -----------------------------------------------------------------------------------------------

def test_vm_stat_recorded_on_an_apple_silicon_mac():
    pages = probe.parse_vm_stat(macos("vm_stat.normal.txt"))
    assert pages["page size"] == 16384
    assert (pages["pages free"], pages["anonymous pages"], pages["pages occupied by compressor"]) == (652276, 640314, 96636)
    assert pages["translation faults"] == 8304623196 and pages["swapouts"] == 16
    # Activity Monitor's used: app (anonymous - purgeable) + wired + compressed
    assert probe.vm_stat_used(pages) == (640314 - 23079 + 134298 + 96636) * 16384
    swapping = probe.parse_vm_stat(macos("vm_stat.swapping.txt"))
    assert 0.95 < probe.vm_stat_used(swapping) / (32 * GiB) < 1.0 and swapping["swapouts"] == 1187342


def test_vm_stat_without_anonymous_pages_counts_active_ones():
    text = "Mach Virtual Memory Statistics: (page size of 4096 bytes)\nPages active: 100.\nPages wired down: 50.\n"
    assert probe.vm_stat_used(probe.parse_vm_stat(text)) == 150 * 4096
    assert probe.vm_stat_used(probe.parse_vm_stat("sh: vm_stat: not found")) is None


def test_memory_pressure_free_percentage():
    assert probe.parse_memory_pressure(macos("memory_pressure.normal.txt")) == (88, 34359738368)
    assert probe.parse_memory_pressure(macos("memory_pressure.swapping.txt")) == (9, 34359738368)
    assert probe.parse_memory_pressure("") == (None, None)


def test_sysctl_keys():
    normal = probe.parse_sysctl(macos("sysctl.normal.txt"))
    assert normal["hw.memsize"] == "34359738368" and normal["hw.ncpu"] == "10"
    assert probe.parse_loadavg_sysctl(normal["vm.loadavg"]) == 1.99
    assert probe.parse_swapusage(normal["vm.swapusage"]) == (int(25.5 * 1024 ** 2), 1024 * 1024 ** 2)
    assert probe.pressure_level(normal["kern.memorystatus_vm_pressure_level"]) == "normal"
    swapping = probe.parse_sysctl(macos("sysctl.swapping.txt"))
    assert probe.pressure_level(swapping["kern.memorystatus_vm_pressure_level"]) == "critical"
    assert probe.parse_swapusage(swapping["vm.swapusage"]) == (int(5873.25 * 1024 ** 2), 6 * GiB)
    assert [probe.pressure_level(v) for v in ("1", "2", "4", "3", "", None)] == ["normal", "warn", "critical", None, None, None]
    assert probe.parse_swapusage("total = 1.50G  used = 512.00K  free = 1.50G  (encrypted)") == (512 * 1024, int(1.5 * GiB))
    assert probe.parse_swapusage(None) == (None, None)


def test_ioreg_device_utilization():
    assert probe.parse_ioreg_accelerator(macos("ioreg-accelerator.normal.txt")) == 30
    two = '"PerformanceStatistics" = {"Device Utilization %"=4}\n"PerformanceStatistics" = {"Device Utilization %"=37}'
    assert probe.parse_ioreg_accelerator(two) == 37
    assert probe.parse_ioreg_accelerator('"Device Utilization % at cur p-state"=12') is None


@pytest.mark.parametrize("name,state,limit,warning", [
    ("pmset-g-therm.normal.txt", "nominal", None, None),                  # Apple silicon: three notes
    ("pmset-g-therm.intel-nominal.txt", "nominal", 100, None),
    ("pmset-g-therm.throttled.txt", "throttled", 28, "thermal warning level 2"),
    ("pmset-g-therm.warning-only.txt", "throttled", None, "thermal warning level 2"),
])
def test_pmset_therm(name, state, limit, warning):
    assert probe.parse_pmset_therm(macos(name)) == {"state": state, "speed_limit": limit, "warning": warning}


def test_pmset_therm_with_nothing_recognisable_is_unknown():
    assert probe.parse_pmset_therm("pmset: -g therm not supported")["state"] is None
    assert probe.parse_pmset_therm("Thermal Warning Level = 0\n")["state"] == "nominal"


# ---- Linux parsers -----------------------------------------------------------------------------------------------

def test_meminfo_and_pressure():
    normal = probe.parse_meminfo(linux("meminfo.normal.txt"))
    assert normal["MemTotal"] == 24683656 * 1024 and normal["Active(anon)"] == 9436 * 1024
    psi = probe.parse_psi(linux("pressure-memory.normal.txt"))
    assert psi == {"some": 0.0, "full": 0.0} and probe.linux_pressure(normal, psi) == "normal"
    swapping = probe.parse_meminfo(linux("meminfo.swapping.txt"))
    assert swapping["SwapTotal"] - swapping["SwapFree"] == (8388604 - 2204316) * 1024
    assert probe.linux_pressure(swapping, probe.parse_psi(linux("pressure-memory.swapping.txt"))) == "critical"
    assert probe.linux_pressure(swapping, {"some": 12.0, "full": 1.0}) == "warn"
    # no PSI (an older kernel): the share of memory available, 4.5% here
    assert probe.linux_pressure(swapping, {}) == "critical" and probe.linux_pressure(normal, {}) == "normal"
    assert probe.linux_pressure({}, {}) is None


def test_loadavg_vmstat_and_nvidia_smi():
    assert probe.parse_loadavg(linux("loadavg.normal.txt")) == 1.93
    assert probe.parse_loadavg("") is None
    assert probe.parse_vmstat_swapouts(linux("vmstat.swap-lines.normal.txt")) == 0
    assert probe.parse_vmstat_swapouts(linux("vmstat.swap-lines.swapping.txt")) == 1543012
    gpus = probe.parse_nvidia_smi(linux("nvidia-smi.query-gpu.txt"))
    assert gpus == [{"utilization": 87.0, "memory_used": 61234.0, "memory_total": 81559.0, "temperature": 71.0, "power": 412.35},
                    {"utilization": 12.0, "memory_used": 1024.0, "memory_total": 81559.0, "temperature": 45.0, "power": None}]
    assert probe.parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver") == []


def test_thermal_zones(tmp_path):
    assert probe.linux_thermal([]) == (None, None)
    assert probe.linux_thermal([(45.0, 95.0), (51.0, None)]) == ("nominal", 51.0)
    assert probe.linux_thermal([(97.0, 95.0)]) == ("throttled", 97.0)
    for zone, temp, trip in (("thermal_zone0", "97000", "95000"), ("thermal_zone1", "-274000", None)):
        (tmp_path / zone).mkdir()
        (tmp_path / zone / "temp").write_text(temp + "\n")
        if trip:
            (tmp_path / zone / "trip_point_0_type").write_text("passive\n")
            (tmp_path / zone / "trip_point_0_temp").write_text(trip + "\n")
    assert probe.thermal_zones(str(tmp_path)) == [(97.0, 95.0)]       # a zone with no sensor is left out


def test_run_lines_keep_a_runs_rows_short_with_their_marks():
    token = "clusterctl-run-20261127-173525-078bff"
    ps = (f"  101     1   00:31  0.0  1812 /bin/sh -c eval x; MLX_RANK=1 /venv/bin/python -c '#{token} {'x' * 5000}'\n"
          f"  102   101   00:31 91.9 141772 /venv/bin/python -c #{token} {'y' * 5000}\n"
          "continued line of 102\n"
          "  103     1   01:00  0.0  2000 /usr/sbin/sshd -D\n")
    kept = probe.run_lines(ps)
    assert len(kept) < 1000 and "sshd" not in kept
    rows = telemetry.run_processes("h", telemetry.parse_ps(kept))
    assert [(p.kind, p.rank, p.pid, p.rss_kb, p.run_id) for p in rows] == [
        ("shell", 1, 101, 1812, token[15:]), ("rank", 1, 102, 141772, token[15:])]


# ---- a whole sample, from the fake-Darwin stand-ins --------------------------------------------------------------

def fake_mac_env(state: Path) -> dict:
    return {**os.environ, "PATH": f"{FAKE_DARWIN / 'bin'}:{os.environ['PATH']}", "FAKE_DARWIN_STATE": str(state),
            "FAKE_DARWIN_FIXTURES": str(MACOS), "FAKE_DARWIN_OUTPUTS": str(FAKE_DARWIN / "outputs"),
            "FAKE_DARWIN_LOG": str(state / "refused.log")}


def run_probe(env, workdir):
    out = subprocess.run([sys.executable, "-c", program("telemetry.py"), str(workdir), *shlex.split(PS_COMMAND)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["errors"] == [], doc["errors"]
    return doc


def test_the_probe_reads_a_fake_mac_from_its_own_tools(tmp_path):
    env = fake_mac_env(tmp_path)
    doc = run_probe(env, tmp_path / "not-yet")            # a workdir not made yet: the disk it will be made on
    assert doc["os"] == "macos"
    assert doc["sources"] == {"cores": "sysctl hw.ncpu", "load": "sysctl vm.loadavg", "swap": "sysctl vm.swapusage",
                              "pressure": "sysctl kern.memorystatus_vm_pressure_level",
                              "memory": "vm_stat, sysctl hw.memsize", "memory_free_percent": "memory_pressure",
                              "gpu": "ioreg IOAccelerator", "thermal": "pmset -g therm", "disk": "statvfs", "ranks": "ps"}
    sample = telemetry.assess(telemetry.from_document("mac", doc, 0.0))
    assert (sample.memory_total, sample.cores, sample.load_1m, sample.gpu_percent, sample.pressure) == (
        34359738368, 10, 1.99, 30, "normal")
    assert sample.thermal == "nominal" and sample.flags == () and sample.disk_free > 0
    (tmp_path / "telemetry").write_text("swapping\n")
    swapping = telemetry.assess(telemetry.from_document("mac", run_probe(env, tmp_path), 1.0), sample)
    assert swapping.flags == ("swapping",) and swapping.why[0] == "memory pressure critical"
    assert swapping.memory_free_percent == 9 and swapping.swap_used > 5 * GiB
    (tmp_path / "telemetry").write_text("throttled\n")
    hot = telemetry.assess(telemetry.from_document("mac", run_probe(env, tmp_path), 2.0))
    assert hot.flags == ("throttled",) and hot.why == ("CPU speed limit 28%", "thermal warning level 2")
    assert not (tmp_path / "refused.log").exists()


# ---- the controller's model --------------------------------------------------------------------------------------

def ok(**figures):
    return telemetry.HostTelemetry("h1", taken=1.0, **figures)


def test_swap_growing_is_swapping_even_under_normal_pressure():
    before = ok(pressure="normal", swap_used=100 * 1024 ** 2, swapouts=10)
    assert telemetry.assess(ok(pressure="normal", swap_used=100 * 1024 ** 2, swapouts=10), before).flags == ()
    grown = telemetry.assess(ok(pressure="normal", swap_used=300 * 1024 ** 2, swapouts=10), before)
    assert grown.flags == ("swapping",) and grown.why == ("swap in use grew by 200 MiB",)
    paged = telemetry.assess(ok(pressure="normal", swap_used=100 * 1024 ** 2, swapouts=25), before)
    assert paged.why == ("15 pages swapped out",)
    assert telemetry.assess(ok(pressure="warn")).flags == ("swapping",)


def test_linux_zone_past_its_trip_point_is_throttled_and_an_unreachable_host_is_not_assessed():
    hot = telemetry.assess(ok(thermal="throttled", temperature_c=97.0))
    assert hot.flags == ("throttled",) and hot.why == ("thermal zone past its passive trip point (97 °C)",)
    down = telemetry.HostTelemetry("h2", "unreachable", "connection refused")
    assert telemetry.assess(down, ok()) == down


def test_a_probe_without_an_answer_is_an_error_line():
    got = telemetry.read_answer("h1", 1, "", "Traceback ...\nSyntaxError: invalid syntax\n", 5.0)
    assert (got.state, got.error) == ("error", "the probe gave no answer (exit 1): SyntaxError: invalid syntax")
    doc = {"os": "linux", "memory_used": 1, "ps": "", "sources": {"memory": "/proc/meminfo"}, "errors": []}
    got = telemetry.read_answer("h1", 0, json.dumps(doc) + "\n", "", 5.0)
    assert (got.state, got.os, got.memory_used, got.ranks) == ("ok", "linux", 1, ())
    assert json.loads(json.dumps(got.as_json()))["ranks_rss_kb"] == 0


# ---- watched: one probe per host, printing a sample every interval ------------------------------------------------

def until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not (got := predicate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_watched_one_probe_per_host_answers_every_interval_is_restarted_when_it_dies_and_close_leaves_none(tmp_path):
    workdir = tmp_path / "work"
    (tmp_path / "inventory.yaml").write_text(f"hosts:\n  - name: here\n    local: true\n    workdir: {workdir}\n")
    with telemetry.Telemetry(Connector(load(str(tmp_path / "inventory.yaml"))), every=0.3) as watched:
        [first] = watched.sample()
        assert first.state == "ok" and first.memory_total > 0, first
        [pid] = telemetry_probes(workdir)
        time.sleep(1.0)
        [second] = watched.sample()
        assert second.state == "ok" and second.taken > first.taken + 0.25     # a newer sample...
        assert telemetry_probes(workdir) == [pid]                                # ...from the same process
        shown = [hosts[0].taken for hosts, _ in zip(watched.every(0.3), range(3))]
        assert shown[0] < shown[1] < shown[2], shown        # every() waits for the probe's next: none shown twice

        os.kill(pid, signal.SIGKILL)
        ended = until(lambda: [h for h in watched.sample() if h.state != "ok"])
        assert ended and ended[0].state == "error" and ended[0].error.startswith("the probe ended (exit "), ended
        [again] = watched.sample()                                          # started anew
        assert again.state == "ok" and again.taken > second.taken
        assert len(telemetry_probes(workdir)) == 1 and telemetry_probes(workdir) != [pid]
    assert until(lambda: not telemetry_probes(workdir), 5.0), "a probe outlived close()"
