"""The backend registry (clusterctl/launch/backends/): names, lookups, and each entry's launch command,
built for real into a temporary directory (no launcher is started)."""
import json
import os
import stat

import pytest

from clusterctl.errors import InventoryError, LaunchError, UsageError
from clusterctl.inventory import parse
from clusterctl.launch import backends
from clusterctl.doctor.diagnose import smoke_tests
from clusterctl.launch.backends import (
    REGISTRY, MLXLaunchBackend, RankStarterBackend, SmokeTest, for_hostfile, get, names, validated,
)
from clusterctl.launch.backends.rankstarter import free_port_block
from clusterctl.launch.plan import LaunchPlan
from clusterctl.launch.restart import RestartPolicy
from clusterctl.launch.site import LaunchSite
from clusterctl.launch.world import mismatch

INVENTORY = """\
defaults: {python: /opt/py/bin/python3, workdir: /w}
hosts:
  - {name: a, address: 10.0.0.1}
  - {name: b, address: 10.0.0.2, slots: 2}
mpi: {btl_tcp_links: 2}
launch: {backend: ring, connections_per_ip: 2}
"""


@pytest.fixture
def cluster(tmp_path):
    return parse(INVENTORY, str(tmp_path / "inv.yaml"))


def where(tmp_path, **kwargs):
    return LaunchSite(**{"dir": str(tmp_path / "launch"), "ssh": "/usr/bin/ssh", "as_root": False, "launcher": None,
                         "ssh_options": ("-F", "/cache/clusterctl/ssh/abc.config"), **kwargs})


def test_the_registry_names_and_lookups():
    assert names() == ["mpi", "ring", "jaccl"] and names(benchmarked=True) == ["mpi", "ring"]
    assert get("mpi").launcher_name == "mpirun" and get("jaccl").launcher_name == "clusterctl"
    assert get("jaccl", "mlx.launch").launcher_name == "mlx.launch"
    assert get("ring").launcher_name == "clusterctl" and get("ring", "mlx.launch").launcher_name == "mlx.launch"
    assert get("ring", "clusterctl") is get("ring") and backends.launchers() == ["mpirun", "clusterctl", "mlx.launch"]
    with pytest.raises(UsageError, match=r"^unknown backend 'nccl' \(one of mpi, ring, jaccl\)$") as info:
        get("nccl")          # bad input (exit 2) for a library caller too, not an internal error
    assert info.value.exit_code == 2
    with pytest.raises(UsageError, match="--launcher mlx.launch: the mpi backend is started by mpirun$"):
        get("mpi", "mlx.launch")


def test_ring_ranks_are_started_by_clusterctl_with_the_environment_mlx_reads(cluster, tmp_path):
    """Every rank's argv in the starter's spec: ssh with the rendering to the rank's host, a watchdog-wrapped
    script that reads its environment (MLX_RANK, the ring hostfile as the bootstrap will write it) from stdin."""
    launch_dir = tmp_path / "launch"
    command = get("ring").command(cluster, LaunchPlan({}), program=["/ignored/python", "-c", "x", "arg"],
                                  rank_env={"A": "1"}, where=where(tmp_path, launcher=["/usr/bin/python3"]))
    files = {os.path.relpath(p, launch_dir): (text, mode) for p, text, mode in command.files}
    assert sorted(files) == ["ranks.json", "ranks.py"] and command.path_prepend is None
    assert command.argv == ["/usr/bin/python3", str(launch_dir / "ranks.py"), str(launch_dir / "ranks.json")]
    spec = json.loads(files["ranks.json"][0])["ranks"]
    assert [(r["rank"], r["host"]) for r in spec] == [(0, "a"), (1, "b"), (2, "b")]
    for r in spec:
        assert r["argv"][:5] == ["/usr/bin/ssh", "-F", "/cache/clusterctl/ssh/abc.config", "--", r["host"]]
        script = r["argv"][5]
        assert script.startswith("exec /bin/sh -c ") and "mkfifo" in script   # the watchdog, with stdin
        assert "A=1" not in script               # no env value on the command line (MLX_RANK too, for `ps`) ...
        assert f"MLX_RANK={r['rank']} /opt/py/bin/python3 " in script
        count, *lines = r["stdin"].splitlines()                          # ... its stdin: a count, the lines
        assert int(count) == len(lines) == 3 and lines[:2] == ["A=1; export A", f"MLX_RANK={r['rank']}; export MLX_RANK"]
        assert lines[2].startswith("CLUSTERCTL_ENV_FILES='{\"MLX_HOSTFILE\":")
        assert "/opt/py/bin/python3 -c x arg" in script                              # the host's own python
    # MLX's ring hostfile (mlx 0.32 launch.py launch_ring): per rank one ip:port per address and connection,
    # ports counting up from 32323 across ranks; two connections per ip here
    hostfile = [["10.0.0.1:32323", "10.0.0.1:32324"], ["10.0.0.2:32325", "10.0.0.2:32326"],
                ["10.0.0.2:32327", "10.0.0.2:32328"]]
    assert [json.loads(r["mlx"]["MLX_HOSTFILE"]) for r in spec] == [hostfile] * 3


