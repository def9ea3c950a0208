"""ps and kill on the real loopback cluster: a job left running on 2 hosts is seen rank by rank from
another process, then stopped with `clusterctl kill` (through its own `run` process, which records it as
stopped), leaving no process of it on any host."""
import json
import os
import re
import subprocess
import sys
import time
from functools import partial

import clirun
import pytest

pytestmark = pytest.mark.ssh

TOKEN = clirun.TOKEN


def _env(cwd):
    return {**os.environ, "XDG_CACHE_HOME": os.path.join(str(cwd), ".cache")}


clusterctl = partial(clirun.clusterctl, own_cache=True)


def test_ps_sees_a_running_jobs_ranks_and_kill_leaves_nothing(make_cluster, tmp_path):
    cluster = make_cluster(2)
    (tmp_path / "sleepy.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    job = subprocess.Popen([sys.executable, "-m", "clusterctl", "run", "--hosts", str(cluster.inventory),
                            "--backend", "ring", "sleepy.py"], cwd=tmp_path, env=_env(tmp_path),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen, up = [], 0
        deadline = time.monotonic() + 90
        while up < 2 and time.monotonic() < deadline:
            line = job.stdout.readline()
            if not line:
                break
            seen.append(line)
            up += line.rstrip().endswith("] up")
        assert up == 2, "".join(seen)
        run_id = TOKEN.search("".join(seen)).group(1)

        r = clusterctl("ps", "--hosts", str(cluster.inventory), "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        hosts = json.loads(r.stdout)
        assert [h["host"] for h in hosts] == ["h1", "h2"] and not any(h["error"] for h in hosts)
        # every simulated host is this machine, so each host's ps sees both ranks (docs/observe.md#clusterctl-ps-kill)
        for h in hosts:
            ranks = [p for p in h["processes"] if p["run_id"] == run_id and p["kind"] == "rank"]
            assert sorted(p["rank"] for p in ranks) == [0, 1], h
            assert all(p["pid"] > 0 and p["rss_kb"] > 0 and p["age_s"] < 120 for p in ranks)
        table = clusterctl("ps", "--hosts", str(cluster.inventory), cwd=tmp_path).stdout
        assert re.search(rf"^h1\s+{run_id}\s+0\s+rank\s+\d+", table, re.M), table
        assert re.search(rf"^h2\s+{run_id}\s+1\s+rank\s+\d+", table, re.M), table

        k = clusterctl("kill", run_id, "--hosts", str(cluster.inventory), cwd=tmp_path)
        assert k.returncode == 0, k.stdout + k.stderr
        assert f"kill: run {run_id}: no process left on 2 host(s)" in k.stderr
        assert subprocess.run(["pgrep", "-f", f"clusterctl-run-{run_id}"], capture_output=True).stdout == b""
        for i in (1, 2):
            assert f"clusterctl-run-{run_id}" not in cluster.ssh(i, "ps -eo args").stdout
        assert job.wait(60) == 143                # stopped through its own process (a SIGTERM), as Ctrl-C would
    finally:
        job.kill()
        job.wait(30)
    info = json.loads(clusterctl("runs", "--json", cwd=tmp_path).stdout)[0]
    assert info["run_id"] == run_id and info["status"] == "stopped" and info["kind"] == "program", info
    after = json.loads(clusterctl("ps", "--hosts", str(cluster.inventory), "--json", cwd=tmp_path).stdout)
    assert not [p for h in after for p in h["processes"] if p["run_id"] == run_id]
