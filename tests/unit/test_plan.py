"""The launch plan (clusterctl/launch/plan.py): what it takes from canned probe facts, the cache of the
last verified plan, and the pre-flight against this machine's real probe (no SSH)."""
import json
import os
import sys

import pytest

from clusterctl.errors import PreflightError
from clusterctl.hosts.connector import Connector
from clusterctl.hosts.probe import Facts, HostProbe
from clusterctl.inventory import parse
from clusterctl.launch.plan import LaunchPlan, cached_plan, discover, plan_from_probes, remember_plan

IP = {"h1": "2: eth1    inet 10.0.0.1/24 brd 10.0.0.255 scope global eth1",
      "h2": "2: eth1    inet 10.0.0.2/24 brd 10.0.0.255 scope global eth1"}


# what the probe prints for memory: `sysctl -n hw.memsize` on a 64 GB Mac and a 16 GB one (recorded), Linux
# MemTotal in bytes (awk on /proc/meminfo) with cgroup v2's memory.max ("max": no limit, or bytes)
MEMORY = {"Darwin": {"h1": {"mem_total": ["68719476736"]}, "h2": {"mem_total": ["17179869184"]}},
          "Linux": {"h1": {"mem_total": ["25151807488"], "mem_limit": ["max"]},
                    "h2": {"mem_total": ["25151807488"], "mem_limit": ["8589934592"]}}}


def probes(cluster, os_name="Darwin", libmpi="/opt/homebrew/lib/libmpi.dylib", memory=True):
    out = []
    for h in cluster.hosts:
        facts = Facts({"os": [os_name], "iface": [IP[h.name]], **({"libmpi": [libmpi]} if libmpi else {}),
                       **(MEMORY[os_name][h.name] if memory else {})})
        out.append(HostProbe(h, facts))
    return out


def test_the_plan_exports_the_first_hosts_libmpi_and_pins_mpi_to_the_shared_subnet():
    cluster = parse("hosts: [{name: h1, address: 10.0.0.1}, {name: h2, address: 10.0.0.2}]\n")
    plan = plan_from_probes(cluster, probes(cluster))
    assert plan == LaunchPlan({"DYLD_FALLBACK_LIBRARY_PATH": "/opt/homebrew/lib",
                               "MLX_MPI_LIBNAME": "/opt/homebrew/lib/libmpi.dylib"}, "10.0.0.0/24",
                              memory={"h1": 64 * 2**30, "h2": 16 * 2**30}, first_os="Darwin")


def test_the_plan_keeps_each_hosts_memory_lowered_to_its_cgroup_limit():
    cluster = parse("hosts: [{name: h1, address: 10.0.0.1}, {name: h2, address: 10.0.0.2}]\n")
    plan = plan_from_probes(cluster, probes(cluster, "Linux", "/usr/lib/libmpi.so"))
    assert plan.memory == {"h1": 25151807488, "h2": 8 * 2**30} and plan.first_os == "Linux"
    assert plan_from_probes(cluster, probes(cluster, memory=False)).memory == {}     # an older probe: unknown


def test_the_inventory_wins_over_what_the_probe_found():
    cluster = parse("defaults: {env: {MLX_MPI_LIBNAME: /mine/libmpi.so}}\n"
                    "hosts: [{name: h1, address: 10.0.0.1}, {name: h2, address: 10.0.0.2}]\n"
                    "mpi: {if_include: eth1}\n")
    plan = plan_from_probes(cluster, probes(cluster, "Linux", "/usr/lib/libmpi.so"))
    assert plan.env == {"LD_LIBRARY_PATH": "/usr/lib", "MLX_MPI_LIBNAME": "/mine/libmpi.so"}
    assert plan.if_include == "eth1"


def test_no_libmpi_and_no_addresses_plan_nothing_extra():
    cluster = parse("hosts: [h1, h2]\n")
    assert plan_from_probes(cluster, probes(cluster, libmpi=None, memory=False)) == LaunchPlan({}, None,
                                                                                             first_os="Darwin")


def test_the_cached_plan_round_trips_per_cluster_and_a_damaged_cache_is_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    one, two = parse("hosts: [h1]\n", "one.yaml"), parse("hosts: [h1]\nmpi: {btl_tcp_links: 8}\n", "two.yaml")
    assert cached_plan(one) is None
    remember_plan(one, LaunchPlan({"A": "1"}, "10.0.0.0/24", memory={"h1": 2**34}, first_os="Darwin"))
    assert cached_plan(one) == LaunchPlan({"A": "1"}, "10.0.0.0/24", memory={"h1": 2**34}, first_os="Darwin")
    assert cached_plan(parse("hosts: [h1]\n", "elsewhere/same.yaml")) == cached_plan(one)   # same cluster, other file
    assert cached_plan(two) is None                                                       # other MPI settings
    [path] = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert os.stat(path).st_mode & 0o777 == 0o600           # a plan holds env values (issue 25 item 1)
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    for damage in ("{", json.dumps({"env": {"A": 1}, "if_include": None}), json.dumps([1])):
        with open(path, "w") as f:
            f.write(damage)
        assert cached_plan(one) is None, damage