def test_ranks_on_the_launching_machine_start_without_ssh_on_free_ports(tmp_path):
    """`clusterctl run` without an inventory: both ranks under /bin/sh here, 127.0.0.1, a block of free ports."""
    import socket

    from clusterctl.inventory import Cluster
    here = Cluster.this_machine(str(tmp_path), slots=2, backend="ring")
    taken = free_port_block(2)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", taken))        # another job holds a port: the block must avoid it
    try:
        command = get("ring").command(here, LaunchPlan({}), program=["py", "t.py"], rank_env={},
                                      where=where(tmp_path, ssh=None))
    finally:
        blocker.close()
    spec = json.loads(command.files[0][1])["ranks"]
    assert [r["argv"][:2] for r in spec] == [["/bin/sh", "-c"], ["/bin/sh", "-c"]]
    assert [r["mlx"]["MLX_RANK"] for r in spec] == ["0", "1"]
    assert spec[0]["mlx"]["MLX_HOSTFILE"] == spec[1]["mlx"]["MLX_HOSTFILE"]
    [[first], [second]] = json.loads(spec[0]["mlx"]["MLX_HOSTFILE"])
    assert first.startswith("127.0.0.1:") and int(second.split(":")[1]) == int(first.split(":")[1]) + 1
    assert taken not in (int(first.split(":")[1]), int(second.split(":")[1]))          # not the port in use
    starts = {free_port_block(2) for _ in range(20)}
    assert len(starts) > 1                       # a random start: two launches at once rarely meet    assert int(second.split(":")[1]) == int(first.split(":")[1]) + 1


def test_an_inventorys_backend_must_be_registered_and_the_error_names_its_line(tmp_path):
    assert validated(parse("hosts: [{name: a, address: 10.0.0.1, rdma: [null]}]\nlaunch: {backend: jaccl}\n")
                     ).launch.backend == "jaccl"
    with pytest.raises(InventoryError) as info:
        validated(parse("hosts: [a]\nlaunch:\n  backend: nccl\n", str(tmp_path / "i.yaml")))
    assert str(info.value) == f"{tmp_path / 'i.yaml'}:3: launch.backend must be one of mpi, ring, jaccl, not 'nccl'"


def test_which_backend_reads_which_hostfile():
    assert for_hostfile("openmpi", "ring").name == "mpi"
    assert for_hostfile("mlx", "mpi").name == "ring" and for_hostfile("mlx", "jaccl").name == "jaccl"
    with pytest.raises(UsageError, match="needs Open MPI.*works with mlx or openmpi"):
        for_hostfile("mpich", "mpi")


