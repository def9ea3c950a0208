"""zero3 and the memory plan on two test hosts, launched as users launch them (`clusterctl run`): a run that
cannot fit the hosts' memory (the second host says it has 200 MB through the test aid CLUSTERCTL_HOST_MEMORY
in its inventory env) is refused on the controller before any rank starts, naming the strategy that fits;
`--strategy auto` then trains with zero3, every host keeps a complete checkpoint (each its own slice, the
other's sent over the collectives), and the one fetched home loads in `clusterctl generate`."""
import json
import re
from functools import partial

import clirun
import pytest

from clusterctl.inventory_edit import set_host_setting

pytestmark = pytest.mark.ssh
clusterctl = partial(clirun.clusterctl, timeout=300, own_cache=True)
TOKEN = clirun.TOKEN
MODEL = ["--n-layers", "4", "--dim", "384", "--n-heads", "4", "--mlp-dim", "1536", "--block-size", "16",
         "--batch-size", "2", "--steps", "3", "--report-every", "1", "--eval-every", "0", "--balance", "off"]


def test_a_run_too_big_for_a_host_is_refused_up_front_and_auto_trains_it_with_zero3(make_cluster, tmp_path):
    cluster = make_cluster(2)
    text = set_host_setting(cluster.inventory.read_text(), "h2", "env", '{CLUSTERCTL_HOST_MEMORY: "200M"}')
    cluster.inventory.write_text(text)
    r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--", *MODEL, cwd=tmp_path)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), r.stderr     # not even the project synced
    assert "under dp at world 2; the smallest host has 200 MB" in errors[0] and "pass --strategy zero3" in errors[0]
    assert not TOKEN.search(r.stderr) and not (tmp_path / "runs").exists()    # no run started

    r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--", *MODEL,
                   "--strategy", "auto", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(r"under zero3 \(chosen by --strategy auto\) at world 2 \(dp \d+ MB, fsdp \d+ MB\); the smallest "
                     r"host has 200 MB", r.stdout), r.stdout
    run_dir = tmp_path / "runs" / TOKEN.search(r.stderr).group(1)
    step = run_dir / "checkpoints" / "step-000003"
    assert sorted(p.name for p in step.iterdir()) == ["state.json", "zero3-rank-0.safetensors",
                                                       "zero3-rank-1.safetensors", "zero3.json"]
    assert json.loads((step / "state.json").read_text())["strategy"] == "zero3"
    listed = json.loads(clusterctl("runs", "--json", cwd=tmp_path).stdout)       # the strategy auto chose
    assert [(r["kind"], r["strategy"], r["world"]) for r in listed] == [("train", "zero3", 2)], listed
    peaks = [json.loads(line)["peak_mem_mb"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "peak_mem_mb" in line]
    assert peaks and max(peaks) < 150
    g = clusterctl("generate", "--checkpoint", str(run_dir), "--prompt", "Once", "--max-tokens", "8", cwd=tmp_path)
    assert g.returncode == 0 and g.stdout.startswith("Once"), g.stderr
