"""The storm (tests/storm.py): one bundled-trainer run on 3 test hosts under --max-restarts 6 rides through six
faults, one after another; each is named by its cause in `run`'s output and in summary.json's attempts, the run
finishes, its final loss equals an undisturbed run's on the same 3 ranks (resume is exact), and no process of it is
left on any host. The undisturbed run goes on a second cluster at the same time."""
import json
import re

import clirun
import dataplane
import pytest
from sshcluster import requires_private_roots
from storm import DROP_S, TEST_STEP_S, TEST_STEPS, Storm, beside, train
from test_restart import curve, nothing_left

pytestmark = pytest.mark.ssh          # not slow: it runs last of the ssh tier, not beside the fine-tune quality tests at the start


def test_a_run_rides_through_a_storm_of_faults_each_named_and_ends_as_an_undisturbed_run(make_cluster, tmp_path,
                                                                                         small_disk):
    why = dataplane.available()
    if why:
        pytest.skip(f"the data plane cannot be dropped here: {why}")
    cluster = make_cluster(3, persistent_roots=True)        # a host stopped and started keeps its disk
    requires_private_roots(cluster, "each host keeps its own checkpoints, h3's on a small disk")
    cluster.mount_over(3, str(cluster.host_root), str(small_disk.path))
    quiet = make_cluster(3)
    (tmp_path / "storm").mkdir()
    (tmp_path / "calm").mkdir()
    calm = clirun.start("run", "--hosts", str(quiet.inventory), "--backend", "ring", "--plain", "--",
                        *train(TEST_STEPS), cwd=tmp_path / "calm", own_cache=True)
    storm = Storm(cluster, tmp_path / "storm", small_disk, steps=TEST_STEPS, step_s=TEST_STEP_S)
    code, calm_out = beside(storm, calm)
    text = storm.text
    assert code == 0, storm.tail()
    assert calm.returncode == 0, calm_out[-3000:]

    kill, stop, drop, freeze, sshd, disk = storm.faults
    # each fault that ended an attempt is named by its cause in the restart line
    assert re.search(r": rank 1 on h2 was killed by SIGKILL(; followed from it: .*)?; restart 1 of 6 in ", kill.named), kill.named
    assert re.search(r": rank 1 on h2 lost its ssh connection.*; restart 2 of 6 in ", stop.named), stop.named
    # at one place, or (the link dropped mid-collective: some ranks finished it) each in a collective of its own
    assert re.search(r": stalled: no progress from any rank for \d+s.*every rank waits (at the same place|in one of "
                     r"\d+ collectives) .*: in a "
                     r"collective, for each other, .*the data plane.*doctor --data-plane.*; restart 3 of 6 in ",
                     drop.named), drop.named
    # the restart after it waited for the link (not launching into it, which would fail at once) and said so
    assert re.search(r"restart 3 waits for the data plane, up to 300s \(--data-plane-wait\): h1 -> h2 "
                     rf"\({cluster.host(2).address}:\d+\): ", storm.waits), storm.waits
    assert "restart 3 goes on" in storm.back
    assert re.search(r": stalled: no progress from any rank for \d+s; rank 2 is the odd one out: did not answer within "
                     r"5s: it is stopped \(process state T: SIGSTOP.*; restart 4 of 6 in ",
                     freeze.named), freeze.named
    assert "restart 5 of 6" not in text          # the sshd restart cost no attempt, nor did the disk
    assert disk.named.startswith("[rank 2 h3] warning: no space left on device for the next checkpoint in ")
    assert "[rank 2 h3] checkpoint: room again in " in text
    for fault in (kill, stop, drop, freeze, disk):
        assert fault.detected is not None and fault.recovered is not None, fault

    with open(tmp_path / "storm" / "runs" / storm.run_id / "summary.json") as f:
        summary = json.load(f)
    assert summary["exit_code"] == 0 and summary["restarts"] == 4
    attempts = summary["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "failed", "stalled", "stalled", "ok"], attempts
    assert [a["failed_host"] for a in attempts[:2]] == ["h2", "h2"]
    for attempt, fault in zip(attempts, (kill, stop, drop, freeze)):
        assert attempt["reason"] in fault.named, (attempt, fault.named)
    first = attempts[0]          # the killed rank is named, not the ranks that failed after losing it
    assert (first["world"], first["exit_code"], first["failed_rank"], first["failed_host"]) == (3, 137, 1, "h2")
    assert first["steps_lost"] >= 2 and first["resumed_from"] is None
    resumed = [int(a["resumed_from"].split("-")[1]) for a in attempts[1:]]
    assert resumed == sorted(resumed) and all(step % 10 == 0 and step >= 10 for step in resumed), resumed
    assert f"resumed from {cluster.workdir}/runs/{storm.run_id}/checkpoints/{attempts[1]['resumed_from']}" in text
    for k in range(5):                                      # each attempt's own logs
        assert (tmp_path / "storm" / "runs" / storm.run_id / f"attempt-{k}" / "rank-0.log").stat().st_size > 0
    # restart 3 waited for the link as long as it stayed down once run had named the stall (less the 2 s restart
    # delay; a probe's second or two after it came back), however long the naming took on a loaded machine
    down_after_named = DROP_S - (drop.detected - drop.injected)
    waited = attempts[3]["data_plane_wait_s"]
    assert attempts[2]["cause"] == "data plane" and down_after_named - 10 <= waited <= min(down_after_named + 5, 65), (
        down_after_named, attempts)

    # resume is exact: the storm's curve is the undisturbed run's, step for step, to its final loss
    calm_id = clirun.TOKEN.search(calm_out).group(1)
    got, reference = curve(tmp_path / "storm" / "runs" / storm.run_id), curve(tmp_path / "calm" / "runs" / calm_id)
    assert sorted(got) == list(range(1, TEST_STEPS + 1))
    assert got[TEST_STEPS] == reference[TEST_STEPS] and got == reference
    nothing_left(cluster, storm.run_id, (1, 2, 3))
    print(json.dumps([f.row(storm.began) for f in storm.faults], indent=1))      # seen with pytest -s
    print(f"the faults were over at step {storm.step} of {TEST_STEPS}")