def test_mpi_command_writes_its_hostfile_and_passes_every_variable_by_name_with_x(cluster, tmp_path):
    command = get("mpi").command(cluster, LaunchPlan({"LD_LIBRARY_PATH": "/l"}, "10.0.0.0/24"),
                                 program=["/opt/py/bin/python3", "t.py", "a b"], rank_env={"K": "v w"},
                                 where=where(tmp_path, as_root=True, launcher=["/usr/bin/mpirun"]))
    hostfile = str(tmp_path / "launch" / "hostfile")
    assert [(p, text.splitlines()[1:]) for p, text, _ in command.files] == [(hostfile, ["a slots=1", "b slots=2"])]
    argv = command.argv
    assert argv[:6] == ["/usr/bin/mpirun", "--allow-run-as-root", "--hostfile", hostfile, "-np", "3"]
    assert argv[argv.index("plm_rsh_agent") + 1] == "ssh -F /cache/clusterctl/ssh/abc.config"
    assert argv[argv.index("btl_tcp_links") + 1] == "2" and argv[argv.index("btl_tcp_if_include") + 1] == "10.0.0.0/24"
    assert ["-x", "K"] == argv[argv.index("K") - 1:argv.index("K") + 1] and not any("v w" in a for a in argv)
    assert command.env_values == {"K": "v w"} and command.env()["K"] == "v w"     # mpirun's own environment
    assert command.by_hand().startswith("K='v w' /usr/bin/mpirun ")
    assert argv[argv.index("--"):] == ["--", "/opt/py/bin/python3", "t.py", "a b"] and command.path_prepend is None


def test_ring_over_mlx_launch_reaches_hosts_through_an_ssh_shim_first_on_path(cluster, tmp_path):
    launch_dir = tmp_path / "launch"
    command = get("ring", "mlx.launch").command(cluster, LaunchPlan({}), program=["/opt/py/bin/python3", "-c", "x", "arg"],
                                  rank_env={"A": "1"}, where=where(tmp_path, launcher=["/bin/mlx.launch"]))
    files = {os.path.relpath(p, launch_dir): (text, mode) for p, text, mode in command.files}
    assert sorted(files) == ["hosts.json", "ssh/ssh"] and command.path_prepend == str(launch_dir / "ssh")
    hosts = json.loads(files["hosts.json"][0])
    assert hosts["backend"] == "ring" and [h["ips"] for h in hosts["hosts"]] == [["10.0.0.1"], ["10.0.0.2"], ["10.0.0.2"]]
    shim, mode = files["ssh/ssh"]
    assert mode == 0o755 and shim == '#!/bin/sh\nexec /usr/bin/ssh -F /cache/clusterctl/ssh/abc.config "$@"\n'
    # the launcher finds the shim first on its PATH, started here or from a shell line
    assert command.env()["PATH"].startswith(str(launch_dir / "ssh") + os.pathsep)
    assert command.shell_path() == f'PATH={launch_dir / "ssh"}:"$PATH"'
    assert command.argv == ["/bin/mlx.launch", "--hostfile", str(launch_dir / "hosts.json"), "--backend", "ring",
                            "--python", "/opt/py/bin/python3", "--connections-per-ip", "2", "--env", "A=1",
                            "--", "-c", "x", "arg"]
    backends.write_files(command)
    assert stat.S_IMODE(os.stat(launch_dir / "ssh" / "ssh").st_mode) == 0o755
    assert json.loads((launch_dir / "hosts.json").read_text()) == hosts


def test_mlx_launch_without_an_ssh_client_is_a_launch_error(cluster, tmp_path):
    with pytest.raises(LaunchError, match="needs an OpenSSH client \\(ssh\\) on h9"):
        get("ring", "mlx.launch").command(cluster, LaunchPlan({}), program=["py"], rank_env={},
                            where=where(tmp_path, ssh=None, name="h9"))


