"""doctor's power check (docs/facts/macos.md#pmset-sleep-settings) on canned `pmset -g custom` and `pmset -g batt`
outputs (tests/fixtures/macos/, where each comes from is in its README): the parsers, the check, and the
probe's own shell code run with the fake-Darwin stand-ins (tests/fakedarwin/bin) printing those outputs."""
import os
import subprocess

import pytest

from clusterctl.doctor import checks
from clusterctl.doctor.report import PASS, WARN
from clusterctl.hosts.facts import pmset_settings, power_source
from clusterctl.hosts.probe import Facts, HostProbe, parse_probe, probe_script
from clusterctl.inventory import parse

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(TESTS, "fixtures", "macos")
FAKE_DARWIN = os.path.join(TESTS, "fakedarwin")
CLUSTER = parse("hosts: [{name: mini}, {name: book}]\n", "i.yaml")


def lines(name: str) -> list[str]:
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read().splitlines()


def mac(custom: list[str], batt: list[str], host=0, os_name="Darwin") -> HostProbe:
    f = Facts(complete=True)
    f.values = {"os": [os_name], "pmset_custom": custom, "pmset_batt": batt}
    return HostProbe(CLUSTER.hosts[host], f)


def test_the_parsers_on_the_canned_outputs():
    book = pmset_settings(lines("pmset-g-custom.macbook.txt"))
    assert list(book) == ["Battery Power", "AC Power"]
    assert book["Battery Power"]["sleep"] == "1" and book["Battery Power"]["womp"] == "0"
    assert book["AC Power"]["Sleep On Power Button"] == "1"                     # a name with spaces
    assert book["AC Power"]["hibernatefile"] == "/var/vm/sleepimage"
    assert list(pmset_settings(lines("pmset-g-custom.mac-mini.txt"))) == ["AC Power"]
    # `pmset -g`: one listing, and the reason a value is overridden is not part of it
    with open(os.path.join(FAKE_DARWIN, "outputs", "pmset-g.txt")) as f:
        live = pmset_settings(f.read().splitlines())
    assert live["Currently in use"]["sleep"] == "1" and live["Currently in use"]["standby"] == "0"
    assert power_source(lines("pmset-g-batt.mac-mini.txt")) == ("AC Power", False)
    assert power_source(lines("pmset-g-batt.macbook.txt")) == ("AC Power", True)
    assert power_source(lines("pmset-g-batt.macbook-on-battery.txt")) == ("Battery Power", True)
    assert power_source([]) == (None, False) and pmset_settings([]) == {}


def test_a_mac_mini_that_wakes_for_the_network_passes():
    found = checks.power(mac(lines("pmset-g-custom.mac-mini.txt"), lines("pmset-g-batt.mac-mini.txt")))
    assert [(f.status, f.host) for f in found] == [(PASS, "mini")]
    assert "after 1 min idle between jobs, woken by network access" in found[0].detail


def test_a_mac_mini_that_sleeps_and_ignores_the_network_warns_with_the_pmset_fix():
    custom = [l.replace("womp                 1", "womp                 0") for l in lines("pmset-g-custom.mac-mini.txt")]
    found = checks.power(mac(custom, lines("pmset-g-batt.mac-mini.txt")))
    assert [f.status for f in found] == [WARN]
    assert "womp 0" in found[0].detail and found[0].fix == "sudo pmset -c sleep 0 on mini (or sudo pmset -c womp 1)"
    never = [l.replace("sleep                1", "sleep                0") for l in custom]
    found = checks.power(mac(never, lines("pmset-g-batt.mac-mini.txt")))
    assert [f.status for f in found] == [PASS] and "never idles to sleep" in found[0].detail


def test_a_macbook_warns_about_its_lid_and_its_battery_sleep_each_on_one_line():
    found = checks.power(mac(lines("pmset-g-custom.macbook.txt"), lines("pmset-g-batt.macbook.txt"), host=1))
    assert [f.status for f in found] == [WARN, WARN] and {f.host for f in found} == {"book"}
    lid, battery = found
    assert "lid" in lid.detail and "closed-display mode" in lid.detail and "lid open" in lid.fix
    assert "on battery it sleeps after 1 min idle" in battery.detail and "-s does not hold on battery" in battery.detail
    assert battery.fix == "sudo pmset -b sleep 0 on book, or keep it on power"
    assert all("\n" not in f.detail and "\n" not in f.fix for f in found)
    # set up for a cluster: no idle sleep on battery; the lid stays a warning (nothing in pmset lifts it)
    never = [l.replace("sleep                1", "sleep                0") for l in lines("pmset-g-custom.macbook.txt")]
    found = checks.power(mac(never, lines("pmset-g-batt.macbook.txt"), host=1))
    assert [f.detail.split(":")[0] for f in found] == ["a laptop"]


def test_a_macbook_on_battery_now_says_so_first():
    found = checks.power(mac(lines("pmset-g-custom.macbook.txt"), lines("pmset-g-batt.macbook-on-battery.txt"),
                             host=1))
    assert [f.status for f in found] == [WARN] * 3
    assert found[0].detail.startswith("running on battery now: caffeinate -s holds only on AC power")
    assert found[0].fix == "plug book in"


def test_not_a_mac_or_not_asked_finds_nothing():
    assert checks.power(mac(lines("pmset-g-custom.macbook.txt"), [], os_name="Linux")) == []
    assert checks.power(mac([], [])) == []
    assert checks.power(HostProbe(CLUSTER.hosts[0])) == []


@pytest.mark.parametrize("shell", [["dash"], ["bash", "--posix"]])
@pytest.mark.parametrize("power", ["mac-mini", "macbook-on-battery"])
def test_the_probe_reports_what_the_check_needs_on_a_fake_mac(tmp_path, shell, power):
    """The probe's own shell code under /bin/sh as macOS has it (bash in POSIX mode) and dash, with the
    fake-Darwin stand-ins first on PATH (uname says Darwin; pmset prints the canned outputs)."""
    env = {**os.environ, "PATH": f"{FAKE_DARWIN}/bin:{os.environ['PATH']}", "FAKE_DARWIN_POWER": power,
           "FAKE_DARWIN_OUTPUTS": os.path.join(FAKE_DARWIN, "outputs"), "FAKE_DARWIN_FIXTURES": FIXTURES,
           "FAKE_DARWIN_LOG": str(tmp_path / "refused.log")}
    kind = power.replace("-on-battery", "")
    for full in (True, False):
        script = probe_script(python="python3", workdir=str(tmp_path / "w"), mpi_lib_dir=None, peers=[],
                              mesh_config=None, ssh_config=None, full=full)
        out = subprocess.run([*shell, "-c", script], capture_output=True, text=True, env=env, timeout=60).stdout
        f = parse_probe(out)
        if not full:                           # the launch's pre-flight does not ask
            assert f.all("pmset_custom") == [] and f.complete
            continue
        assert f.all("pmset_custom") == [l.replace("\t", " ") for l in lines(f"pmset-g-custom.{kind}.txt")]
        assert f.all("pmset_batt") == [l.replace("\t", " ") for l in lines(f"pmset-g-batt.{power}.txt")]
        statuses = [x.status for x in checks.power(HostProbe(CLUSTER.hosts[0], f))]
        assert statuses == ([PASS] if power == "mac-mini" else [WARN] * 3)
    assert not (tmp_path / "refused.log").exists()
