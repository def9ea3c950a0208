"""The stall watchdog's bookkeeping (launch/stall.py) on canned times, and the stacks' parsing and grouping
(launch/stacks.py) on answers recorded from hosts/scripts/stacks.py during a real stall: `clusterctl run
--stall-timeout 60 stall.py` on 2 local ranks over ring, rank 1 in time.sleep, rank 0 waiting in all_sum."""
import json
import os

import pytest

from clusterctl.errors import UsageError
from clusterctl.launch.stacks import RankStacks, Stacks, parse_dump
from clusterctl.launch.stall import ADAPTIVE_FLOOR_S, ADAPTIVE_MULTIPLE, StallPolicy, StallWatch

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "stacks")


# ---- the policy --------------------------------------------------------------------------------------------
def test_the_flag_parses_to_adaptive_fixed_or_off():
    assert StallPolicy.parse(None) == StallPolicy()
    assert StallPolicy.parse(20).fixed == 20.0
    assert not StallPolicy.parse(0).enabled
    with pytest.raises(UsageError, match="--stall-timeout -1"):
        StallPolicy.parse(-1)


# ---- fixed -------------------------------------------------------------------------------------------------
def test_fixed_timeout_counts_from_the_start_of_every_rank_without_any_output():
    watch = StallWatch(StallPolicy.parse(20))
    assert watch.check(1000.0) is None                 # nothing started yet
    watch.started(100.0)
    assert watch.check(119.0) is None
    stall = watch.check(121.0)
    assert stall is not None and stall.silent_s == pytest.approx(21.0) and stall.timeout_s == 20.0


def test_any_line_of_any_rank_is_progress():
    watch = StallWatch(StallPolicy.parse(20))
    watch.started(0.0)
    for t in range(0, 100, 10):
        watch.progress(t % 2, float(t))
    assert watch.check(109.0) is None
    assert watch.check(111.0) is not None


def test_no_stall_once_no_rank_runs():
    watch = StallWatch(StallPolicy.parse(20))
    watch.started(0.0)
    assert watch.check(50.0, live=0) is None
    assert watch.check(50.0, live=1) is not None


def test_off_never_fires():
    watch = StallWatch(StallPolicy.parse(0))
    watch.started(0.0)
    watch.progress(0, 1.0, structured=True)
    assert watch.check(1e9) is None and watch.stragglers(1e9) == []


# ---- adaptive ----------------------------------------------------------------------------------------------
def test_adaptive_leaves_a_program_without_metrics_lines_alone_however_long():
    watch = StallWatch(StallPolicy())
    watch.started(0.0)
    watch.progress(0, 5.0)                 # ordinary lines: a server's startup banner
    assert watch.check(10 * 24 * 3600.0) is None


def test_adaptive_arms_at_the_first_metrics_line_with_the_floor():
    watch = StallWatch(StallPolicy())
    watch.started(0.0)
    watch.progress(0, 2.0, structured=True)
    for t in range(3, 60):
        watch.progress(0, float(t), structured=True)
    assert watch.timeout() == ADAPTIVE_FLOOR_S
    assert watch.check(59.0 + ADAPTIVE_FLOOR_S - 1) is None
    assert watch.check(59.0 + ADAPTIVE_FLOOR_S + 1) is not None


def test_adaptive_grows_with_the_longest_gap_the_start_included():
    watch = StallWatch(StallPolicy())
    watch.started(0.0)
    watch.progress(0, 40.0, structured=True)      # 40 s from the start to the first step
    assert watch.timeout() == max(ADAPTIVE_FLOOR_S, ADAPTIVE_MULTIPLE * 40.0)
    watch.progress(0, 100.0, structured=True)     # then a 60 s gap
    assert watch.timeout() == ADAPTIVE_MULTIPLE * 60.0


def test_an_announced_quiet_phase_holds_the_verdict_and_does_not_stretch_the_timeout():
    watch = StallWatch(StallPolicy())
    watch.started(0.0)
    for t in range(1, 11):
        watch.progress(1, float(t), structured=True)
    watch.quiet(1, 10.0, 180.0)                  # a three-minute evaluation, announced
    assert watch.check(10.0 + 179.0) is None     # past the 120 s floor: still quiet
    watch.progress(1, 10.0 + 175.0, structured=True)    # the phase ends with the rank's next step
    assert watch.timeout() == ADAPTIVE_FLOOR_S   # the 175 s gap ended a quiet phase: not counted
    assert watch.check(185.0 + ADAPTIVE_FLOOR_S + 1) is not None


def test_a_quiet_phase_that_runs_out_is_a_stall():
    watch = StallWatch(StallPolicy.parse(20))
    watch.started(0.0)
    watch.progress(0, 1.0, structured=True)
    watch.quiet(0, 1.0, 60.0)
    assert watch.check(50.0) is None
    assert watch.check(62.0) is not None


