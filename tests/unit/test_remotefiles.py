"""The host-side file helper (hosts/scripts/filehelper.py) through transfer.remotefiles.call, on this machine
through LocalTransport: the same program, the same JSON, that sync and data push run on every host."""
import hashlib
import os
import sys

import pytest

from clusterctl.errors import CommandFailed
from clusterctl.hosts.files import TMP_MARK
from clusterctl.hosts.local import LocalTransport
from clusterctl.transfer import remotefiles

PY = sys.executable


def call(op, request):
    return remotefiles.call(LocalTransport("here"), PY, op, request)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_scan_creates_directories_hashes_files_and_clears_leftover_temporary_files(tmp_path):
    root = tmp_path / "w"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_bytes(b"a\n")
    (root / "pkg" / "a.py").chmod(0o640)
    os.symlink("pkg/a.py", root / "link")
    (root / "pkg" / f"b.py{TMP_MARK}1234abcd").write_text("half")        # an interrupted upload
    answer = call("scan", {"root": str(root), "paths": ["pkg/a.py", "link", "gone.py", "pkg"],
                           "dirs": ["pkg", "new/deeper"], "hash": True})
    assert answer["files"] == {"pkg/a.py": [sha(b"a\n"), 0o640], "link": ["link:pkg/a.py", 0o777],
                               "gone.py": None, "pkg": ["other", 0]}
    assert (root / "new" / "deeper").is_dir() and not any(TMP_MARK in n for n in os.listdir(root / "pkg"))


def test_a_dry_scan_changes_nothing_and_lists_the_tree_without_protected_places(tmp_path):
    root = tmp_path / "w"
    for rel in ("a.py", "data/shard.bin", "runs/x/log", "sub/data/keep.py", "venv/lib/x.py", "cache/__pycache__/c.pyc"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    (root / "venv" / "pyvenv.cfg").write_text("")
    answer = call("scan", {"root": str(root), "list": True, "dry": True, "prune_top": ["data", "runs"],
                           "prune_names": ["__pycache__"], "dirs": ["never"]})
    assert answer["tree"] == ["a.py", "sub/data/keep.py"] and not (root / "never").exists()
    assert call("scan", {"root": str(tmp_path / "absent"), "list": True, "dry": True})["tree"] == []


def test_delete_removes_files_and_the_directories_they_leave_empty(tmp_path):
    root = tmp_path / "w"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "x.py").write_text("x")
    (root / "a" / "keep.py").write_text("k")
    answer = call("delete", {"root": str(root), "paths": ["a/b/x.py", "not-there.py"]})
    assert answer == {"deleted": ["a/b/x.py"]}
    assert not (root / "a" / "b").exists() and (root / "a" / "keep.py").exists()


def test_verify_places_good_shards_deletes_bad_ones_and_removes_stale_shards(tmp_path):
    root = tmp_path / "data"
    stage = root / ".incoming"
    stage.mkdir(parents=True)
    (stage / "shard-00000-of-00002.bin").write_bytes(b"good")
    (stage / "val.bin").write_bytes(b"corrupted")
    (root / "shard-00003-of-00004.bin").write_bytes(b"old world")
    answer = call("verify", {"root": str(root), "stage": ".incoming",
                             "files": [["shard-00000-of-00002.bin", sha(b"good")], ["val.bin", sha(b"v")]],
                             "keep": ["shard-00000-of-00002.bin", "val.bin"],
                             "stale": r"shard-\d+-of-\d+\.bin", "check": ["shard-00000-of-00002.bin", "val.bin"]})
    assert answer == {"bad": ["val.bin"], "placed": ["shard-00000-of-00002.bin"],
                      "stale": ["shard-00003-of-00004.bin"],
                      "have": {"shard-00000-of-00002.bin": sha(b"good"), "val.bin": None}}
    assert sorted(os.listdir(root)) == ["shard-00000-of-00002.bin"]          # the stage directory is gone too


def test_a_large_request_travels_as_an_uploaded_file_that_is_removed_after(tmp_path):
    root = tmp_path / "w"
    paths = [f"dir/file-{i:05d}-{'x' * 40}.py" for i in range(2000)]     # well over ARG_LIMIT as JSON
    answer = call("scan", {"root": str(root), "paths": paths, "dry": True})
    assert len(answer["files"]) == 2000 and all(v is None for v in answer["files"].values())
    assert not [n for n in os.listdir(tmp_path) if "clusterctl-req" in n]


