"""Restart decisions (launch/restart.py), the elastic sub-cluster, the ranks' restart variables and the
trainer's batch policy after a world change: pure functions on canned inputs."""
import os
import sys

import pytest

from clusterctl.errors import UsageError
from clusterctl.inventory import Cluster, Host
from clusterctl.launch.job import rank_environment
from clusterctl.launch.outcome import AttemptState, Outcome
from clusterctl.launch.plan import LaunchPlan
from clusterctl.launch.restart import RestartPolicy


def cluster(*slots):
    hosts, rank = [], 0
    for i, n in enumerate(slots, 1):
        hosts.append(Host(name=f"h{i}", rank=rank, line=i, slots=n, workdir="~/w"))
        rank += n
    return Cluster("inv.yaml", tuple(hosts))


def test_a_subset_keeps_inventory_order_and_renumbers_ranks():
    c = cluster(1, 2, 1)
    sub = c.subset(["h3", "h1"])
    assert [(h.name, h.rank) for h in sub.hosts] == [("h1", 0), ("h3", 1)]
    assert sub.world_size == 2
    sub = c.subset(["h2", "h3"])
    assert [(h.name, h.rank, h.slots) for h in sub.hosts] == [("h2", 0, 2), ("h3", 2, 1)]
    assert c.subset([]).world_size == 0


def test_the_policy_restarts_failures_until_used_up_but_never_a_users_stop():
    p = RestartPolicy(max_restarts=2)
    failed, lost = AttemptState.FAILED, AttemptState.LOST
    assert p.should_restart(failed, 0) and p.should_restart(lost, 1)
    assert not p.should_restart(failed, 2)                        # used up
    assert not p.should_restart(AttemptState.SUCCEEDED, 0)        # succeeded
    assert not p.should_restart(AttemptState.STOPPED, 0)          # Ctrl-C / SIGTERM
    assert not RestartPolicy().should_restart(failed, 0)          # off by default: today's behaviour
    # an outcome's state follows from its exit code unless the supervisor says more
    assert Outcome(1, "x").state is failed and Outcome(0, "x").state is AttemptState.SUCCEEDED
    assert RestartPolicy(2, elastic=3).world_ok(3) and not RestartPolicy(2, elastic=3).world_ok(2)
    assert RestartPolicy(2).world_ok(1)


@pytest.mark.parametrize("policy, kwargs, message", [
    (RestartPolicy(elastic=2), {}, "give --max-restarts N too"),
    (RestartPolicy(1, elastic=5), {}, "between 1 and the cluster's 4"),
    (RestartPolicy(1, elastic=2), {"preflight": False}, "drop --no-preflight"),
    (RestartPolicy(1, elastic=2), {"backend": "jaccl"}, "cannot shrink a jaccl world"),
    (RestartPolicy(1, elastic=2), {"shrink_refusal": "the program's own reason"}, "the program's own reason"),
    (RestartPolicy(1, batch="both"), {}, "one of rank, global"),
    (RestartPolicy(-1), {}, "give 0 or more"),
    (RestartPolicy(1, data_plane_wait_s=-5), {}, "--data-plane-wait -5: give 0 or more seconds"),
    (RestartPolicy(1, host_wait_s=-1), {}, "--host-wait -1: give 0 or more seconds"),
])
def test_combinations_that_cannot_work_are_refused_before_anything_starts(policy, kwargs, message):
    args = {"world": 4, "backend": "ring", "preflight": True, **kwargs}
    with pytest.raises(UsageError, match=message):
        policy.check(**args)


def test_what_works_passes_the_check():
    RestartPolicy(1, elastic=2).check(world=4, backend="mpi", preflight=True)
    RestartPolicy(3).check(world=4, backend="jaccl", preflight=False, shrink_refusal="sharded")   # same world: fine
    RestartPolicy().check(world=1, backend="ring", preflight=True)


