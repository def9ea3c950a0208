"""`run --fetch PATH` (transfer/fetch.py): which paths are accepted, where they land (pure), the rsync pull
argv (pure), and real fetches from a "host" that is this machine working in another directory, over
rsync and over the SFTP route (the host's file session, files compared by sha256)."""
import os
import shutil

import pytest

from clusterctl.errors import UsageError
from clusterctl.hosts.connector import Connector
from clusterctl.inventory import Cluster
from clusterctl.transfer.fetch import FetchPath, check_fetch_paths, fetch_outputs, inside, local_destination
from clusterctl.transfer.rsync import rsync_argv


def test_relative_and_absolute_paths_are_normalised():
    assert check_fetch_paths(["outdir/", "a/../b", "/scratch/x/", "~/m/../adapters", "outdir"]) == (
        FetchPath("outdir/", "outdir"), FetchPath("a/../b", "b"), FetchPath("/scratch/x/", "/scratch/x"),
        FetchPath("~/m/../adapters", "~/adapters"))
    assert [p.absolute for p in check_fetch_paths(["a", "/a", "~/b"])] == [False, True, True]


@pytest.mark.parametrize("path", ["..", "../x", "a/../../x", "./../x"])
def test_a_relative_path_may_not_leave_the_workdir(path):
    with pytest.raises(UsageError, match="leaves the workdir: a relative PATH must stay inside rank 0's workdir"):
        check_fetch_paths([path])


@pytest.mark.parametrize("path", [".", "", "/", "~", "~/", "~/..", "/a/.."])
def test_the_whole_workdir_home_or_file_system_is_refused(path):
    with pytest.raises(UsageError, match="not the whole workdir, home or file system"):
        check_fetch_paths([path])


def test_two_absolute_paths_with_one_name_are_refused():
    with pytest.raises(UsageError, match="would both land in runs/<id>/fetched/out"):
        check_fetch_paths(["/a/out", "/b/out"])
    with pytest.raises(UsageError, match="only ~/"):
        check_fetch_paths(["~bob/x"])


def test_where_paths_land():
    rel, absolute = check_fetch_paths(["outdir/sub", "/scratch/model.bin"])
    assert local_destination(rel, "/p", "/p/runs/r1") == "/p/outdir/sub"
    assert local_destination(absolute, "/p", "/p/runs/r1") == "/p/runs/r1/fetched/model.bin"
    assert local_destination(rel, "/p", "/p/runs/r1", "h2") == "/p/runs/r1/host-h2/outdir/sub"
    assert local_destination(absolute, "/p", "/p/runs/r1", "h2") == "/p/runs/r1/host-h2/fetched/model.bin"


def test_the_pull_argv_enters_the_hosts_directory_without_creating_it():
    argv = rsync_argv("rsync", "/w/out dir", "LIST", "/here/out", target="h1", rsh="ssh -F cfg", excludes=True,
                      pull=True)
    assert argv[-2:] == ["h1:./", "/here/out/"] and "-r" in argv and "--exclude-from" in argv
    rsync_path = next(a for a in argv if a.startswith("--rsync-path="))
    assert rsync_path.startswith("--rsync-path=cd '/w/out dir' && ") and "mkdir" not in rsync_path


def _job_output(workdir):
    os.makedirs(os.path.join(workdir, "outdir", "sub"))
    with open(os.path.join(workdir, "outdir", "a.txt"), "w") as f:
        f.write("hello\n")
    with open(os.path.join(workdir, "outdir", "sub", "b.bin"), "wb") as f:
        f.write(bytes(range(256)))
    with open(os.path.join(workdir, "outdir", "x.clusterctl-tmp-0000abcd"), "w") as f:
        f.write("an upload to the host, half done")
    with open(os.path.join(workdir, "model.bin"), "wb") as f:
        f.write(b"\0" * 10)


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_a_fetch_moves_changed_files_only(tmp_path, method):
    if method == "rsync" and not shutil.which("rsync"):
        pytest.skip("no rsync here")
    workdir, project = str(tmp_path / "host-work"), str(tmp_path / "project")
    _job_output(workdir)
    os.makedirs(project)
    connector = Connector(Cluster.this_machine(workdir))
    paths = check_fetch_paths(["outdir", "model.bin", "nothere"])

    def fetch():
        return fetch_outputs(connector, paths, project, str(tmp_path / "project" / "runs" / "r1"), method=method)

    first = fetch()
    assert [(f.status, f.kind, f.files, f.nbytes, f.method) for f in first] == [
        ("copied", "dir", 2, 6 + 256, method), ("copied", "file", 1, 10, method), ("missing", "", 0, 0, "")]
    assert open(os.path.join(project, "outdir", "sub", "b.bin"), "rb").read() == bytes(range(256))
    assert sorted(os.listdir(os.path.join(project, "outdir"))) == ["a.txt", "sub"]    # no temporary names
    assert [(f.status, f.files) for f in fetch()] == [("copied", 0), ("copied", 0), ("missing", 0)]
    with open(os.path.join(workdir, "outdir", "a.txt"), "w") as f:
        f.write("changed\n")
    assert [f.files for f in fetch()][:2] == [1, 0]
    assert open(os.path.join(project, "outdir", "a.txt")).read() == "changed\n"


def test_a_relative_path_of_this_machine_in_this_directory_is_already_here(tmp_path):
    _job_output(str(tmp_path))
    [fetched] = fetch_outputs(Connector(Cluster.this_machine(str(tmp_path))), check_fetch_paths(["outdir"]),
                              str(tmp_path), str(tmp_path / "runs" / "r1"))
    assert (fetched.status, fetched.files, fetched.dest) == ("here", 0, str(tmp_path / "outdir"))


@pytest.mark.parametrize("rel", ["../escape", "/etc/passwd", "a/../../b", "a\\b", "a//b", ".", ""])
def test_a_name_from_the_host_that_leaves_the_destination_is_refused(tmp_path, rel):
    """Issue 25 item 2: the SFTP route joined the host's names without a containment check."""
    with pytest.raises(OSError, match="refused"):
        inside(str(tmp_path), rel, "h1")
    assert inside(str(tmp_path), "sub/ok.txt", "h1") == str(tmp_path / "sub" / "ok.txt")


def test_the_sftp_route_never_writes_through_a_link_it_recreated_nor_keeps_a_setuid_bit(tmp_path):
    """A host's symlink is recreated here; when the host later has a directory of that name, its files must
    not land where the local link points. And a setuid bit from the host is dropped."""
    workdir, project = tmp_path / "host-work", tmp_path / "project"
    outside = tmp_path / "outside"
    for d in (workdir / "out", project, outside):
        d.mkdir(parents=True)
    (workdir / "out" / "link").symlink_to(outside)
    (workdir / "out" / "tool").write_text("#!/bin/sh\n")
    os.chmod(workdir / "out" / "tool", 0o4755)
    connector = Connector(Cluster.this_machine(str(workdir)))
    paths = check_fetch_paths(["out"])

    def fetch():
        return fetch_outputs(connector, paths, str(project), str(project / "runs" / "r1"), method="sftp")

    assert [f.status for f in fetch()] == ["copied"]
    assert os.readlink(project / "out" / "link") == str(outside)
    assert os.stat(project / "out" / "tool").st_mode & 0o7777 == 0o755
    (workdir / "out" / "link").unlink()                     # now a directory on the host
    (workdir / "out" / "link").mkdir()
    (workdir / "out" / "link" / "evil.txt").write_text("written through the link")
    [result] = fetch()
    assert result.status == "failed" and "a link here leads out of" in str(result.error)
    assert os.listdir(outside) == []
