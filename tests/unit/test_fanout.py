import threading
import time

from clusterctl.errors import ConnectError
from clusterctl.hosts.fanout import DeadlineExceeded, run_all
from clusterctl.hosts.transport import Result
from clusterctl.inventory import parse

HOSTS = parse("hosts: [a, b, c, d]\n", "i.yaml").hosts


def test_every_host_gets_an_outcome_in_rank_order_whatever_happens():
    def fn(host):
        if host.name == "a":
            raise ConnectError("a", "connection refused")
        if host.name == "b":
            raise RuntimeError("bug")
        if host.name == "c":
            return Result(1, "", "boom")
        return Result(0, "fine", "")

    group = run_all(HOSTS, fn, deadline=5)
    assert list(group) == ["a", "b", "c", "d"]
    assert isinstance(group["a"].error, ConnectError)
    assert isinstance(group["b"].error, RuntimeError)
    assert group["c"].value.exit_code == 1 and not group["c"].ok
    assert list(group.ok) == ["d"] and list(group.failed) == ["a", "b", "c"]
    assert not group.all_ok


def test_a_hung_host_is_cut_off_at_the_deadline_and_the_rest_still_report():
    def fn(host):
        if host.name == "b":
            time.sleep(30)
        return Result(0, host.name, "")

    start = time.monotonic()
    group = run_all(HOSTS, fn, deadline=0.5)
    elapsed = time.monotonic() - start
    # Waiting for the hung host would take its 30 s; the bound sits far below that and far above the
    # 0.5 s deadline, so a loaded machine cannot fail it (speed figures belong in benchmarks/).
    assert elapsed < 15, elapsed
    assert isinstance(group["b"].error, DeadlineExceeded)
    assert [group[n].value.stdout for n in "acd"] == ["a", "c", "d"]


def test_hosts_run_concurrently():
    # Each call returns only once all four are running at the same time: one after another, the first
    # would wait at the barrier until it broke, and every host would report BrokenBarrierError.
    all_four = threading.Barrier(len(HOSTS), timeout=20)
    group = run_all(HOSTS, lambda h: (all_four.wait(), Result(0, h.name, ""))[1], deadline=30)
    assert group.all_ok, {n: o.error for n, o in group.items()}
    assert [group[n].value.stdout for n in "abcd"] == ["a", "b", "c", "d"]


def test_in_background_hands_back_the_result_or_the_error_and_never_holds_up_exit():
    from clusterctl.hosts.fanout import in_background

    assert in_background(lambda a, b=0: a + b, 2, b=3).result(timeout=5) == 5
    failed = in_background(lambda: 1 / 0)
    assert isinstance(failed.exception(timeout=5), ZeroDivisionError)
    release = threading.Event()
    slow = in_background(release.wait)
    [thread] = [t for t in threading.enumerate() if t.name == "background-wait"]
    assert thread.daemon and not slow.done()       # a daemon: the interpreter does not join it at exit
    release.set()
    assert slow.result(timeout=5) is True


def test_a_deferred_runs_only_once_started_or_waited_for_and_in_background_at_once():
    from clusterctl.hosts.fanout import Deferred, in_background

    ran = []
    later = Deferred(lambda: ran.append("later") or 1)
    time.sleep(0.1)
    assert ran == [] and not later.started and not later.done()
    later.start()
    later.start()                               # once, however often it is started
    assert later.result(timeout=5) == 1 and ran == ["later"]
    waited = Deferred(lambda: 2)
    assert waited.result(timeout=5) == 2 and waited.started      # the first wait starts it
    failing = Deferred(lambda: 1 / 0)
    assert isinstance(failing.exception(timeout=5), ZeroDivisionError)
    now = in_background(lambda: "now")
    assert now.started and now.result(timeout=5) == "now"
