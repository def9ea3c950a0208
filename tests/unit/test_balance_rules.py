"""The bundled trainer's balancing rules (clusterctl/train/balance.py): shares, the rows each rank takes,
when auto moves them, and which replica drifted. The MLX side is tested in tests/train/ (equality with one
rank holding the whole batch, exact resume, check-sync)."""
import pytest

from clusterctl.errors import ConfigError
from clusterctl.train import balance as b


def test_parse_balance():
    assert b.parse_balance("auto") == "auto" and b.parse_balance(" off ") == "off"
    assert b.parse_balance("2,1") == (2.0, 1.0) and b.parse_balance("1.5,1,1", world=3) == (1.5, 1.0, 1.0)
    for bad, why in [("fast", "auto, off or weights"), ("2,0", "positive"), ("2,-1", "positive"), ("nan,1", "positive"),
                     ("", "auto, off or weights")]:
        with pytest.raises(ConfigError, match=why):
            b.parse_balance(bad)
    with pytest.raises(ConfigError, match="gives 2 weight"):
        b.parse_balance("2,1", world=3)


def test_proportional_rows_sum_to_the_batch_and_never_starve_a_rank():
    assert b.proportional([1, 1], 32) == [16, 16]
    assert b.proportional([2, 1], 32) == [21, 11]
    assert b.proportional([1, 2, 3], 24) == [5, 8, 11]          # ties in the remainders go to the lower rank
    assert b.proportional([1000, 1], 4) == [3, 1]               # one row at least
    assert sum(b.proportional([3.3, 1.7, 0.2], 97)) == 97
    with pytest.raises(ConfigError, match="cannot give each of 3 ranks one"):
        b.proportional([1, 1, 1], 2)


def test_auto_stays_even_within_the_tolerance_and_moves_only_for_a_real_gain():
    even = [16, 16]
    assert b.decide(even, [100.0, 85.0]) == even                 # within 10% of the mean: nothing moves
    assert b.decide(even, [100.0, 50.0]) == [22, 10]             # twice as fast: the best split of 32 rows
    assert b.decide([21, 11], [100.0, 52.0]) == [21, 11]         # a little noise: the shares stay
    assert b.decide([21, 11], [100.0, 97.0]) == even             # the slow one recovered
    assert b.decide([22, 10], [100.0, 49.0]) == [22, 10]         # the best split already
    assert b.decide([21, 11], [100.0, 49.0]) == [21, 11]         # [22, 10] predicts < 5% faster: kept
    assert b.decide(even, [100.0, 0.0]) == even                  # a rank that measured nothing: no move
    assert b.decide(even, [100.0, 75.0]) == [18, 14]             # 1.33x: beyond the tolerance now (was 20%)


def test_the_best_split_is_the_shortest_step_the_rows_allow_not_rounded_proportions():
    """Issue 43: with 16 rows and one rank twice as fast, proportions rounded give 10:6 (a step of 6 of the slow
    rank's row times); 11:5 gives 5.5, the shortest any whole split allows."""
    assert b.proportional([2, 1], 16) == [10, 6] and b.best_split([2, 1], 16) == [11, 5]
    assert b.step_time([11, 5], [2, 1]) == 5.5 < b.step_time([10, 6], [2, 1]) == 6
    assert b.decide([8, 8], [2.0, 1.0]) == [11, 5]
    assert b.best_split([1, 1, 1], 7) == [3, 2, 2] and b.best_split([1000, 1], 4) == [3, 1]
    for speeds, total in (([3.0, 1.0, 2.0], 24), ([1.0, 1.7, 0.4, 2.2], 37), ([5.0, 1.0], 6)):
        best = b.best_split(speeds, total)
        assert sum(best) == total and min(best) >= 1
        # no other whole split of the rows is faster (brute force over every split of a small batch)
        import itertools
        others = [p for p in itertools.product(range(1, total), repeat=len(speeds)) if sum(p) == total]
        assert b.step_time(best, speeds) <= min(b.step_time(p, speeds) for p in others) + 1e-12


def test_exchanges_wait_for_enough_measured_time_then_come_every_interval():
    assert b.next_exchange(3, [0.3, 1.8]) == 3 + b.EXCHANGE_EVERY
    assert b.next_exchange(3, [0.1, 0.3]) == 4            # tiny steps: measure one more, the figures add up
    assert b.enough([0.25, 2.0]) and not b.enough([0.24, 9.0])


def test_assignment_keeps_own_rows_first_and_hands_slow_ranks_rows_to_fast_ones():
    assert b.assignment([4, 4]) == [[(0, 0), (0, 1), (0, 2), (0, 3)], [(1, 0), (1, 1), (1, 2), (1, 3)]]
    fast_first = b.assignment([6, 2])
    assert fast_first == [[(0, 0), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3)], [(1, 0), (1, 1)]]
    three = b.assignment([2, 3, 7])
    assert sorted(p for rows in three for p in rows) == [(k, j) for k in range(3) for j in range(4)]   # every row once
    assert three[0] == [(0, 0), (0, 1)] and three[1] == [(1, 0), (1, 1), (1, 2)]
    assert three[2] == [(2, 0), (2, 1), (2, 2), (2, 3), (0, 2), (0, 3), (1, 3)]
    with pytest.raises(ValueError):
        b.assignment([2, 3])


def test_micro_batches_are_as_few_and_as_even_as_the_batch_size_allows_and_never_padded():
    pairs = [(0, j) for j in range(11)]
    assert b.micro_batches(pairs[:5], 2) == [[(0, 0), (0, 1)], [(0, 2), (0, 3)], [(0, 4)]]
    assert b.micro_batches(pairs[:4], 2) == [[(0, 0), (0, 1)], [(0, 2), (0, 3)]]
    assert [len(c) for c in b.micro_batches(pairs[:10], 8)] == [5, 5]          # not 8 + 2
    assert b.micro_batches(pairs, 8) == [pairs[0:6], pairs[6:11]]              # 6 + 5: 11 rows computed, not 12
    assert b.micro_batches(pairs[:7], 3) == [pairs[0:3], pairs[3:5], pairs[5:7]]
    for n in range(1, 40):
        for size in range(1, 12):
            rows = [(0, j) for j in range(n)]
            chunks = b.micro_batches(rows, size)
            lengths = [len(c) for c in chunks]
            assert len(chunks) == -(-n // size) and max(lengths) <= size
            assert [p for c in chunks for p in c] == rows                        # every row once, in order, no padding
            assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)
    assert b.micro_batches([], 4) == []


def test_the_replica_that_drifted_is_the_one_outside_the_majority():
    same = (1.0, 2.0)
    assert b.sync_differs([same, same, same]) == []
    assert b.sync_differs([same, (1.0, 2.5), same]) == [1]
    assert b.sync_differs([(9.0, 9.0), same, same, same]) == [0]
    assert b.sync_differs([same, (1.0, 2.5)]) == [0, 1]          # two ranks: either may have drifted
    assert b.sync_differs([same, (3.0, 3.0), (4.0, 4.0)]) == [0, 1, 2]