def test_a_rank_that_ends_drops_its_quiet_phase():
    watch = StallWatch(StallPolicy.parse(20))
    watch.started(0.0)
    watch.quiet(0, 1.0, 600.0)
    watch.ended(0)
    assert watch.check(30.0) is not None


# ---- stragglers --------------------------------------------------------------------------------------------
def test_a_rank_that_stops_while_the_others_go_on_is_named_once():
    watch = StallWatch(StallPolicy.parse(20))
    watch.started(0.0)
    for t in range(1, 40):
        for rank in (0, 1, 2):
            if rank != 2 or t < 10:
                watch.progress(rank, float(t), structured=True)
        if t == 15:
            assert watch.stragglers(float(t)) == []          # 6 s behind: under half the timeout (10 s)
    named = watch.stragglers(39.0)
    assert [rank for rank, _ in named] == [2] and named[0][1] == pytest.approx(30.0)
    assert watch.stragglers(40.0) == []                      # once
    assert watch.check(39.5) is None                         # the others progress: not a stall
    watch.progress(2, 41.0, structured=True)                 # caught up: may be named again later
    assert 2 not in watch.lagging


def test_ranks_that_never_report_metrics_are_not_stragglers():
    watch = StallWatch(StallPolicy.parse(20))
    watch.started(0.0)
    watch.progress(1, 1.0)                                   # one line at the start, then silence
    for t in range(2, 60):
        watch.progress(0, float(t), structured=True)         # rank 0 alone prints
    assert watch.stragglers(60.0) == []


# ---- stacks ------------------------------------------------------------------------------------------------
def recorded() -> list[RankStacks]:
    with open(os.path.join(FIXTURES, "linux-ring-2ranks.json"), encoding="utf-8") as f:
        answer = json.load(f)
    return [RankStacks(e["rank"], "h1", e["pid"], e["text"], e["source"], e["kinds"], e["native"], e["error"])
            for e in answer]


def test_a_dump_parses_into_threads_and_the_main_one_is_the_bootstraps():
    rank0 = recorded()[0]
    main, threads = parse_dump(rank0.text)
    assert main is not None and main in {t.ident for t in threads}
    assert len(threads) == 4           # main, the heartbeat, the stdout and stderr pumps
    frames = rank0.main_thread().frames
    assert frames[0].file.endswith("stall.py") and frames[0].line == 10 and frames[0].function == "<module>"


def test_each_rank_is_summed_up_by_its_innermost_program_frame_with_its_code():
    rank0, rank1 = recorded()
    assert rank0.where() == "mx.eval(x) at stall.py:10"
    assert rank1.where() == "time.sleep(3600) at stall.py:8"


def test_ranks_in_one_place_are_grouped_and_the_odd_one_named():
    rank0, rank1 = recorded()
    rank2 = RankStacks(2, "h3", 99, rank0.text, rank0.source, rank0.kinds)   # a third rank where rank 0 is
    stacks = Stacks("20261125-075509-df03ef", 0.0, [rank0, rank1, rank2])
    assert stacks.groups() == [("mx.eval(x) at stall.py:10", [0, 2]), ("time.sleep(3600) at stall.py:8", [1])]
    assert stacks.odd_one_out() == (1, "time.sleep(3600) at stall.py:8")
    screen = "\n".join(stacks.screen())
    assert "ranks 0, 2  mx.eval(x) at stall.py:10" in screen
    assert "rank 1      time.sleep(3600) at stall.py:8   <- the odd one out" in screen


def test_two_ranks_in_two_places_have_no_odd_one():
    assert Stacks("x", 0.0, recorded()).odd_one_out() is None


def test_a_rank_file_shows_the_main_thread_first_with_each_frames_code(tmp_path):
    stacks = Stacks("20261125-075509-df03ef", 0.0, recorded())
    folder = stacks.save(str(tmp_path))
    text = open(os.path.join(folder, "rank-1.txt"), encoding="utf-8").read()
    first_thread = text.split("\n\n")[1]
    assert "(main thread)" in first_thread and "stall.py\", line 8 in <module>\n    time.sleep(3600)" in first_thread
    assert sorted(os.listdir(folder)) == ["rank-0.txt", "rank-1.txt", "stacks.json"]
    assert Stacks("20261125-075509-df03ef", 0.0, recorded()).save(str(tmp_path)) != folder   # never overwritten


