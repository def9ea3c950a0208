"""Hostfiles and launcher command lines against golden files (tests/golden/)."""
import json
import os
import shlex

import pytest

from clusterctl import __version__
from clusterctl.hosts.openssh import rsh_agent
from clusterctl.inventory import load
from clusterctl.launch.backends import mlx_launch_argv, mpirun_argv
from clusterctl.launch.hostfile import TemplateError, render

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(GOLDEN)))
    return load("tests/golden/inventory.yaml")


def golden(name: str) -> str:
    with open(os.path.join(GOLDEN, name)) as f:
        return f.read().replace("VERSION", __version__)


@pytest.mark.parametrize("fmt,name", [("openmpi", "hostfile.openmpi"), ("mpich", "hostfile.mpich"),
                                      ("mlx", "hostfile.mlx.json")])
def test_every_format_matches_its_golden_file(cluster, fmt, name):
    assert render(cluster, fmt) == golden(name)


def test_mpirun_argv_matches_golden_and_user_mca_overrides_ours(cluster):
    argv = mpirun_argv(cluster, hostfile="/tmp/hf", program=[cluster.hosts[0].python, "train.py", "--lr", "3e-4", "a b"],
                       env={"DYLD_LIBRARY_PATH": "/opt/homebrew/lib", "MLX_MPI_LIBNAME": "/opt/homebrew/lib/libmpi.dylib",
                            **cluster.hosts[0].env_dict},
                       rsh_agent=rsh_agent(["-F", "/cache/clusterctl/ssh/abc.config"]), if_include="192.168.10.0/24")
    assert shlex.join(argv) + "\n" == golden("mpirun.argv")
    assert argv.count("btl_tcp_links") == 1          # the user's 8 replaced our 2, not repeated


def test_as_root_and_mlx_launch_argv(cluster):
    argv = mpirun_argv(cluster, hostfile="h", program=["p"], env={}, rsh_agent="ssh", as_root=True)
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert mlx_launch_argv(cluster, hostfile="/h.json", backend="ring", python="/py", program=["t.py", "x y"],
                           env={"A": "1"}, cwd="/w") == \
        ["mlx.launch", "--hostfile", "/h.json", "--backend", "ring", "--python", "/py", "--cwd", "/w",
         "--env", "A=1", "--", "t.py", "x y"]


def test_user_templates_and_their_errors(cluster):
    assert render(cluster, "openmpi", "@host $rank $name $address\n") == \
        "0 studio-1.local 192.168.10.1\n1 studio-2.local 192.168.10.2\n3 studio-3.local 192.168.10.3\n"
    with pytest.raises(TemplateError, match=r"my.tmpl: unknown placeholder \$nmae"):
        render(cluster, "openmpi", "@host $nmae\n", template_name="my.tmpl")
    with pytest.raises(TemplateError, match="not JSON"):
        render(cluster, "mlx", '{"hosts": $hosts,}')
    extra = json.loads(render(cluster, "mlx", '{"backend": $backend, "hosts": $hosts, "note": "mine"}'))
    assert extra["note"] == "mine" and len(extra["hosts"]) == 4