def test_restart_variables_only_for_a_restartable_run():
    c = cluster(1, 1)
    plain = rank_environment(c, LaunchPlan(), "id", "/local/runs/id")
    assert "CLUSTERCTL_RESTART" not in plain and "CLUSTERCTL_RESUME_DIR" not in plain
    first = rank_environment(c, LaunchPlan(), "id", "/local/runs/id", restart=0)
    assert first["CLUSTERCTL_RESTART"] == "0" and "CLUSTERCTL_RESUME_DIR" not in first
    again = rank_environment(c, LaunchPlan(), "id", "/local/runs/id", restart=2)
    assert again["CLUSTERCTL_RESTART"] == "2" and again["CLUSTERCTL_RESUME_DIR"] == again["CLUSTERCTL_RUN_DIR"] == "runs/id"


def test_the_global_batch_policy_changes_accum_to_keep_the_global_batch():
    pytest.importorskip("mlx.core")
    from clusterctl.train.config import ConfigError, resolve
    from clusterctl.train.trainer import elastic_batch

    config = resolve(["--accum", "2"])[0]
    resumed = {"world_size": 3, "config": {"accum": 2}}
    assert elastic_batch(config, resumed, 2, "global").accum == 3        # 2 x 3 = 6 micro-batches, over 2 ranks
    assert elastic_batch(config, resumed, 2, "rank").accum == 2          # each rank keeps its batch
    assert elastic_batch(config, {"world_size": 2, "config": {"accum": 2}}, 2, "global").accum == 2
    with pytest.raises(ConfigError, match="cannot share equally"):
        elastic_batch(config, {"world_size": 3, "config": {"accum": 1}}, 2, "global")


def test_a_restart_waits_for_a_host_that_may_come_back_not_for_one_that_refuses_us():
    from clusterctl.errors import ConnectError, PreflightError

    p = RestartPolicy(2)
    for reason in ("refused", "timeout", "no-banner", "dropped"):      # rebooting, asleep, waking
        assert p.waits_for(ConnectError("h2", "x", reason)), reason
    for reason in ("auth", "host-key-changed", "resolve", "unknown-host-key", "other"):
        assert not p.waits_for(ConnectError("h2", "x", reason)), reason
    assert not p.waits_for(PreflightError("h2: no python3"))         # it answered: nothing to wait for
    assert not RestartPolicy(2, host_wait_s=0).waits_for(ConnectError("h2", "x", "refused"))
    assert not RestartPolicy(2, elastic=1).waits_for(ConnectError("h2", "x", "refused"))   # goes on without it


def test_the_restarts_recheck_asks_a_host_again_until_it_answers_or_host_wait_runs_out(monkeypatch):
    from clusterctl.errors import ConnectError
    from clusterctl.launch import attempts

    monkeypatch.setattr(attempts, "HOST_POLL_S", 0.05)
    told = []

    class Hooks:
        def host_down(self, launch, restart, host, detail):
            told.append(("down", restart, host, detail))

        def host_up(self, launch, restart, host, waited_s):
            told.append(("up", restart, host, waited_s))

    def recheck(answers_after):
        calls = []

        def asked(whole, before):
            calls.append(1)
            if len(calls) <= answers_after:
                raise ConnectError("h2", "connection refused at 10.0.0.2:22", "refused")
            return "cluster", "connector", "plan"
        return asked

    def attempts_with(policy, answers_after):
        a = attempts.Attempts.__new__(attempts.Attempts)
        a.policy, a.hooks, a.restarts, a.cluster = policy, Hooks(), 1, None
        a._recheck = recheck(answers_after)
        return a

    assert attempts_with(RestartPolicy(1, host_wait_s=5), 3)._recheck_waiting(None, "launch") == \
        ("cluster", "connector", "plan")
    assert [t[:3] for t in told] == [("down", 1, "h2"), ("up", 1, "h2")] and 0.1 < told[1][3] < 5
    told.clear()
    with pytest.raises(ConnectError, match="connection refused"):
        attempts_with(RestartPolicy(1, host_wait_s=0.2), 1000)._recheck_waiting(None, "launch")
    assert told == [("down", 1, "h2", "connection refused at 10.0.0.2:22"), ("up", 1, "h2", None)]
    told.clear()
    with pytest.raises(ConnectError):                       # a key refused: no wait, nothing said
        a = attempts_with(RestartPolicy(1), 1000)
        a._recheck = lambda whole, before: (_ for _ in ()).throw(ConnectError("h2", "refused our keys", "auth"))
        a._recheck_waiting(None, "launch")
    assert told == []


