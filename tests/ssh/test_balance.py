"""Balanced data parallelism on two test hosts, the second slowed 3x by the trainer's test aid
(CLUSTERCTL_TRAIN_SLOWDOWN in its inventory `env`): `auto` moves rows to the fast host after its first
exchange, and the shares reach metrics.jsonl and summary.json (the live panel's: tests/train/test_train_units.py). The speed-up
itself is measured in benchmarks/bench_balance.py (a timed figure does not belong in a test)."""
import json
from functools import partial

import clirun
import pytest

from clusterctl.inventory_edit import set_host_setting

pytestmark = pytest.mark.ssh
clusterctl = partial(clirun.clusterctl, timeout=300, own_cache=True)
TOKEN = clirun.TOKEN
TRAIN = ["--n-layers", "2", "--dim", "32", "--n-heads", "2", "--mlp-dim", "64", "--block-size", "32",
         "--batch-size", "8", "--steps", "80", "--report-every", "5", "--eval-every", "0", "--ckpt-every", "0"]


def test_auto_gives_the_fast_host_more_rows_and_says_so_everywhere(make_cluster, tmp_path):
    cluster = make_cluster(2)
    text = set_host_setting(cluster.inventory.read_text(), "h2", "env", '{CLUSTERCTL_TRAIN_SLOWDOWN: "3"}')
    cluster.inventory.write_text(text)
    r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--", *TRAIN, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = tmp_path / "runs" / TOKEN.search(r.stderr).group(1)
    summary = json.loads((run_dir / "summary.json").read_text())
    balance = summary["trainer"]["balance"]
    assert balance["mode"] == "auto" and balance["changes"], balance
    first = balance["changes"][0]
    assert 4 <= first["step"] < 80, balance                   # an exchange with 0.25 s measured on each rank
    assert first["rows"][0] > first["rows"][1] and sum(first["rows"]) == 16, first
    assert first["speeds"][0] > first["speeds"][1]            # h2 sleeps twice its compute time each step
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shares = [rec["shares"] for rec in records if "loss" in rec]
    assert shares[0] == [8, 8] and shares[-1] == balance["rows"]      # step 1 even; then as moved
    assert summary["trainer"]["check_sync"]["out_of_sync"] is None
