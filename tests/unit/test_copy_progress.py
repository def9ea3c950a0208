"""The progress of run's long copies besides the model's (issue 41): the project's copy (sync_tree), the run
directory's and the --fetch PATHs' fetches report each host's (bytes done, bytes total) as they run, with a total
known before the copy starts and a last report of what did move; PrintedRun shows every copy under way in one
block of bars on a terminal. Through this machine as the host: rsync and the SFTP route's plain copies."""
import io
import json
import os
import shutil

import pytest

from clusterctl.cli.printedrun import PrintedRun
from clusterctl.hosts.connector import Connector
from clusterctl.inventory import Cluster, parse
from clusterctl.transfer.fetch import check_fetch_paths, fetch_outputs
from clusterctl.transfer.stage import fetch_run_dir
from clusterctl.transfer.sync import SyncOptions, plan_sync, sync_tree

METHODS = ["rsync", "sftp"] if shutil.which("rsync") else ["sftp"]


def recorder():
    calls = []
    return calls, lambda host, done, total: calls.append((host, done, total))


def check_sane(calls):
    assert calls and all(0 <= done <= total for _, done, total in calls), calls


@pytest.mark.parametrize("method", METHODS)
def test_a_project_copy_tells_each_hosts_bytes_and_ends_with_what_moved(tmp_path, method):
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(300_000))
    (src / "small.py").write_text("x = 1\n")
    cluster = parse(f"hosts: [{{name: here, local: true, workdir: {json.dumps(str(tmp_path / 'w'))}}}]\n", "inv.yaml")
    plan = plan_sync(str(src))
    calls, progress = recorder()
    sync_tree(Connector(cluster), plan, SyncOptions(method=method), progress)
    check_sane(calls)
    assert {total for _, _, total in calls[:-1]} <= {plan.total_bytes} and calls[-1] == ("here", 300_006, 300_006)
    calls.clear()
    (src / "small.py").write_text("x = 22\n")    # the next copy moves one small file: its last report says so
    sync_tree(Connector(cluster), plan_sync(str(src)), SyncOptions(method=method), progress)
    check_sane(calls)
    assert calls[-1] == ("here", 7, 7)


@pytest.mark.parametrize("method", METHODS)
def test_a_fetch_tells_the_bytes_of_every_path_against_what_the_host_holds(tmp_path, method):
    workdir, project = tmp_path / "host-work", tmp_path / "project"
    (workdir / "outdir" / "sub").mkdir(parents=True)
    (workdir / "outdir" / "a.txt").write_text("hello\n")
    (workdir / "outdir" / "sub" / "b.bin").write_bytes(os.urandom(200_000))
    (workdir / "outdir" / "x.clusterctl-tmp-0000abcd").write_bytes(b"u" * 32)      # never fetched
    (workdir / "model.bin").write_bytes(b"\0" * 10)
    project.mkdir()
    connector = Connector(Cluster.this_machine(str(workdir)))
    paths = check_fetch_paths(["outdir", "model.bin", "nothere"])
    calls, progress = recorder()
    fetch_outputs(connector, paths, str(project), str(project / "runs" / "r1"), method=method, progress=progress)
    check_sane(calls)
    assert calls[0][2] == 6 + 200_000 + 32 + 10                # what the host held, before anything moved
    assert calls[-1] == ("localhost", 6 + 200_000 + 10, 6 + 200_000 + 10)     # what moved
    calls.clear()
    fetch_outputs(connector, paths, str(project), str(project / "runs" / "r1"), method=method, progress=progress)
    assert calls[-1] == ("localhost", 0, 0)                     # unchanged: nothing moved


def test_the_run_directorys_fetch_tells_its_bytes(tmp_path):
    workdir = tmp_path / "host-work"
    connector = Connector(Cluster.this_machine(str(workdir)))
    remote = connector.run_dir(connector.cluster.hosts[0], "r1")
    os.makedirs(os.path.join(remote, "checkpoints", "step-1"))
    with open(os.path.join(remote, "checkpoints", "step-1", "model.safetensors"), "wb") as f:
        f.write(os.urandom(3 << 20))
    with open(os.path.join(remote, "metrics.jsonl"), "w") as f:
        f.write("{}\n")
    calls, progress = recorder()
    assert fetch_run_dir(connector, "r1", str(tmp_path / "here"), progress=progress) == (2, (3 << 20) + 3)
    check_sane(calls)
    assert len(calls) > 3 and {t for _, _, t in calls} == {(3 << 20) + 3} and calls[-1][1] == (3 << 20) + 3


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_copies_under_way_at_once_share_one_block_of_bars_on_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", Terminal())
    printed = PrintedRun()
    printed.model_progress("h1", 0, 1000)
    printed.copy_progress("project", "h1", 0, 1000)
    model, project = printed.copies["model"], printed.copies["project"]
    assert model.bars is project.bars is printed.bars is not None and project.prefix == "project"
    printed.copied()                                           # the model's copy ended: the project's goes on
    assert list(printed.copies) == ["project"] and printed.bars is project.bars
    printed.copy_ended("project")
    assert printed.copies == {} and printed.bars is None
    printed.copy_progress("fetch", "h1", 0, 1000)              # a later copy: a block of its own
    assert printed.copies["fetch"].bars is not project.bars
    printed.copy_ended("fetch")


def test_a_growing_run_directory_fetched_again_brings_what_grew_or_is_new_not_what_is_here(tmp_path):
    """A detached run's `logs -f` fetches its directory every few seconds (detach/follow.py snapshot): the second
    time a big log that did not change and a checkpoint already here are not fetched again; the log that grew, the
    small JSON rewritten in place at the same size and a new checkpoint are."""
    from clusterctl.transfer.stage import SAME_SIZE_KEPT, fetch_tree

    connector = Connector(Cluster.this_machine(str(tmp_path / "host-work")))
    host = connector.cluster.hosts[0]
    there, here = tmp_path / "there", tmp_path / "here"
    (there / "checkpoints" / "step-1").mkdir(parents=True)
    files = {"rank-0.log": b"a" * SAME_SIZE_KEPT, "rank-1.log": b"b" * SAME_SIZE_KEPT, "state.json": b'{"step": 1}',
             "checkpoints/step-1/model.safetensors": os.urandom(SAME_SIZE_KEPT * 2)}
    for rel, data in files.items():
        (there / rel).write_bytes(data)
    assert fetch_tree(connector, host, str(there), str(here), growing=True)[0] == 4
    (there / "rank-1.log").write_bytes(b"b" * SAME_SIZE_KEPT + b"more\n")
    (there / "state.json").write_bytes(b'{"step": 2}')
    (there / "checkpoints" / "step-2").mkdir()
    (there / "checkpoints" / "step-2" / "model.safetensors").write_bytes(os.urandom(SAME_SIZE_KEPT * 2))
    (here / "rank-0.log").write_bytes(b"x" * SAME_SIZE_KEPT)        # kept: here at its size there
    grew, state, step2 = SAME_SIZE_KEPT + 5, 11, 2 * SAME_SIZE_KEPT
    assert fetch_tree(connector, host, str(there), str(here), growing=True) == (3, grew + state + step2)
    assert (here / "rank-1.log").read_bytes().endswith(b"more\n") and (here / "state.json").read_bytes() == b'{"step": 2}'
    assert (here / "rank-0.log").read_bytes() == b"x" * SAME_SIZE_KEPT
    assert fetch_tree(connector, host, str(there), str(here))[0] == 5                  # not growing: all of it
    assert (here / "rank-0.log").read_bytes() == b"a" * SAME_SIZE_KEPT