def test_the_pre_flight_keeps_the_reason_ssh_gave():
    from clusterctl.errors import ConnectError
    from clusterctl.launch import plan

    with pytest.raises(ConnectError) as raised:
        plan._raise("h2", ConnectError("h2", "connection refused at 10.0.0.2:22", "refused"))
    assert raised.value.reason == "refused" and raised.value.host == "h2"
    assert str(raised.value).startswith("h2: connection refused at 10.0.0.2:22 (run `clusterctl doctor`")


def test_a_restartable_run_watches_for_silent_hosts_unless_told_otherwise():
    assert RestartPolicy(2).hang_timeout(None) == 60.0
    assert RestartPolicy(2).hang_timeout(5.0) == 5.0
    assert RestartPolicy().hang_timeout(None) is None          # today's behaviour without --max-restarts


def test_a_rank_that_died_without_reporting_is_described_by_its_status():
    from clusterctl.launch.ranklines import _lost

    assert _lost(137) == "was killed by SIGKILL" and _lost(-9) == "was killed by SIGKILL"
    assert _lost(143) == "was killed by SIGTERM"
    assert _lost(255).startswith("lost its ssh connection (status 255)")
    assert _lost(3) == "ended with status 3 without reporting its exit"


def test_a_fault_a_restart_cannot_fix_is_not_restarted_and_says_why():
    from clusterctl.launch import causes
    from clusterctl.launch.attempts import unfixable

    def failed(kind, step=None):
        return Outcome(1, "rank 1 on h2 exited 1", failed_rank=1, cause=causes.Cause(kind, "the line"), step=step)

    assert unfixable(failed(causes.DISK_FULL), None) == "a restart would meet the same disk full"
    assert unfixable(failed(causes.MISSING_FILE), None) == "a restart would meet the same missing file"
    assert unfixable(failed(causes.PEER_LOST), None) is None and unfixable(failed(causes.OTHER), None) is None
    killed = Outcome(137, "rank 1 on h2 was killed by SIGKILL", failed_rank=1, ended_as=AttemptState.LOST)
    assert unfixable(killed, None) is None
    # out of memory: one restart; at the same step again, none
    assert unfixable(failed(causes.OUT_OF_MEMORY, 40), None) is None
    assert unfixable(failed(causes.OUT_OF_MEMORY, 40), failed(causes.OUT_OF_MEMORY, 20)) is None
    assert unfixable(failed(causes.OUT_OF_MEMORY, 40), failed(causes.OUT_OF_MEMORY, 40)) == \
        "out of memory at step 40 twice: the next attempt would run out there again"


