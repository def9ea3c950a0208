"""The world check's judgement (launch/world.py), on the reports ranks send."""
from clusterctl.launch.world import WAIT_S, WorldCheck, mismatch, parse_world


def test_parse_world():
    assert parse_world("2 any") == (2, "any") and parse_world("1 ring") == (1, "ring")
    assert parse_world("4") == (4, "any") and parse_world("x any") is None and parse_world("") is None


def test_the_right_world_or_a_world_of_one_launched_as_one_is_fine():
    assert mismatch(2, "mpi", {0: ("h1", 2, "any"), 1: ("h2", 2, "mpi")}) is None
    assert mismatch(1, "mpi", {0: ("h1", 1, "any")}) is None


def test_every_rank_alone_under_mpirun_names_them_and_libmpi():
    line = mismatch(2, "mpi", {1: ("h2", 1, "any"), 0: ("h1", 1, "mpi")})
    assert line.startswith("rank 0 on h1 and rank 1 on h2 formed a world of 1, not 2: MLX could not join the "
                           "ranks: under mpirun it could not load libmpi")
    assert "clusterctl doctor" in line and "\n" not in line


def test_another_backend_than_the_launch_s_is_the_cause_named():
    line = mismatch(2, "mpi", {0: ("h1", 1, "ring"), 1: ("h2", 1, "ring")})
    assert "asked MLX for the ring backend, but the ranks were started for mpi" in line


def test_an_mpi4py_program_outside_mpirun_is_told_to_use_the_mpi_backend():
    line = mismatch(2, "ring", {0: ("h1", 1, "mpi4py"), 1: ("h2", 1, "mpi4py")})
    assert line == ("rank 0 on h1 and rank 1 on h2 formed a world of 1, not 2: the program uses mpi4py, whose MPI "
                    "world only an MPI launcher forms: each rank ran alone (run it with --backend mpi)")
    assert mismatch(2, "mpi", {0: ("h1", 2, "mpi4py"), 1: ("h2", 2, "mpi4py")}) is None


def test_ring_and_jaccl_point_at_their_files_and_many_ranks_are_counted():
    reports = {k: (f"h{k + 1}", 1, "any") for k in range(8)}
    line = mismatch(8, "ring", reports)
    assert line.startswith("rank 0 on h1, rank 1 on h2, rank 2 on h3, rank 3 on h4 and 4 more formed a world "
                           "of 1, not 8: MLX could not join the ranks: its ring backend found no peers")
    assert "MLX_HOSTFILE" in line and "MLX_IBV_DEVICES" in mismatch(8, "jaccl", reports)


def test_mixed_sizes_are_each_named_and_good_ranks_are_not():
    line = mismatch(4, "ring", {0: ("h1", 1, "any"), 1: ("h2", 4, "any"), 2: ("h3", 3, "any")})
    assert line.startswith("rank 0 on h1 formed a world of 1; rank 2 on h3 formed a world of 3, not 4")


def test_the_verdict_waits_for_the_others_but_not_long():
    check = WorldCheck(3, "mpi")
    check.report(0, "h1", "3 any", now=0.0)
    assert not check.wrong and check.verdict(set(), 100.0) is None
    check.report(1, "h2", "1 any", now=10.0)
    assert check.wrong and check.verdict(set(), 10.5) is None            # rank 2 may still report
    assert "rank 1 on h2 formed a world of 1, not 3" in check.verdict(set(), 10.0 + WAIT_S)
    assert check.verdict({2}, 10.5) is not None                          # rank 2 exited: no need to wait
    assert check.verdict(set(), 10.5, force=True) is not None
    check.report(1, "h2", "3 any", now=11.0)                             # only a rank's first report counts
    assert "rank 1 on h2" in check.verdict(set(), 20.0)
