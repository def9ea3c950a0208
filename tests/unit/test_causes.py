"""Why a rank failed, read from its last lines (launch/causes.py), on tails recorded from the failing code."""
from pathlib import Path

import pytest

from clusterctl.launch import causes

FIXTURES = Path(__file__).parent.parent / "fixtures" / "failures"


def tail(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


@pytest.mark.parametrize("name, kind, restartable", [
    ("disk-full-mlx.txt", causes.DISK_FULL, False),
    ("disk-full-python.txt", causes.DISK_FULL, False),
    ("missing-file.txt", causes.MISSING_FILE, False),
    ("oom-python.txt", causes.OUT_OF_MEMORY, True),
    ("peer-lost-ring.txt", causes.PEER_LOST, True),
    ("data-plane-ring-init.txt", causes.DATA_PLANE, True),
    ("other.txt", causes.OTHER, True),
])
def test_each_recorded_failure_is_read_as_its_cause_with_the_line_that_says_it(name, kind, restartable):
    cause = causes.read(tail(name))
    assert (cause.kind, cause.restartable) == (kind, restartable)
    assert cause.line == tail(name)[-1].strip()          # the error's own last line, not a traceback frame
    assert cause.followed == (kind == causes.PEER_LOST)


def test_the_trainers_own_checkpoint_line_and_an_empty_tail():
    line = ("error: checkpoint at step 300 not written: no space left on device in /w/runs/x/checkpoints on h2 "
            "(free 0 B; a checkpoint takes 3.1 MB, --keep 2): free space there or lower --keep")
    assert causes.read(["step 300 | loss 2.1", line]) == causes.Cause(causes.DISK_FULL, line)
    assert causes.read([]) == causes.Cause(causes.OTHER, "")
    assert causes.read(["", "  "]).line == ""
    assert causes.read(["attempt 2 /w/runs/x", "done"]) == causes.Cause(causes.OTHER, "")    # output, not an error


def test_a_first_cause_outranks_a_follower_and_fixes_name_the_host():
    peer, own = causes.read(tail("peer-lost-ring.txt")), causes.read(tail("disk-full-mlx.txt"))
    assert causes.rank(own, lost=False) > causes.rank(None, lost=False) > causes.rank(peer, lost=False)
    assert causes.rank(None, lost=True) == causes.rank(own, lost=False)
    assert "h2" in own.fix("h2") and "--keep" in own.fix("h2")
    assert "doctor --data-plane" in peer.fix("h1")
    assert causes.read(tail("other.txt")).fix("h1") is None


def test_ranks_that_could_not_reach_each_other_point_to_the_data_plane_but_yield_to_a_rank_that_failed_on_its_own():
    link, own = causes.read(tail("data-plane-ring-init.txt")), causes.read(tail("other.txt"))
    # a peer that never started (an import error) also leaves its neighbours unable to connect: it comes first
    assert causes.rank(own, lost=False) > causes.rank(link, lost=False) > causes.rank(
        causes.read(tail("peer-lost-ring.txt")), lost=False)
    assert not link.followed and "doctor --data-plane" in link.fix("h3")
