"""rsync argv and output parsing (pure), checked on canned output recorded from rsync 3.2/3.5, and on a Mac
controller's rsync 2.6.9 / openrsync output constructed from their sources (tests/fixtures/rsync/README.md)."""
import os
import shlex
import shutil
import subprocess
import time

import pytest

from clusterctl.transfer.sync import mark_script
from clusterctl.transfer.rsync import (
    MISSING_MARK,
    RsyncSummary,
    parse_item,
    parse_output,
    parse_progress,
    remote_rsync_path,
    rsync_argv,
    ssh_command,
)

# `rsync -lpt --files-from F --from0 --out-format='%i %l %n' --stats --info=progress2 src/ h1:.` (push)
FIRST = (
    "cL+++++++++ 5 link\n"
    "<f+++++++++ 3 y.txt\n"
    "\r              3  27%    0.00kB/s    0:00:00  \r              3  27%    0.00kB/s    0:00:00 (xfr#1, to-chk=2/4)\n"
    "cd+++++++++ 4096 a/\n"
    "<f+++++++++ 1048576 a/name with spaces.bin\n"
    "\r      1,048,579 100%  2.93MB/s    0:00:00 (xfr#2, to-chk=0/4)\n"
    "\n"
    "Number of files: 4 (reg: 2, dir: 1, link: 1)\n"
    "Number of regular files transferred: 2\n"
    "Total file size: 1,048,584 bytes\n"
    "Total bytes sent: 1,049,216\n"
    "Total bytes received: 60\n"
)
TOUCHED = ".f..t...... 8 a/x.txt\n<f.st...... 9 b.py\n*deleting   0 gone\nTotal bytes sent: 175\n"


def test_parse_first_sync():
    s = parse_output(FIRST)
    assert s.moved == ["link", "y.txt", "a/name with spaces.bin"]
    assert s.moved_bytes == 3 + 1048576
    assert s.wire_bytes == 1049216 and s.attrs_only == []


def test_parse_attribute_only_changes_are_not_moves():
    s = parse_output(TOUCHED)
    assert s.moved == ["b.py"] and s.attrs_only == ["a/x.txt"] and s.wire_bytes == 175


def test_parse_item_ignores_other_lines():
    s = RsyncSummary()
    assert not parse_item("sent 216 bytes  received 60 bytes", s)
    assert not parse_item("", s)
    assert s.moved == []


def test_parse_progress():
    assert parse_progress("      1,048,579 100%  2.93MB/s    0:00:00 (xfr#2, to-chk=0/4)") == 1048579
    assert parse_progress("              3  27%    0.00kB/s    0:00:00") == 3
    assert parse_progress("<f+++++++++ 3 y.txt") is None


def test_argv_for_a_remote_host():
    rsh = ssh_command(["-F", "/my cache/clusterctl/ssh/abc.config"], ssh="/usr/bin/ssh")
    argv = rsync_argv("rsync", "/src", "/tmp/list", "~/work dir", target="h1", rsh=rsh, checksum=True,
                      bwlimit_kbps=100, progress=True)
    assert argv[:5] == ["rsync", "-lpt", "--from0", "--files-from", "/tmp/list"]
    assert {"--from0", "--checksum", "--bwlimit=100", "--info=progress2", "--stats"} <= set(argv)
    assert argv[-2:] == ["/src/", "h1:."]
    assert argv[argv.index("-e") + 1] == rsh
    # rsync splits -e on spaces honouring quotes, as shlex does
    assert shlex.split(rsh) == ["/usr/bin/ssh", "-F", "/my cache/clusterctl/ssh/abc.config"]
    assert "-o" not in argv[:argv.index("-e")] and "--dry-run" not in argv


def test_argv_for_a_local_host():
    argv = rsync_argv("rsync", "/src/", "/tmp/list", "/dst", dry_run=True)
    assert argv[-3:] == ["--", "/src/", "/dst/"] and "-e" not in argv and "--dry-run" in argv