def local(tmp_path, **host):
    settings = ", ".join(f"{k}: {json.dumps(v)}" for k, v in {"workdir": str(tmp_path), **host}.items())
    return parse(f"hosts: [{{name: here, local: true, {settings}}}]\n", str(tmp_path / "inv.yaml"))


def test_the_preflight_on_this_machine_names_what_is_missing(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "mymod.py").write_text("")
    connector = Connector(local(tmp_path))
    assert isinstance(discover(connector, script="train.py"), LaunchPlan)
    assert isinstance(discover(connector, module="mymod"), LaunchPlan)
    with pytest.raises(PreflightError, match=f"here: {tmp_path}/nope.py does not exist there"):
        discover(connector, script="nope.py")
    with pytest.raises(PreflightError, match="here: no module named no_such_module for .* there, from its workdir"):
        discover(connector, module="no_such_module")
    # a package that raises while it is imported is named with the host's own message, not as missing
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_text("raise RuntimeError('needs a GPU driver')\n")
    (tmp_path / "broken" / "train.py").write_text("")
    with pytest.raises(PreflightError) as info:
        discover(connector, module="broken.train")
    assert str(info.value).startswith("here: importing broken (on the way to broken.train) raised there: "
                                      "RuntimeError: needs a GPU driver (fix the package on that host")
    with pytest.raises(PreflightError, match="to run the file, write `clusterctl run train.py`"):
        discover(connector, module="train.py")
    with pytest.raises(PreflightError, match="python '/nonexistent/python3' not found on the non-interactive PATH"):
        discover(Connector(local(tmp_path, python="/nonexistent/python3")), script="train.py")


def test_the_preflight_imports_a_module_as_a_rank_does_with_the_inventorys_env(tmp_path):
    """A module found only through the inventory's PYTHONPATH passes, as it would on the rank."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "onlyhere.py").write_text("")
    connector = Connector(local(tmp_path, python=sys.executable))
    with pytest.raises(PreflightError):
        discover(connector, module="onlyhere")
    connector = Connector(local(tmp_path, python=sys.executable, env={"PYTHONPATH": str(tmp_path / "lib")}))
    assert isinstance(discover(connector, module="onlyhere"), LaunchPlan)


def test_the_module_check_exports_the_inventorys_env_in_the_shell_not_through_env(tmp_path):
    """macOS SIP strips DYLD_* from what /usr/bin/env starts (docs/facts/macos.md#sip-strips-dyld): the module
    pre-flight sets the inventory's variables with the shell's own export, so python sees them; the values
    reach the probe as one variable on its stdin, never on its command line."""
    from clusterctl.launch.plan import module_check, module_env
    host = local(tmp_path, env={"DYLD_FALLBACK_LIBRARY_PATH": "/opt/homebrew/lib", "A": "it's"}).hosts[0]
    text = module_check(host, "pkg.train")
    assert "/opt/homebrew/lib" not in text and "A=" not in text
    assert 'eval "$CLUSTERCTL_RANK_ENV"; unset CLUSTERCTL_RANK_ENV; ' in text and " env " not in text
    exported = module_env(host)["CLUSTERCTL_RANK_ENV"]         # sent on the probe's stdin, not in its text
    assert "DYLD_FALLBACK_LIBRARY_PATH=/opt/homebrew/lib; export DYLD_FALLBACK_LIBRARY_PATH\n" in exported
    assert "A='it'\"'\"'s'; export A\n" in exported


def test_one_python_for_launchers_that_exec_it_without_a_shell(tmp_path):
    """mpirun and mlx.launch start one python path on every host: a leading ~ is made each host's home as
    the pre-flight found it, and must come out the same everywhere (issue 25 item 8)."""
    from clusterctl.errors import LaunchError
    cluster = parse("defaults: {python: ~/venv/bin/python}\nhosts:\n  - {name: a}\n  - {name: b}\n",
                    str(tmp_path / "i.yaml"))
    same = LaunchPlan(homes={"a": "/Users/me", "b": "/Users/me"})
    assert same.python(cluster) == "/Users/me/venv/bin/python"
    with pytest.raises(LaunchError, match=r"different path on each host \(a: /Users/me/venv/bin/python, "
                                          r"b: /Users/you/venv/bin/python\)"):
        LaunchPlan(homes={"a": "/Users/me", "b": "/Users/you"}).python(cluster)
    with pytest.raises(LaunchError, match="drop --no-preflight"):
        LaunchPlan.from_inventory(cluster).python(cluster)
    absolute = parse("defaults: {python: /opt/py}\nhosts:\n  - {name: a}\n", str(tmp_path / "j.yaml"))
    assert LaunchPlan().python(absolute) == "/opt/py"
