"""The traceback of an internal error (clusterctl/cli/__init__.py): private, and never at a fixed name in a
shared directory (issue 25 item 9)."""
import os
import tempfile

from clusterctl import cli


def _fail_and_log() -> str:
    try:
        raise RuntimeError("boom --token=s3cret")
    except RuntimeError:
        return cli._write_debug_log()


def test_the_debug_log_is_private_and_appended(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    first, second = _fail_and_log(), _fail_and_log()
    assert first == second == str(tmp_path / ".cache" / "clusterctl" / "debug.log")
    assert os.stat(first).st_mode & 0o777 == 0o600
    assert open(first).read().count("RuntimeError: boom") == 2


def test_without_a_writable_home_it_is_a_new_file_of_its_own(tmp_path, monkeypatch):
    (tmp_path / "home").write_text("a file, not a directory: ~/.cache cannot be made")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / "debug.log").symlink_to(tmp_path / "victim")        # a name planted where the old code wrote
    path = _fail_and_log()
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("clusterctl-debug-")
    assert os.stat(path).st_mode & 0o777 == 0o600 and not (tmp_path / "victim").exists()
    assert _fail_and_log() != path
