"""`clusterctl sync` / `clusterctl data push` error paths: one line, a documented exit code, no traceback."""
import json
import os

import pytest
from clirun import clusterctl


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(f"hosts: [{{name: here, local: true, workdir: {json.dumps(str(tmp_path / 'w'))}}}]\n")
    return str(path)


def one_line_error(r, code, *needles):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in r.stderr


def test_sync_missing_directory(tmp_path, inventory):
    one_line_error(clusterctl("sync", str(tmp_path / "nope"), "--hosts", inventory), 2, "no such directory")


def test_sync_bad_inventory(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  - name: a\n    port: nope\n")
    one_line_error(clusterctl("sync", str(tmp_path), "--hosts", str(bad)), 2, f"{bad}:3:")
    one_line_error(clusterctl("data", "push", str(tmp_path), "--hosts", str(bad)), 2, f"{bad}:3:")


def test_sync_dest_outside_the_workdir(tmp_path, inventory):
    one_line_error(clusterctl("sync", str(tmp_path), "--hosts", inventory, "--dest", "../x"), 2, "inside")


def test_data_push_without_a_manifest(tmp_path, inventory):
    (tmp_path / "d").mkdir()
    one_line_error(clusterctl("data", "push", str(tmp_path / "d"), "--hosts", inventory), 2, "clusterctl data prepare")


def test_sync_to_this_machine_prints_a_summary(tmp_path, inventory):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("a\n")
    r = clusterctl("sync", str(src), "--hosts", inventory, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "[0 here] would send a.py" in r.stdout and not os.path.exists(tmp_path / "w" / "a.py")
    r = clusterctl("sync", str(src), "--hosts", inventory)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[1].split() == ["HOST", "METHOD", "FILES", "BYTES", "DELETED", "TIME", "NOTE"]
    assert lines[2].split()[:5] == ["here", "rsync", "1", "2", "B"] and lines[-1] == "1 ok, 0 failed"
    assert (tmp_path / "w" / "a.py").read_text() == "a\n"