def test_the_stacks_saved_last_read_back_give_the_screen_they_gave_when_taken(tmp_path):
    assert Stacks.newest(str(tmp_path)) is None
    first = Stacks("20261125-075509-df03ef", 100.0, recorded())
    first.save(str(tmp_path))
    last = Stacks("20261125-075509-df03ef", 200.0, recorded()[:1], errors={"h3": "connection refused"})
    last.save(str(tmp_path / "attempt-1"))           # a restartable run's attempt keeps its stall's
    back = Stacks.newest(str(tmp_path))
    assert back.folder == last.folder and back.taken == 200.0 and back.errors == {"h3": "connection refused"}
    assert back.screen() == last.screen() and [r.where() for r in back.ranks] == ["mx.eval(x) at stall.py:10"]
    with open(os.path.join(last.folder, "stacks.json"), "w") as f:
        f.write("{not json")                        # a damaged file: the one before it
    assert Stacks.newest(str(tmp_path)).folder == first.folder


def test_a_rank_without_a_python_stack_says_why():
    r = RankStacks(3, "h4", 7, "", error="did not answer within 5s (its dump, if any, is incomplete)")
    assert r.where().startswith("did not answer")


# ---- a service: health answers are its progress (serve) ----------------------------------------------------
def _health():
    return None


def test_a_service_is_never_stalled_before_its_endpoint_first_answers_however_long_it_loads():
    watch = StallWatch(StallPolicy.parse(None, health=_health))
    watch.started(0.0)
    for t in range(0, 3600, 7):
        watch.progress(0, float(t), structured=True)        # lines and even metrics lines are not progress
    assert not watch.armed and watch.check(3600.0) is None
    fixed = StallWatch(StallPolicy.parse(20, health=_health))
    fixed.started(0.0)
    assert not fixed.armed and fixed.check(1000.0) is None


def test_an_idle_service_that_answers_is_never_stalled_and_one_that_stops_answering_is():
    watch = StallWatch(StallPolicy.parse(None, health=_health))
    watch.started(0.0)
    watch.answered(300.0)                  # the model took 300 s to load: that wait is no gap
    for t in range(305, 4 * 3600, 5):      # hours of silence on every rank's output, health every 5 s
        watch.answered(float(t))
        assert watch.check(t + 1.0) is None
    last = float(t)
    assert watch.timeout() == ADAPTIVE_FLOOR_S
    assert watch.check(last + ADAPTIVE_FLOOR_S - 1) is None
    stall = watch.check(last + ADAPTIVE_FLOOR_S + 1)
    assert stall is not None and stall.silent_s == pytest.approx(ADAPTIVE_FLOOR_S + 1)


def test_a_fixed_timeout_for_a_service_counts_from_its_last_answer():
    watch = StallWatch(StallPolicy.parse(30, health=_health))
    watch.started(0.0)
    watch.answered(50.0)
    assert watch.check(79.0) is None and watch.check(81.0) is not None
    off = StallWatch(StallPolicy.parse(0, health=_health))
    off.started(0.0)
    off.answered(1.0)
    assert off.check(10_000.0) is None


def test_the_policy_says_where_a_services_progress_comes_from():
    assert "first health answer" in StallPolicy.parse(None, health=_health).describe()
    assert StallPolicy.parse(None, health=_health) == StallPolicy.parse(None)     # the probe is not the policy


def test_every_rank_at_one_place_on_several_hosts_is_a_wait_for_each_other_that_points_to_the_data_plane():
    from clusterctl.launch.supervise import waiting_together

    rank0 = recorded()[0]
    both = [rank0, RankStacks(1, "h2", 98, rank0.text, rank0.source, rank0.kinds)]      # rank 1 where rank 0 is
    stacks = Stacks("x", 0.0, both)
    assert stacks.together() == "mx.eval(x) at stall.py:10" and stacks.odd_one_out() is None
    assert Stacks("x", 0.0, [rank0, RankStacks(1, "h1", 98, rank0.text, rank0.source, rank0.kinds)]).together() is None
    assert Stacks("x", 0.0, recorded()).together() is None                       # two places
    said = waiting_together(stacks.together(), {"h1": 0.4, "h2": 1.2})
    assert said == ("every rank waits at the same place (mx.eval(x) at stall.py:10): in a collective, for each other, "
                    "which usually means the link between the hosts (the data plane): check it with `clusterctl doctor "
                    "--data-plane`; the hosts' last heartbeats: h1 0s ago, h2 1s ago")


