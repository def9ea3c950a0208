"""Connector.run_shared (hosts/sharedssh.py) on the real loopback cluster: a command over the OpenSSH master
connection `run` keeps, with no paramiko login; no master, or ssh failing, is the transport's as before."""
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.ssh

TOKEN = f"sharedssh-{uuid.uuid4().hex}"      # on the timed-out command's line, to look for it afterwards
MARK = f"/tmp/{TOKEN}-ran"                    # what the hostile env value would create were it executed (this
SECRET = f"a b;$(touch {MARK})"               # run's own name: no file left by anything else can be mistaken for it)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import json, sys
from clusterctl.errors import CommandTimeout
from clusterctl.hosts.connector import Connector
from clusterctl.inventory_load import load_cluster
connector = Connector(load_cluster(sys.argv[1]), lazy=True)
host = connector.cluster.hosts[0]
r = connector.run_shared(host, 'printf "%s|%s" "$SECRET" "$(pwd)"', 30, env={"SECRET": sys.argv[3]}, cwd="/")
out = {"exit": r.exit_code, "stdout": r.stdout, "paramiko": "paramiko" in sys.modules}
try:
    connector.run_shared(host, "sleep 30; : " + sys.argv[2], 1)
except CommandTimeout as e:
    out["timeout"] = str(e)
print(json.dumps(out))
"""


def probe(cluster, tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": REPO}
    r = subprocess.run([sys.executable, "-c", PROBE, str(cluster.inventory), TOKEN, SECRET], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_command_goes_over_the_shared_connection_when_one_is_up_else_through_paramiko(make_cluster, tmp_path):
    cluster = make_cluster(1)
    cold = probe(cluster, tmp_path)                    # no master yet: the transport (paramiko), as ever
    assert cold["exit"] == 0 and cold["stdout"] == f"{SECRET}|/" and cold["paramiko"]
    # a master up (what run's copy leaves: ControlPersist, in the rendering the cold probe wrote): the same
    # answer with no paramiko loaded at all
    ssh = subprocess.run(["ssh", "-F", _config(tmp_path), "h1", "true"], capture_output=True, text=True, timeout=60)
    assert ssh.returncode == 0, ssh.stderr
    warm = probe(cluster, tmp_path)
    assert warm["exit"] == 0 and warm["stdout"] == f"{SECRET}|/" and not warm["paramiko"], warm
    assert "sleep 30" in warm["timeout"], warm["timeout"]
    assert not os.path.exists(MARK)
    # the timed-out command was ended on the host with its ssh (the watchdog saw its stdin end)
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-f", TOKEN], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the timed-out command still runs on the host"
        time.sleep(0.2)


def _config(tmp_path) -> str:
    folder = tmp_path / "cache" / "clusterctl" / "ssh"
    return str(next(p for p in folder.iterdir() if p.suffix == ".config"))