def test_tuning_settings_apply_to_the_cluster_and_store_only_what_is_new(cluster):
    mpi, ring = get("mpi"), get("ring")
    tuned = mpi.tuning.applied(cluster, {"btl_tcp_links": 8, "if_include": "10.0.0.0/24"})
    assert (tuned.mpi.btl_tcp_links, tuned.mpi.if_include) == (8, "10.0.0.0/24") and cluster.mpi.btl_tcp_links == 2
    assert mpi.tuning.inventory_lines({"btl_tcp_links": 8, "if_include": "10.0.0.0/24"}, LaunchPlan({}, "10.0.0.0/24")) == \
        [("mpi", "btl_tcp_links", "8")]
    assert mpi.tuning.inventory_lines({"btl_tcp_links": 1, "if_include": "10.1.0.0/16"}, LaunchPlan({})) == \
        [("mpi", "btl_tcp_links", "1"), ("mpi", "if_include", '"10.1.0.0/16"')]
    assert ring.tuning.applied(cluster, {"connections_per_ip": 4}).launch.connections_per_ip == 4
    assert ring.tuning.inventory_lines({"connections_per_ip": 4}, LaunchPlan({})) == [("launch", "connections_per_ip", "4")]
    clash = parse("hosts: [a]\nmpi: {extra_args: [--mca, btl_tcp_links, '2']}\n")
    assert "remove it there" in mpi.tuning.conflict(clash) and mpi.tuning.conflict(cluster) is None
    assert get("jaccl").tuning is None


# Four Macs in a Thunderbolt ring a-b-c-d-a: each cabled to its two neighbours only.
RING4 = """\
hosts:
  - {name: a, address: 10.0.0.1, rdma: [null, rdma_en2, null, rdma_en3]}
  - {name: b, address: 10.0.0.2, rdma: [rdma_en2, null, rdma_en3, null]}
  - {name: c, address: 10.0.0.3, rdma: [null, rdma_en2, null, rdma_en3]}
  - {name: d, address: 10.0.0.4, rdma: [rdma_en3, null, rdma_en2, null]}
launch: {backend: jaccl-ring}
"""


def test_a_new_backend_is_one_registry_entry(monkeypatch, cluster, tmp_path):
    """What CONTRIBUTING.md#adding-a-launch-backend promises: register an entry and the rest of clusterctl sees it.
    jaccl-ring needs RDMA devices between ring neighbours only; jaccl between every pair."""
    monkeypatch.setitem(REGISTRY, "jaccl-ring", MLXLaunchBackend("jaccl-ring", rdma="ring"))
    assert "jaccl-ring" in names()
    assert validated(parse(RING4)).launch.backend == "jaccl-ring"
    with pytest.raises(InventoryError, match=r":2: rdma of a has no device for c \(entry 2\): the jaccl backend "
                       "needs one between every pair of hosts"):
        validated(parse(RING4.replace("jaccl-ring", "jaccl"), str(tmp_path / "i.yaml")))
    with pytest.raises(InventoryError, match=r":3: rdma of b has no device for c \(entry 2\): the jaccl-ring "
                       "backend needs one between every rank and its ring neighbours"):
        validated(parse(RING4.replace("[rdma_en2, null, rdma_en3, null]", "[rdma_en2, null, null, null]")))
    command = get("jaccl-ring").command(cluster, LaunchPlan({}), program=["py", "t.py"], rank_env={},
                                        where=where(tmp_path, launcher=["mlx.launch"]))
    assert command.argv[command.argv.index("--backend") + 1] == "jaccl-ring"


