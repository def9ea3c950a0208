"""A long copy's progress (cli/console.py TransferProgress): off a terminal, a plain line per host every few seconds
with the rate and the time left, one when a host ends, and a host that moves nothing for a while named once; on a
terminal the same figures on each host's bar. A fake clock, the lines collected: nothing sleeps."""
from clusterctl.cli.console import TransferProgress

MB = 2**20


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def made(**kw):
    clock, said = Clock(), []
    return TransferProgress("model", terminal=False, clock=clock, say=said.append, **kw), clock, said


def test_plain_lines_every_few_seconds_with_the_rate_and_the_time_left_then_one_at_the_end():
    p, clock, said = made(every=5, stall=30)
    p.update("h1", 0, 100 * MB)
    p.update("h2", 0, 100 * MB)
    clock.now += 2
    p.update("h1", 20 * MB, 100 * MB)
    p.tick()
    assert said == []                                          # not yet 5 s since the start
    clock.now += 3
    p.update("h2", 10 * MB, 100 * MB)
    p.tick()
    assert said == ["model: h1: 20.0 MiB of 100.0 MiB (20%), 4.0 MiB/s, 20 s left",
                    "model: h2: 10.0 MiB of 100.0 MiB (10%), 2.0 MiB/s, 45 s left"]
    clock.now += 5
    p.update("h1", 100 * MB, 100 * MB)                         # ended: its own line, at once
    assert said[-1] == "model: h1: 100.0 MiB copied, 10.0 MiB/s"
    p.tick()
    assert said[-1].startswith("model: h2: 10.0 MiB of 100.0 MiB") and len(said) == 4    # h1 says no more


def test_a_host_that_moves_nothing_is_named_once_and_small_copies_say_nothing():
    p, clock, said = made(every=1000, stall=30)
    p.update("h1", 0, 100 * MB)
    p.update("h1", 5 * MB, 100 * MB)
    clock.now += 29
    p.tick()
    assert said == []
    clock.now += 1
    p.tick()
    clock.now += 10
    p.tick()
    assert said == ["model: h1: no progress for 30 s (at 5.0 MiB of 100.0 MiB): the copy to h1 is stuck or very slow"]
    clock.now += 1
    p.update("h1", 6 * MB, 100 * MB)                           # it moves again: a later stall is named again
    clock.now += 31
    p.tick()
    assert len(said) == 2 and said[-1].startswith("model: h1: no progress for 31 s (at 6.0 MiB")
    q, clock, said = made(every=1, stall=1)
    q.update("h1", 0, 1000)                                     # below the threshold: a summary line is enough
    clock.now += 10
    q.tick()
    q.update("h1", 1000, 1000)
    assert said == []


def test_on_a_terminal_each_hosts_bar_carries_the_rate_and_the_time_left():
    drawn = {}

    class Bars:
        def update(self, name, done, total, note=""):
            drawn[name] = (done, total, note)

        def close(self):
            drawn["closed"] = True

    clock = Clock()
    p = TransferProgress("store", terminal=True, clock=clock, say=lambda line: None, draw=Bars())
    p.update("h1", 0, 100 * MB)
    clock.now += 4
    p.update("h1", 40 * MB, 100 * MB)
    assert drawn["store: h1"] == (40 * MB, 100 * MB, "10.0 MiB/s, 6 s left")
    p.close()
    assert drawn["closed"]


def test_a_total_that_is_an_upper_bound_shows_nothing_until_bytes_move_and_the_end_says_what_moved():
    """run's project copy over rsync: the total is every byte the project ships, known before the copy; rsync's
    quick check on the host moves only what changed, and each host's last report is (moved, moved)."""
    p, clock, said = made(every=5, stall=30)
    p.update("h1", 0, 100 * MB)                  # all there already: rsync says 0 until it ends
    p.update("h2", 0, 100 * MB)                  # a new host: everything moves
    clock.now += 2
    p.update("h2", 10 * MB, 100 * MB)
    clock.now += 4
    p.tick()
    assert said == ["model: h2: 10.0 MiB of 100.0 MiB (10%), 1.7 MiB/s, 54 s left"]      # h1: nothing to say yet
    p.update("h1", 0, 0)                         # ended, nothing moved: no line
    clock.now += 4
    p.update("h2", 60 * MB, 60 * MB)             # ended having moved less than the plan's total: what it moved
    assert said[1:] == ["model: h2: 60.0 MiB copied, 6.0 MiB/s"]
    clock.now += 60
    p.tick()
    assert len(said) == 2                        # nobody is copying: no periodic line, no stall
    p.update("h3", 0, 100 * MB)
    clock.now += 4
    p.update("h3", 100 * MB, 100 * MB)           # a large copy, but a quick one: no line at all
    assert len(said) == 2


def test_on_a_terminal_a_host_is_drawn_once_it_moves_a_large_copy():
    drawn = []

    class Bars:
        def update(self, name, done, total, note=""):
            drawn.append((name, done, total))

        def close(self):
            pass

    clock = Clock()
    p = TransferProgress("project", terminal=True, clock=clock, say=lambda line: None, draw=Bars())
    p.update("h1", 0, 100 * MB)
    p.update("h1", 0, 0)                         # a copy that moved nothing: never drawn
    p.update("h2", 5, 1000)                      # a small one: never drawn
    p.update("h2", 1000, 1000)
    p.update("h3", 0, 100 * MB)
    p.update("h3", 1 * MB, 100 * MB)             # a quick copy (under a second so far): not yet
    clock.now += 1
    p.update("h3", 2 * MB, 100 * MB)
    p.update("h3", 3 * MB, 3 * MB)               # drawn once: its end is drawn too, however small
    assert drawn == [("project: h3", 2 * MB, 100 * MB), ("project: h3", 3 * MB, 3 * MB)]
    p.update("h4", 0, 100 * MB)
    p.update("h4", 100 * MB, 100 * MB)           # all at once: never drawn
    assert len(drawn) == 2
