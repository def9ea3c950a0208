"""`clusterctl setup python` on 3 test hosts whose inventory names a Python without MLX (this machine's base
interpreter: the same minor version, nothing installed): every host gets a venv in its workdir with this
machine's MLX, numpy, PyYAML and mlx-lm (real pip, from PyPI or its cache); doctor's python, mlx, mlx-lm and
parity checks pass; a ring job runs on the venvs; a second `setup python` changes nothing and is quick.
"""
import json
import os
import sys
import time

import clirun
import pytest
from test_run import ALLSUM

pytestmark = pytest.mark.ssh


def test_setup_python_gives_every_host_this_machines_environment(make_cluster, tmp_path):
    cluster = make_cluster(3)
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    inventory = cluster.write_inventory(python=base)
    bare = clirun.clusterctl("doctor", "--hosts", str(inventory), "--no-deep", "--json", cwd=tmp_path, timeout=120)
    assert any(c["check"] == "mlx" and c["status"] == "fail" for c in json.loads(bare.stdout)["checks"]), bare.stdout

    r = clirun.clusterctl("setup", "python", "--hosts", str(inventory), cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    venv = f"{cluster.workdir}/.clusterctl/venv/bin/python"
    assert f'python: "{venv}"' in inventory.read_text()
    assert "doctor's python, mlx, mlx-lm and parity checks:" in r.stdout and "failed" not in r.stdout.splitlines()[-1]
    import mlx.core as mx                # the same MLX as this machine's, on every host, and its mlx-lm (issue 45)
    from importlib.metadata import version
    for i in range(1, 4):
        v = cluster.ssh(i, f"{venv} -c 'import mlx.core as mx, importlib.metadata as m; print(mx.__version__, "
                           "m.version(\"mlx-lm\"))'")
        assert v.stdout.split() == [mx.__version__, version("mlx-lm")], v.stdout + v.stderr

    (tmp_path / "allsum.py").write_text(ALLSUM)
    job = clirun.clusterctl("run", "--hosts", str(inventory), "--backend", "ring", "--plain", "allsum.py",
                            "ring", "x", cwd=tmp_path, timeout=180, env=clirun.cache_env(tmp_path))
    assert job.returncode == 0, job.stdout + job.stderr
    assert sum("world 3 sum [3.0, 3.0, 3.0, 3.0]" in line for line in job.stdout.splitlines()) == 3, job.stdout

    began = time.monotonic()
    again = clirun.clusterctl("setup", "python", "--hosts", str(inventory), cwd=tmp_path, timeout=300)
    took = time.monotonic() - began
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count(": nothing to change (") == 3, again.stdout
    assert took < 60, took          # the figure (under 15 s) is measured on a quiet machine: docs/setup.md


def test_setup_python_offline_installs_from_wheels_sent_from_here(make_cluster, tmp_path):
    """Hosts whose pip cannot reach any index (PIP_INDEX_URL points at a closed port in their sessions):
    plain setup python fails naming them; --offline downloads the wheels here (pip download for the hosts'
    platform tags), sends them, and installs from them alone."""
    cluster = make_cluster(2)
    for i in (1, 2):
        cluster.host(i).session_env.update({"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0",
                                            "PIP_TIMEOUT": "2"})
        cluster.restart(i)
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    inventory = cluster.write_inventory(python=base)
    env = clirun.cache_env(tmp_path)
    online = clirun.clusterctl("setup", "python", "--hosts", str(inventory), cwd=tmp_path, timeout=600, env=env)
    assert online.returncode == 1 and "h1: failed: installing failed:" in online.stderr, online.stdout + online.stderr
    r = clirun.clusterctl("setup", "python", "--hosts", str(inventory), "--offline", cwd=tmp_path, timeout=900,
                          env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    import mlx.core as mx
    for i in (1, 2):
        wheels = cluster.ssh(i, f"ls {cluster.workdir}/.clusterctl/wheels/*/").stdout.split()
        assert any(w.startswith("mlx_cpu-") and w.endswith(".whl") for w in wheels), wheels
        v = cluster.ssh(i, f"{cluster.workdir}/.clusterctl/venv/bin/python -c 'import mlx.core as mx; "
                           "print(mx.__version__)'")
        assert v.stdout.strip() == mx.__version__, v.stdout + v.stderr