def test_the_local_copy_of_a_large_request_is_private_from_its_creation(tmp_path, monkeypatch):
    """Issue 25 item 9: it was written 0644 under $TMPDIR (a request may list a project's file names)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)          # re-read TMPDIR
    seen = []

    class Recording(LocalTransport):
        def put(self, local, remote, mode=None):
            seen.append((os.path.dirname(local), os.stat(local).st_mode & 0o777))
            return super().put(local, remote, mode)

    paths = [f"dir/file-{i:05d}-{'x' * 40}.py" for i in range(2000)]
    remotefiles.call(Recording(), sys.executable, "scan", {"root": str(tmp_path / "w"), "paths": paths, "dry": True})
    assert seen == [(str(tmp_path / "tmp"), 0o600)]
    assert os.listdir(tmp_path / "tmp") == []


@pytest.mark.parametrize("field", ["files", "check", "keep"])
def test_verify_refuses_a_name_that_leaves_the_data_directory(tmp_path, field):
    """Issue 25 item 3: the host side refuses too, whatever the controller sends: nothing outside is touched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    root = tmp_path / "data"
    (root / ".incoming").mkdir(parents=True)
    request = {"root": str(root), "stage": ".incoming", "files": [], "keep": [], "stale": "victim.txt", "check": []}
    # staged "files" are read from .incoming/: ../../ is the victim, whose wrong sha256 used to get it deleted
    request[field] = [("../../victim.txt", "0" * 64)] if field == "files" else ["../victim.txt"]
    with pytest.raises(CommandFailed, match="verify"):
        call("verify", request)
    assert victim.read_text() == "precious"


def test_a_helper_that_cannot_run_is_a_command_failure_naming_the_op(tmp_path):
    with pytest.raises(CommandFailed, match=r"here: `/nonexistent/python \(clusterctl file helper: scan\)` exited 127"):
        remotefiles.call(LocalTransport("here"), "/nonexistent/python", "scan", {"root": str(tmp_path)})


def test_delete_never_removes_a_name_that_is_the_same_file_as_a_kept_path(tmp_path):
    """A case-insensitive APFS after `git mv Model.py model.py`: the host's old name `Model.py` is listed as
    extra, yet it is the same file as the kept `model.py`, and unlinking it would delete the project's
    file. Two names for one inode (a hard link) reproduce that on Linux (docs/facts/macos.md#case-insensitive-apfs)."""
    root = tmp_path / "w"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "model.py").write_text("m")
    os.link(root / "pkg" / "model.py", root / "pkg" / "Model.py")
    (root / "old.py").write_text("o")
    request = {"root": str(root), "paths": ["pkg/Model.py", "old.py"], "keep": ["pkg/model.py", "absent.py"]}
    assert call("delete", {**request, "dry": True}) == {"deleted": ["old.py"]}
    assert (root / "old.py").exists()
    assert call("delete", request) == {"deleted": ["old.py"]}
    assert (root / "pkg" / "Model.py").exists() and (root / "pkg" / "model.py").read_text() == "m"
    assert not (root / "old.py").exists()


def test_a_scratch_file_a_killed_process_left_is_removed_by_the_next(tmp_path, monkeypatch):
    """Issue 44 item 8: a push killed with SIGKILL left its rsync list /tmp/clusterctl-files-* behind for good.
    Files name their process now; the next one removes those whose process is gone, and only those."""
    import subprocess
    import tempfile

    from clusterctl.atomic import scratch_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"])
    try:
        for name in (f"clusterctl-files-{gone.pid}-abc123_x", f"clusterctl-files-{alive.pid}-def456",
                     "clusterctl-files-k2j3h4g5", f"clusterctl-req-{gone.pid}-aaaa.json", "other-1-x"):
            (tmp_path / name).write_text("left")
        fd, path = scratch_file("clusterctl-files-")
        os.close(fd)
        assert os.path.basename(path).startswith(f"clusterctl-files-{os.getpid()}-")
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
        assert sorted(os.listdir(tmp_path)) == sorted([
            os.path.basename(path), f"clusterctl-files-{alive.pid}-def456", "clusterctl-files-k2j3h4g5",
            f"clusterctl-req-{gone.pid}-aaaa.json", "other-1-x"])     # another prefix: its own next call's
    finally:
        alive.kill()
        alive.wait()


def test_a_held_helper_answers_then_holds_until_the_block_ends(tmp_path):
    """The model store's `hold`: its answer first; the lock it took is held for as long as the block runs."""
    from clusterctl.hosts.scripts.holds import take

    store = tmp_path / "s"
    request = {"store": str(store), "key": "m-aaaa11112222", "slot": "h1"}
    lock = store / ".partial" / "m-aaaa11112222@h1.lock"
    with remotefiles.held(LocalTransport("here"), PY, "hold", request, script="modelstore.py") as answer:
        assert answer == {"slot": "h1"} and take(str(lock)) is None          # held by the helper
    deadline = __import__("time").monotonic() + 10
    while (fd := take(str(lock))) is None:                                     # free once it has ended
        assert __import__("time").monotonic() < deadline
    os.close(fd)
    with pytest.raises(CommandFailed, match=r"model store helper: hold\)` exited 1: ValueError: refused: '\.\./x'"):
        with remotefiles.held(LocalTransport("here"), PY, "hold", dict(request, key="../x"), script="modelstore.py"):
            pass
