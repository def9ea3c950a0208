import fcntl
import os
import shutil
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import sshcluster  # noqa: E402
from smalldisk import SmallDisk  # noqa: E402
from sshcluster import NO_PRIVATE_ROOTS, SSHCluster  # noqa: E402


@pytest.fixture
def make_cluster(tmp_path_factory):
    """Start real sshd hosts: `make_cluster(4)` -> a started SSHCluster; all stopped after the test."""
    clusters = []

    def make(size: int, **kwargs) -> SSHCluster:
        root = tmp_path_factory.mktemp(f"cluster{size}-")
        kwargs.setdefault("spinwait", True)      # ranks wait without spinning (tests/spinwait/README.md)
        cluster = SSHCluster(root, size, **kwargs).start()
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop_all()


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MB tmpfs of its own (tests/smalldisk.py), to bind over a test host's root and fill; unmounted afterwards."""
    disk = SmallDisk(tmp_path / "smalldisk", "24m")
    with disk as mounted:
        if mounted is None:
            pytest.skip(f"{disk.why}: a full disk needs one")
        yield mounted


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory, worker_id):
    """A directory holding `base`, the small llama trained on plain stories (lmfixture.pretrain: deterministic, its
    seed fixed), and `base-4bit`, it quantized by mlx-lm's convert: made once per suite run, whichever xdist worker
    asks first (a file lock in the run's temporary root, which every worker shares), as the quality check and the
    two-host config test both start from it. Copy it before changing anything in it."""
    import lmfixture

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent
    root = shared / "pretrained"
    with open(shared / "pretrained.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "made").exists():
            shutil.rmtree(root, ignore_errors=True)
            lmfixture.pretrain(root / "base")
            lmfixture.quantize(root / "base", root / "base-4bit", bits=4, group_size=32)
            (root / "made").touch()
    return root


# ---- running side by side (tests/run.sh: pytest-xdist, CONTRIBUTING.md#running-side-by-side) -------------
# Most tests start their own cluster (make_cluster) or none, and run anywhere. A module that builds something
# once for all its tests (a module- or session-scoped fixture of its own: a trained checkpoint, a serve, a
# cluster) keeps its tests on one worker, so it is built once (xdist_group, with --dist loadgroup). The tests
# marked slow (minutes under the suite's load) are handed out first of all, then the tiers that wait most (ssh, cli,
# train), the many short unit tests last, so they fill the end: a test of minutes handed out late is the run's tail.
# (xdist hands out the groups, largest first, before all of these.)

TIER_ORDER = {"ssh": 0, "cli": 1, "train": 2, "unit": 3}


def _shared_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::", 1)[0]
    for defs in (info.name2fixturedefs.values() if info else ()):
        for d in defs:
            if d.scope in ("module", "package", "session") and d.baseid == module:
                return True
    return False


@pytest.hookimpl(tryfirst=True)          # before xdist's, which reads the group marks added here
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    tier = {item: TIER_ORDER.get(item.nodeid.split("/")[1] if item.nodeid.startswith("tests/") else "", 9)
            for item in items}
    # stable: the order inside a tier stays as written
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, tier[item]))


_ungrouped: list[str] = []        # why this worker's groups are split (xdist stopped renaming), when they are


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """On a worker of --dist loadgroup, xdist has renamed each grouped test `ID@GROUP` by now, which is how its
    scheduler keeps a group together. A pytest or xdist release that stops it (pytest 9.2 with xdist 3.8 did) would
    split every group silently, each worker rebuilding the shared fixtures: every grouped test fails instead."""
    if not getattr(session.config.option, "loadgroup", False):      # set on xdist's workers only
        return
    split = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if split:
        _ungrouped.append(f"pytest-xdist's --dist loadgroup did not group {split[0]} (and {len(split) - 1} more): "
                          "this pytest and pytest-xdist do not work together (pyproject.toml's test extra pins pytest)")


def pytest_runtest_setup(item):
    if _ungrouped and item.get_closest_marker("xdist_group"):
        pytest.fail(_ungrouped[0], pytrace=False)


# ---- an MPI singleton's identity left in a worker's C environment ----------------------------------
# mx.distributed.init() in a test's own process (mlx-lm's evaluate calls it) starts an MPI singleton, which putenv's
# PMIX_* / OMPI_* into the C environment: os.environ does not show it, but every subprocess a later test on this
# worker starts without env= inherits it, and an mpirun among them exits 1 without a word. The test that did it
# fails here, by name, instead of an unrelated mpirun test much later.