def test_restarts_hints_and_doctor_follow_a_new_entrys_capabilities_not_its_name(monkeypatch, cluster):
    """The rest of clusterctl asks the entry, never its name: jaccl-ring (RDMA) is refused --elastic like jaccl
    and its hint names MLX_IBV_DEVICES; `tcp`, a copy of ring under another name, shrinks, names MLX_HOSTFILE
    and gets ring's smoke test, while jaccl-ring, like jaccl, has none."""
    monkeypatch.setitem(REGISTRY, "jaccl-ring", RankStarterBackend(MLXLaunchBackend("jaccl-ring", rdma="ring")))
    monkeypatch.setitem(REGISTRY, "tcp", RankStarterBackend(MLXLaunchBackend(
        "tcp", neighbours_only=True, smoke=SmokeTest(("data-plane",)))))
    elastic = {"world": 4, "preflight": True}
    with pytest.raises(UsageError, match="--elastic cannot shrink a jaccl-ring world: its rdma table"):
        RestartPolicy(1, elastic=2).check(backend="jaccl-ring", **elastic)
    RestartPolicy(1, elastic=2).check(backend="tcp", **elastic)

    alone = {0: ("a", 1, "any"), 1: ("b", 1, "any")}
    assert mismatch(2, "jaccl-ring", alone).endswith("its jaccl-ring backend found no peers (did the program "
                                                     "change MLX_IBV_DEVICES? check the inventory's addresses; "
                                                     "clusterctl doctor runs a smoke test)")
    assert "its tcp backend found no peers (did the program change MLX_HOSTFILE?" in mismatch(2, "tcp", alone)

    tests, by_default = smoke_tests(cluster)
    assert by_default and {"ring", "tcp"} <= {b.name for b in tests}
    assert not {"jaccl", "jaccl-ring"} & {b.name for b in tests}
    assert not get("tcp").smoke_ready(parse("hosts: [a, b]\n", "i.yaml"))     # no addresses: like ring, none


def test_run_backend_flag_is_checked_like_the_inventorys_own(cluster):
    """`run --backend jaccl` on a ring inventory without rdma lists fails at a host's line before anything starts."""
    get("ring").check(cluster)
    with pytest.raises(InventoryError, match=r"inv.yaml:3: a has no `rdma:` list, which the jaccl backend needs"):
        get("jaccl").check(cluster)


def test_jaccl_hostfile_carries_rdma_and_ring_hostfile_does_not():
    c = validated(parse("hosts:\n  - {name: a, address: 10.0.0.1, rdma: [null, rdma_en2]}\n"
                        "  - {name: b, address: 10.0.0.2, rdma: [rdma_en2, null]}\nlaunch: {backend: jaccl}\n"))
    hosts = json.loads(get("jaccl").hostfile(c))["hosts"]
    assert [h["rdma"] for h in hosts] == [[None, "rdma_en2"], ["rdma_en2", None]]
    assert "rdma" not in json.loads(get("ring").hostfile(c))["hosts"][0]


def test_jaccl_ranks_get_their_rdma_devices_and_the_coordinator(tmp_path):
    """The rank starter gives a jaccl rank what mlx.launch 0.32's launch_jaccl gives it: MLX_RANK,
    MLX_IBV_DEVICES (a file with every rank's rdma list; its text here) and MLX_JACCL_COORDINATOR (rank 0's
    address and the starting port), the same as the golden environment of launch/mlxenv.py."""
    from clusterctl.launch import mlxenv
    c = validated(parse("defaults: {workdir: /w}\nhosts:\n"
                        "  - {name: a, address: 10.0.0.1, rdma: [null, rdma_en2, rdma_en3]}\n"
                        "  - {name: b, address: 10.0.0.2, rdma: [rdma_en2, null, [rdma_en4, rdma_en5]]}\n"
                        "  - {name: c, address: 10.0.0.3, rdma: [rdma_en3, rdma_en4, null]}\n"
                        "launch: {backend: jaccl}\n"))
    command = get("jaccl").command(c, LaunchPlan({}), program=["py", "t.py"], rank_env={},
                                   where=where(tmp_path, launcher=["/usr/bin/python3"]))
    spec = json.loads(command.files[0][1])["ranks"]
    devices = [[None, "rdma_en2", "rdma_en3"], ["rdma_en2", None, ["rdma_en4", "rdma_en5"]], ["rdma_en3", "rdma_en4", None]]
    for r in spec:
        assert set(r["mlx"]) == {"MLX_RANK", "MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR"}
        assert r["mlx"]["MLX_RANK"] == str(r["rank"]) and json.loads(r["mlx"]["MLX_IBV_DEVICES"]) == devices
        assert r["mlx"]["MLX_JACCL_COORDINATOR"] == "10.0.0.1:32323" == mlxenv.jaccl_coordinator(c, 32323)
        assert "MLX_HOSTFILE" not in r["argv"][-1]
