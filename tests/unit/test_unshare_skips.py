"""tests/conftest.py's loud end for tests skipped for want of `unshare -m`: run in a pytester session with
the real conftest and sshcluster.requires_private_roots, and `unshare_works` pinned either way."""
import os
import re
import types

import pytest
import sshcluster

pytest_plugins = ["pytester"]

CONFTEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conftest.py")
TESTS = """
import types
import pytest
from sshcluster import requires_private_roots

def test_needs_private_roots():
    requires_private_roots(types.SimpleNamespace(private_roots=False), "hosts must hold their own files")

def test_skipped_for_another_reason():
    pytest.skip("no system python3")

def test_fine():
    pass
"""


@pytest.fixture
def session(pytester, monkeypatch):
    """Run TESTS under a copy of the real conftest, with `unshare -m` said to work or not."""
    with open(CONFTEST, encoding="utf-8") as f:
        pytester.makeconftest(f.read())

    def run(unshare_works: bool, tests: str = TESTS):
        pytester.makepyfile(test_it=tests)
        monkeypatch.setattr(sshcluster, "unshare_works", lambda: unshare_works)
        return pytester.runpytest_inprocess("-p", "no:cacheprovider")
    return run


BLOCK = ["*!!! 1 test(s) SKIPPED for want of unshare -m !!!*",
         f"SKIPPED test_it.py::test_needs_private_roots: {sshcluster.NO_PRIVATE_ROOTS}: hosts must hold their own files"]


def test_such_a_skip_fails_the_run_where_unshare_works(session):
    result = session(unshare_works=True)
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(BLOCK + ["FAILED: `unshare -m` works on this machine, so these tests must run*"])
    assert "test_skipped_for_another_reason:" not in result.stdout.str()    # other skips are not listed


def test_where_unshare_does_not_work_such_a_skip_is_listed_and_the_run_passes(session):
    result = session(unshare_works=False)
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(BLOCK + ["`unshare -m` does not work here*CI runs them as root."])


def test_other_skips_neither_show_the_block_nor_fail_the_run(session):
    result = session(unshare_works=True, tests=TESTS.replace("def test_needs_private_roots", "def _unused"))
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    assert "unshare -m" not in result.stdout.str()


def test_the_helper_skips_only_without_private_roots(monkeypatch):
    assert sshcluster.requires_private_roots(types.SimpleNamespace(private_roots=True), "x") is None
    with pytest.raises(pytest.skip.Exception, match=r"^needs unshare -m .*: to give one rank its own disk$"):
        sshcluster.requires_private_roots(types.SimpleNamespace(private_roots=False), "to give one rank its own disk")
    monkeypatch.setattr(sshcluster, "unshare_works", lambda: False)      # no cluster: this machine decides
    with pytest.raises(pytest.skip.Exception, match=f"^{re.escape(sshcluster.NO_PRIVATE_ROOTS)}$"):
        sshcluster.requires_private_roots()
    monkeypatch.setattr(sshcluster, "unshare_works", lambda: True)
    assert sshcluster.requires_private_roots() is None