def _c_environment_mpi_identity() -> set[str]:
    """The names of an MPI process's identity (clusterctl.hosts.local.mpi_identity: what the product leaves out of
    every local command's environment) in this process's C environment: libc's `environ`, where putenv writes;
    neither os.environ nor /proc/self/environ (the environment the process was started with) sees them."""
    import ctypes

    from clusterctl.hosts.local import mpi_identity

    try:
        entries = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):
        return set()
    names, i = set(), 0
    while entries[i] is not None:
        name = entries[i].split(b"=", 1)[0].decode(errors="replace")
        if mpi_identity(name):
            names.add(name)
        i += 1
    return names


def forget_mpi_singleton() -> None:
    """Remove an MPI singleton's identity from this process's C environment (unsetenv; what os.environ holds, the
    environment pytest was given, stays), for a module whose tests exercise the default world itself
    (mx.distributed.init() with no backend): later subprocesses start clean."""
    import ctypes

    libc = ctypes.CDLL(None)
    for name in _c_environment_mpi_identity() - set(os.environ):
        libc.unsetenv(name.encode())


@pytest.fixture(autouse=True)
def _no_mpi_singleton_left_behind():
    before = _c_environment_mpi_identity()
    yield
    left = _c_environment_mpi_identity() - before
    if left:
        pytest.fail(f"this test started an MPI singleton in the test process ({sorted(left)[0]} is now in its C "
                    "environment): every later mpirun started from this worker would fail; run MLX's distributed "
                    "code in a process of its own", pytrace=False)


# ---- tests skipped for want of `unshare -m` (sshcluster.requires_private_roots) -----------------
# A -ra line among many is easy to miss, and on a machine where `unshare -m` works such a skip hides a
# broken test cluster. So they are listed in a block of their own, and such a skip fails the run where
# `unshare -m` works (CI runs as root: there it must).

_no_unshare: list[tuple[str, str]] = []      # (test id, reason) of this session's skips
_unshare_works: list[bool] = []              # checked once, at the end, when there were any


# A shell starts a background job (`(bash tests/run.sh &)`) with SIGINT ignored, and an ignored signal stays ignored
# in every process started after: the tests that stop a run, a serve or an exec with Ctrl-C (SIGINT) then wait for
# nothing. Python's own handler is put back here, so each process the tests start gets SIGINT's default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionstart(session):
    _no_unshare.clear()
    _unshare_works.clear()


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple) and NO_PRIVATE_ROOTS in report.longrepr[2]:
        _no_unshare.append((report.nodeid, report.longrepr[2].removeprefix("Skipped: ")))


def pytest_sessionfinish(session):
    if not _no_unshare:
        return
    _unshare_works.append(sshcluster.unshare_works())
    if _unshare_works[0] and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if not _no_unshare:
        return
    tr = terminalreporter
    works = _unshare_works[0] if _unshare_works else sshcluster.unshare_works()
    tr.write_sep("!", f"{len(_no_unshare)} test(s) SKIPPED for want of unshare -m", red=True, bold=True)
    for nodeid, reason in _no_unshare:
        tr.write_line(f"SKIPPED {nodeid}: {reason}", yellow=True, bold=True)
    if works:
        tr.write_line("FAILED: `unshare -m` works on this machine, so these tests must run: the test cluster "
                      "lost its private roots (see tests/sshcluster.py). The run fails for it.", red=True, bold=True)
    else:
        tr.write_line("`unshare -m` does not work here (it needs root, or unprivileged user namespaces): "
                      "these tests ran nowhere. CI runs them as root.", yellow=True, bold=True)
    tr.write_sep("!", red=True, bold=True)


# ---- what each test costs in CPU (tests/cpuledger.py): CLUSTERCTL_TEST_CPU_LOG=FILE ----------------------

_ledger: list = []          # this process's cpuledger.Ledger, made by the first test it runs (a worker's, or -n 0's)


def _cpu_ledger():
    path = os.environ.get("CLUSTERCTL_TEST_CPU_LOG")
    if not path:
        return None
    if not _ledger:
        import cpuledger
        _ledger.append(cpuledger.Ledger(path, f"clusterctl-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'master')}-"
                                              f"{os.getpid()}"))
    return _ledger[0] if _ledger[0].group else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    ledger = _cpu_ledger()
    if ledger is None:
        yield
        return
    cpu0, wall0 = ledger.usage(), time.time()
    yield
    ledger.record(item.nodeid, cpu0, wall0)


def pytest_unconfigure(config):
    if _ledger:
        _ledger[0].close()