def test_a_restart_after_a_data_plane_fault_waits_until_every_host_reaches_the_others(monkeypatch):
    """launch/dataplane.py's wait, its probe replaced by answers recorded from hosts/scripts/dataplane.py (the link
    down: connect fails with EINVAL through a blackhole route; then up), on a clock that only sleeps advance."""
    from clusterctl.inventory import parse
    from clusterctl.launch import dataplane

    cluster = parse("hosts:\n  - {name: h1, address: 10.0.0.1}\n  - {name: h2, address: 10.0.0.2}\n", "i.yaml")
    down = {"h1": {"address": "10.0.0.1", "port": 32323, "bind": None, "accepted": [],
                   "connect": {"h2": {"ok": False, "error": "[Errno 22] Invalid argument"}}},
            "h2": {"address": "10.0.0.2", "port": 32324, "bind": None, "accepted": [],
                   "connect": {"h1": {"ok": False, "error": "[Errno 22] Invalid argument"}}}}
    up = {"h1": {"address": "10.0.0.1", "port": 32323, "bind": None, "accepted": ["h2"], "connect": {"h2": {"ok": True}}},
          "h2": {"address": "10.0.0.2", "port": 32324, "bind": None, "accepted": ["h1"], "connect": {"h1": {"ok": True}}}}
    assert dataplane.broken(cluster, down) == ["h1 -> h2 (10.0.0.2:32324): [Errno 22] Invalid argument",
                                               "h2 -> h1 (10.0.0.1:32323): [Errno 22] Invalid argument"]
    assert dataplane.broken(cluster, up) == []
    assert dataplane.broken(cluster, {"h1": None, "h2": {**up["h2"], "bind": "[Errno 98] Address already in use"}}) == [
        "h1: the probe did not run", "h2 cannot listen on 10.0.0.2:32324: [Errno 98] Address already in use"]

    class Connector:
        connect_timeout = 3.0

        def __init__(self, cluster):
            self.cluster = cluster

    now = [0.0]
    answers = []
    monkeypatch.setattr(dataplane, "probe", lambda cluster, hosts, run, budget: answers.pop(0))
    told = []
    answers[:] = [down, down, down, up]          # back at the fourth probe, after 3 polls
    waited = dataplane.wait_until_up(Connector(cluster), 60, told.append, clock=lambda: now[0],
                                     sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert waited == 3 * dataplane.POLL_S and len(told) == 1 and told[0][0].startswith("h1 -> h2 (10.0.0.2:32324)")
    answers[:] = [down] * 10                      # never back within the limit: None, after at most limit seconds
    now[0] = 0.0
    assert dataplane.wait_until_up(Connector(cluster), 12, told.append, clock=lambda: now[0],
                                   sleep=lambda s: now.__setitem__(0, now[0] + s)) is None
    assert now[0] <= 12
    answers[:] = [up]
    assert dataplane.wait_until_up(Connector(cluster), 60, told.append, clock=lambda: now[0], sleep=None) == 0.0
    one = parse("hosts:\n  - {name: h1, address: 10.0.0.1}\n", "i.yaml")          # nothing to ask: one host
    assert dataplane.wait_until_up(Connector(one), 60, told.append) == 0.0


def test_a_host_wait_is_recorded_on_the_pre_flight_that_gave_up_or_else_on_the_attempt_it_let_start():
    """summary.json: a wait that ran out belongs to the failed pre-flight's record, not to a later attempt."""
    from clusterctl.errors import ConnectError
    from clusterctl.run.events import RunEvents
    from clusterctl.run.hooks import RunHooks

    kept = []
    hooks = RunHooks.__new__(RunHooks)
    hooks.policy, hooks.events, hooks.host_waited = RestartPolicy(2, host_wait_s=30), RunEvents(), None
    hooks.record = type("Record", (), {"attempt": lambda self, record: kept.append(record)})()
    hooks.host_up("launch", 1, "h2", None)                    # restart 1: h2 never answered
    hooks.recheck_failed(1, ConnectError("h2", "connection refused", "refused"))
    assert kept[0]["outcome"] == "pre-flight failed" and kept[0]["host_wait_s"] == 30
    assert hooks.host_waited is None                          # nothing left over for the next attempt's record
    hooks.recheck_failed(2, ConnectError("h2", "refused our keys", "auth"))
    assert "host_wait_s" not in kept[1]
    hooks.host_up("launch", 2, "h2", 12.34)                   # answered: the attempt launched next carries it
    assert hooks.host_waited == 12.34
