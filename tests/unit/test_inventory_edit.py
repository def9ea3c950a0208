"""inventory_edit changes one setting and nothing else; and the new launch.connections_per_ip key."""
import difflib
import os

import pytest

from clusterctl.errors import InventoryError
from clusterctl.inventory import load, parse
from clusterctl.inventory_edit import set_setting, starter_inventory, write_setting
from clusterctl.launch.backends import mlx_launch_argv, validated

INVENTORY = """\
# my cluster: keep this comment
defaults:
  user: alice     # everyone
hosts:
  - name: studio-1
    address: 192.168.10.1
  - name: studio-2
    address: 192.168.10.2

mpi:
  # measured on the Thunderbolt bridge
  btl_tcp_links: 2    # was 4
  if_include: "192.168.10.0/24"
launch:
  backend: ring   # fast
"""


def diff(a: str, b: str) -> list[str]:
    return [l for l in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]


def test_replacing_a_value_changes_one_line_and_keeps_its_comment():
    out = set_setting(INVENTORY, "mpi", "btl_tcp_links", "8")
    assert diff(INVENTORY, out) == ["-  btl_tcp_links: 2    # was 4", "+  btl_tcp_links: 8    # was 4"]
    assert parse(out).mpi.btl_tcp_links == 8


def test_a_missing_key_is_inserted_as_the_first_entry_of_its_section():
    out = set_setting(INVENTORY, "launch", "connections_per_ip", "4")
    assert diff(INVENTORY, out) == ["+  connections_per_ip: 4"]
    cluster = parse(out)
    assert cluster.launch.connections_per_ip == 4 and cluster.launch.backend == "ring"


def test_a_missing_section_is_appended():
    text = INVENTORY.replace("launch:\n  backend: ring   # fast\n", "")
    out = set_setting(text, "launch", "connections_per_ip", "2")
    assert diff(text, out) == ["+launch:", "+  connections_per_ip: 2"]
    assert parse(out).launch.connections_per_ip == 2
    no_newline = "hosts: [a]"
    assert set_setting(no_newline, "mpi", "btl_tcp_links", "1") == "hosts: [a]\nmpi:\n  btl_tcp_links: 1\n"


@pytest.mark.parametrize("text, expected", [
    ("hosts: [a]\nmpi: {extra_args: [x]}\n", "hosts: [a]\nmpi: {btl_tcp_links: 8, extra_args: [x]}\n"),
    ("hosts: [a]\nmpi: {}\n", "hosts: [a]\nmpi: {btl_tcp_links: 8}\n"),
    ("hosts: [a]\nmpi:\n# later\nlaunch: {backend: mpi}\n",
     "hosts: [a]\nmpi:\n  btl_tcp_links: 8\n# later\nlaunch: {backend: mpi}\n"),
    ("hosts: [a]\n  # odd indent\nmpi:\n    extra_args: []\n", "hosts: [a]\n  # odd indent\nmpi:\n    btl_tcp_links: 8\n    extra_args: []\n"),
])
def test_flow_and_empty_sections(text, expected):
    assert set_setting(text, "mpi", "btl_tcp_links", "8") == expected
    assert parse(expected).mpi.btl_tcp_links == 8        # and the edited text reads back with the value


def test_values_held_elsewhere_are_refused_with_the_line():
    text = "x: &links 2\nhosts: [a]\nmpi:\n  btl_tcp_links: *links\n"
    with pytest.raises(InventoryError, match=r"inventory.yaml:4: cannot edit mpi.btl_tcp_links"):
        set_setting(text, "mpi", "btl_tcp_links", "8")
    with pytest.raises(InventoryError, match=r":3: cannot edit: `mpi` is not a mapping"):
        set_setting("hosts: [a]\nmpi:\n  - 1\n", "mpi", "btl_tcp_links", "8")


def test_write_setting_is_atomic_keeps_mode_and_follows_symlinks(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text(INVENTORY)
    os.chmod(real, 0o640)
    link = tmp_path / "inventory.yaml"
    link.symlink_to(real)
    assert write_setting(str(link), "mpi", "btl_tcp_links", "4") is True
    assert link.is_symlink() and oct(os.stat(real).st_mode & 0o777) == "0o640"
    assert diff(INVENTORY, real.read_text()) == ["-  btl_tcp_links: 2    # was 4", "+  btl_tcp_links: 4    # was 4"]
    assert write_setting(str(link), "mpi", "btl_tcp_links", "4") is False      # already so: untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.yaml", "real.yaml"]
    assert not any(".tmp-" in p.name for p in tmp_path.iterdir())
    assert load(link).mpi.btl_tcp_links == 4


def test_write_setting_never_writes_an_inventory_it_would_refuse(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    with pytest.raises(InventoryError, match=r"btl_tcp_links must be a whole number from 1 to 64"):
        write_setting(str(path), "mpi", "btl_tcp_links", "0")
    assert path.read_text() == INVENTORY


def test_connections_per_ip_is_validated_with_file_and_line():
    with pytest.raises(InventoryError, match=r"inv.yaml:3: launch.connections_per_ip must be a whole number from 1 to 64"):
        parse("hosts: [a]\nlaunch:\n  connections_per_ip: many\n", "inv.yaml")
    assert parse("hosts: [a]\n").launch.connections_per_ip == 1


def test_mlx_launch_gets_connections_per_ip_for_ring_only():
    cluster = parse("hosts: [{name: a, address: 10.0.0.1}]\nlaunch: {backend: ring, connections_per_ip: 4}\n")
    ring = mlx_launch_argv(cluster, hostfile="/h.json", backend="ring", python="/py", program=["x.py"], env={})
    assert ring[ring.index("--connections-per-ip") + 1] == "4"
    other = mlx_launch_argv(cluster, hostfile="/h.json", backend="jaccl", python="/py", program=["x.py"], env={})
    assert "--connections-per-ip" not in other


def test_a_jaccl_starter_shows_each_host_the_shape_of_its_rdma_list():
    """init cannot know a Mac's RDMA devices: it writes the line to fill in, and every command then names the
    host still without one (docs/facts/macos.md#jaccl)."""
    text = starter_inventory(["m1", "m2"], settings={"python": "python3", "workdir": "~/w"},
                             addresses=["10.0.0.1", "10.0.0.2"], backend="jaccl", date="2026-11-22", rdma=True)
    assert "    # rdma: [null, rdma_enN_to_1]   # jaccl:" in text and "    # rdma: [rdma_enN_to_0, null]" in text
    filled = text.replace("# rdma: [null, rdma_enN_to_1]", "rdma: [null, rdma_en2]").replace(
        "# rdma: [rdma_enN_to_0, null]", "rdma: [rdma_en2, null]")
    assert validated(parse(filled)).hosts[1].rdma == ("rdma_en2", None)
    with pytest.raises(InventoryError, match="m1 has no `rdma:` list"):
        validated(parse(text))
