"""`bench --png` and `setup network --png` without matplotlib: one line naming the extra, exit 2, before any host
is asked (the hosts here are unreachable: a try would time out) and no file. The drawings and the commands with
canned measurements: tests/unit/test_pictures.py; for real: tests/ssh/test_bench.py, tests/ssh/test_setup_network.py."""
import os

import clirun
import pytest

INVENTORY = "hosts:\n  - name: mac1\n    address: 10.255.255.1\n  - name: mac2\n    address: 10.255.255.2\n"


@pytest.mark.parametrize("args", [["bench", "--backend", "mpi"], ["setup", "network"]])
def test_without_matplotlib_one_line_and_exit_2_before_any_host(tmp_path, args):
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('not here')\n")
    (tmp_path / "inventory.yaml").write_text(INVENTORY)            # hosts nothing reaches: a try would time out
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = clirun.clusterctl(*args, "--hosts", "inventory.yaml", "--png", "x.png", cwd=tmp_path, env=env, timeout=60)
    what = " ".join(args[:2] if args[0] == "setup" else args[:1])
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: {what} --png needs matplotlib, which is not installed: pip install matplotlib"), r.stderr
    assert not (tmp_path / "x.png").exists()
