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