def test_ranks_each_in_a_collective_of_its_own_on_several_hosts_wait_for_each_other_none_is_odd():
    from clusterctl.launch.supervise import waiting_together

    rank0, rank1 = recorded()
    reduced = {**rank1.source, "/tmp/st/stall.py:8": "mx.distributed.all_max(y)"}     # rank 1 in the next collective
    apart = Stacks("x", 0.0, [rank0, RankStacks(1, "h2", 98, rank1.text, reduced, rank1.kinds),
                              RankStacks(2, "h2", 99, rank0.text, rank0.source, rank0.kinds)])
    assert apart.together() is None and apart.odd_one_out() == (1, "mx.distributed.all_max(y) at stall.py:8")
    assert apart.in_collectives() == "ranks 0, 2: mx.eval(x) at stall.py:10; rank 1: mx.distributed.all_max(y) at stall.py:8"
    said = waiting_together(apart.in_collectives(), {"h1": 0.4, "h2": 1.2}, len(apart.groups()))
    assert said.startswith("every rank waits in one of 2 collectives (ranks 0, 2: mx.eval(x) at stall.py:10; rank 1: "
                           "mx.distributed.all_max(y) at stall.py:8): in a collective, for each other, which usually "
                           "means the link between the hosts (the data plane)")
    # a rank asleep outside any collective is the odd one out, not a wait for each other
    asleep = Stacks("x", 0.0, [rank0, RankStacks(1, "h2", 98, rank1.text, rank1.source, rank1.kinds),
                               RankStacks(2, "h2", 99, rank0.text, rank0.source, rank0.kinds)])
    assert asleep.in_collectives() is None and asleep.odd_one_out() == (1, "time.sleep(3600) at stall.py:8")
    # one host: no link between hosts to blame
    assert Stacks("x", 0.0, [rank0, RankStacks(1, "h1", 98, rank1.text, reduced, rank1.kinds)]).in_collectives() is None


def test_a_rank_frozen_partway_through_a_collective_is_the_odd_one_out_of_ranks_left_in_two():
    """Rank 2 stopped partway through a ring collective: rank 1 finished it and waits in the next one, rank 0 in
    the first (a storm under load met this: no odd one out was named before)."""
    rank0, rank1 = recorded()
    reduced = {**rank1.source, "/tmp/st/stall.py:8": "mx.distributed.all_max(y)"}     # rank 1 in the next collective
    stopped = "did not answer within 5s: it is stopped (process state T: SIGSTOP or a debugger)"
    frozen = [rank0, RankStacks(1, "h2", 98, rank1.text, reduced, rank1.kinds),
              RankStacks(2, "h3", 99, "", error=stopped)]
    stacks = Stacks("x", 0.0, frozen)
    assert len(stacks.groups()) == 3 and stacks.in_collectives() is None and stacks.together() is None
    assert stacks.odd_one_out() == (2, stopped)
    assert f"rank 2  {stopped}   <- the odd one out" in "\n".join(stacks.screen())
    # two ranks outside any collective: neither is singled out
    asleep = RankStacks(1, "h2", 98, rank1.text, rank1.source, rank1.kinds)
    assert Stacks("x", 0.0, [rank0, asleep, RankStacks(2, "h3", 99, "", error=stopped)]).odd_one_out() is None
    # two ranks, one in a collective: as before, no odd one (the rule needs others that agree)
    assert Stacks("x", 0.0, [rank0, RankStacks(2, "h3", 99, "", error=stopped)]).odd_one_out() is None


def test_a_quiet_phase_of_a_kind_already_timed_is_announced_at_ten_times_its_longest_within_bounds():
    from clusterctl.train.callbacks import QUIET_MIN_S, QUIET_S, quiet_for

    assert quiet_for(None) == QUIET_S                # never timed: the long default
    assert quiet_for(0.3) == QUIET_MIN_S             # a quick checkpoint: a minute, not ten
    assert quiet_for(12.0) == 120.0
    assert quiet_for(300.0) == QUIET_S               # capped


def test_progress_times_each_kind_of_quiet_phase_and_announces_from_it(monkeypatch):
    from clusterctl.train import callbacks

    said, clock = [], [100.0]
    monkeypatch.setattr(callbacks, "watched", lambda: True)
    monkeypatch.setattr(callbacks, "report", lambda **kw: said.append(kw))
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    p = callbacks.Progress(100)
    p.on_step(1, None, None)
    p.on_quiet(20, "checkpoint")
    clock[0] += 2.0                                   # the checkpoint took 2 s
    p.on_step(21, None, None)
    p.on_quiet(40, "checkpoint")
    p.on_quiet(40, "evaluation")                      # never timed: the default
    quiet = [kw["quiet_s"] for kw in said if "quiet_s" in kw]
    assert quiet == [callbacks.QUIET_S, callbacks.QUIET_S, 60.0, callbacks.QUIET_S], said


def test_a_rank_that_does_not_answer_is_told_by_its_process_state():
    """hosts/scripts/stacks.py's state(): a real process stopped with SIGSTOP reads as stopped (ps -o stat=, which
    procps and macOS's ps both answer); running again, nothing is said."""
    import signal
    import subprocess
    import time

    from clusterctl.hosts.scripts import stacks as script

    proc = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while script.state(proc.pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert script.state(proc.pid).startswith("it is stopped (process state T: SIGSTOP")
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.1)
        assert script.state(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()
    assert script.state(proc.pid) is None            # gone: ps prints nothing
