"""`clusterctl bench`'s bad input: one line, exit 2, nothing launched (no hosts are reachable here)."""

import clirun
import pytest

INVENTORY = "hosts:\n  - name: nowhere.invalid\n    address: 10.255.255.1\n"


@pytest.mark.parametrize("args, message", [
    (["--write"], "--write stores what --tune found"),
    (["--tune", "--p2p"], "give --tune or --p2p, not both"),
    (["--tune", "--png", "x.png"], "--png draws the bandwidth by size or --p2p's matrix, not --tune's trials"),
    (["--sizes", "1K..1T"], "size '1T' is not a number of bytes"),
    (["--sizes", "8M..1M"], "range '8M..1M' runs backwards"),
    (["--ops", "all_reduce"], "--ops: all_reduce: choose from all_sum, all_gather"),
    (["--backend", "nccl"], "Invalid value for '--backend'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    r = clirun.clusterctl("bench", "--hosts", str(inventory), *args, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_a_jaccl_inventory_needs_an_explicit_backend(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY + "    rdma: [null]\nlaunch: {backend: jaccl}\n")   # a valid jaccl inventory
    r = clirun.clusterctl("bench", "--hosts", str(inventory), timeout=60)
    assert r.returncode == 2 and "bench measures the mpi and ring backends" in r.stderr