def test_remote_rsync_path_quotes_a_hostile_workdir_and_reports_missing_rsync(tmp_path):
    canary = tmp_path / "pwned"
    dest = str(tmp_path / f"w $(touch {canary}) ';x")
    script = remote_rsync_path(dest)
    # run it through a real /bin/sh with a PATH that has mkdir but no rsync, as a host without rsync would
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mkdir").symlink_to(shutil.which("mkdir"))
    r = subprocess.run(["/bin/sh", "-c", script + " --version"], capture_output=True, text=True,
                       env={"PATH": str(bin_dir)}, cwd=tmp_path)
    assert r.returncode != 0 and MISSING_MARK in r.stderr
    assert not canary.exists()
    assert (tmp_path / f"w $(touch {canary}) ';x").is_dir()
    r = subprocess.run(["/bin/sh", "-c", remote_rsync_path("~/x") + " --version"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0 and "rsync" in r.stdout and (tmp_path / "x").is_dir()


FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "rsync")


def _fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def test_parse_a_mac_controllers_rsync_2_6_9_output():
    """macOS's /usr/bin/rsync up to 14 is 2.6.9: 9-character itemize strings (tests/fixtures/rsync/README.md)."""
    s = parse_output(_fixture("push.rsync-2.6.9.txt"))
    assert s.moved == ["pkg/model.py", "latest", "train.py", "name with spaces.txt"]
    assert s.moved_bytes == 1843 + 2301 + 11 and s.attrs_only == ["run.sh"] and s.wire_bytes == 4496


def test_parse_a_mac_controllers_openrsync_output():
    """macOS 15's /usr/bin/rsync is openrsync: 9-character itemize strings and `Total sent: N B`."""
    s = parse_output(_fixture("push.openrsync.txt"))
    # openrsync marks every file it logs as sent, a permissions-only change included (its log.c)
    assert s.moved == ["pkg/model.py", "latest", "train.py", "run.sh", "name with spaces.txt"]
    assert s.moved_bytes == 1843 + 2301 + 120 + 11 and s.wire_bytes == 4496


@pytest.mark.parametrize("shell", ["/bin/sh", "dash", "bash", "zsh"])
def test_a_command_after_rsync_runs_in_the_destination_only_when_rsync_ended_well(tmp_path, shell):
    """run's copy beside a launch marks its end in the SSH session rsync used: --rsync-path becomes a function
    that takes rsync's own arguments, then runs the command in the destination (remote_rsync_path's `then`),
    in any login shell a host may have (zsh is macOS's)."""
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell} here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "rsync"         # records its arguments; fails when asked to
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$HOME/args"\n[ "$1" != --fail ]\n')
    fake.chmod(0o755)
    then = mark_script(".clusterctl/copies/t0k3n")
    dest = str(tmp_path / "work dir")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run([shell, "-c", remote_rsync_path(dest, then=then) + " --server -lpt . ."], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "args").read_text().split("\n")[:4] == ["--server", "-lpt", ".", "."]
    assert (tmp_path / "work dir" / ".clusterctl" / "copies" / "t0k3n").is_file()
    (tmp_path / "work dir" / ".clusterctl" / "copies" / "t0k3n").unlink()
    r = subprocess.run([shell, "-c", remote_rsync_path(dest, then=then) + " --fail"], capture_output=True, env=env)
    assert r.returncode != 0 and not (tmp_path / "work dir" / ".clusterctl" / "copies" / "t0k3n").exists()


def test_the_mark_removes_its_siblings_older_than_an_hour(tmp_path):
    folder = tmp_path / ".clusterctl" / "copies"
    folder.mkdir(parents=True)
    (folder / "old").write_text("")
    (folder / "recent").write_text("")
    os.utime(folder / "old", (time.time() - 2 * 3600,) * 2)
    r = subprocess.run(["/bin/sh", "-c", mark_script(".clusterctl/copies/new")], cwd=tmp_path, capture_output=True)
    assert r.returncode == 0 and sorted(os.listdir(folder)) == ["new", "recent"]
