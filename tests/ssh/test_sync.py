"""`clusterctl sync` and `clusterctl data push` against the real loopback sshd cluster (private roots)."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from clirun import clusterctl

pytestmark = pytest.mark.ssh


def sync(cluster, path, *args):
    r = clusterctl("sync", str(path), "--hosts", str(cluster.inventory), "--json", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


def remote_tree(cluster, index, where=None):
    r = cluster.ssh(index, f"cd {where or cluster.workdir} && find . \\( -type f -o -type l \\) | sort")
    assert r.returncode == 0, r.stderr
    return [line[2:] for line in r.stdout.splitlines()]


def make_project(root):
    """A git work tree with tracked, untracked and ignored files, a venv, runs/ and caches."""
    files = {
        "train.py": "print('train')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "x = 1\n",
        "pkg/runs/keep.py": "# a package named runs is code\n",
        "notes.md": "untracked but not ignored: ships\n",
        ".gitignore": "*.log\ncheckpoints/\n!important.log\n",
        "debug.log": "ignored\n",
        "important.log": "negated: ships\n",
        "checkpoints/big.ckpt": "ignored dir\n",
        "runs/2026/rank-0.log": "run logs never ship\n",
        "pkg/__pycache__/model.cpython-311.pyc": "cache\n",
        "stray.pyc": "bytecode\n",
        "env/pyvenv.cfg": "home = /usr/bin\n",
        "env/lib/site.py": "a venv: never ships\n",
        ".venv/lib/x.py": "venv\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    os.chmod(root / "train.py", 0o755)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "train.py", "pkg", ".gitignore"], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)
    return sorted([".gitignore", "important.log", "notes.md", "pkg/__init__.py", "pkg/model.py", "pkg/runs/keep.py",
                   "train.py"])


def test_sync_to_three_hosts_then_incremental(make_cluster, tmp_path):
    cluster = make_cluster(3)
    project = tmp_path / "project"
    expected = make_project(project)
    first = sync(cluster, project)
    for i in (1, 2, 3):
        assert remote_tree(cluster, i) == expected
        assert first[f"h{i}"]["method"] == "rsync" and sorted(first[f"h{i}"]["moved"]) == expected
        mode = cluster.ssh(i, f"stat -c %a {cluster.workdir}/train.py").stdout.strip()
        assert mode == "755"
    again = sync(cluster, project)
    assert all(h["files"] == 0 and h["moved"] == [] for h in again.values()), again
    (project / "pkg" / "model.py").write_text("x = 2\n")
    changed = sync(cluster, project)
    for i in (1, 2, 3):
        assert changed[f"h{i}"]["moved"] == ["pkg/model.py"]
        assert cluster.ssh(i, f"cat {cluster.workdir}/pkg/model.py").stdout == "x = 2\n"
    for hours, args, moved in ((1, (), ["train.py"]), (2, ("--checksum",), [])):
        past = time.time() - 3600 * hours
        os.utime(project / "train.py", (past, past))       # touched, identical content
        # the quick check (size + mtime) counts it; --checksum does not (and only updates its mtime)
        assert all(h["moved"] == moved for h in sync(cluster, project, *args).values())


def test_host_without_rsync_gets_the_tree_over_sftp(make_cluster, tmp_path):
    cluster = make_cluster(2)
    cluster.set_session_path(2, cluster.path_without("rsync"))
    assert cluster.ssh(2, "command -v rsync").returncode != 0
    project = tmp_path / "project"
    expected = make_project(project)
    os.symlink("train.py", project / "link.py")
    expected = sorted(expected + ["link.py"])
    first = sync(cluster, project)
    assert first["h1"]["method"] == "rsync" and first["h2"]["method"] == "sftp"
    assert "no rsync on the host" in first["h2"]["note"]
    for i in (1, 2):
        assert remote_tree(cluster, i) == expected
    assert cluster.ssh(2, f"readlink {cluster.workdir}/link.py").stdout.strip() == "train.py"
    assert cluster.ssh(2, f"stat -c %a {cluster.workdir}/train.py").stdout.strip() == "755"
    assert sync(cluster, project)["h2"]["moved"] == []
    (project / "notes.md").write_text("changed\n")
    assert sync(cluster, project)["h2"]["moved"] == ["notes.md"]


def test_delete_only_with_the_flag_and_never_clusterctls_own_directories(make_cluster, tmp_path):
    cluster = make_cluster(2)
    project = tmp_path / "project"
    make_project(project)
    sync(cluster, project)
    w = cluster.workdir
    for i in (1, 2):
        assert cluster.ssh(i, f"mkdir -p {w}/data/tiny {w}/runs/x && echo s > {w}/data/tiny/shard-00000-of-00002.bin"
                              f" && echo l > {w}/runs/x/log && echo i > {w}/extra.log").returncode == 0
    os.unlink(project / "notes.md")
    assert sync(cluster, project)["h1"]["deleted"] == 0
    assert "notes.md" in remote_tree(cluster, 1)
    dry = sync(cluster, project, "--delete", "--dry-run")
    assert dry["h1"]["deleted_files"] == ["notes.md"] and "notes.md" in remote_tree(cluster, 1)
    done = sync(cluster, project, "--delete")
    for i in (1, 2):
        assert done[f"h{i}"]["deleted_files"] == ["notes.md"]
        tree = remote_tree(cluster, i)
        assert "notes.md" not in tree
        # shards, run logs and files the project's rules ignore stay
        assert {"data/tiny/shard-00000-of-00002.bin", "runs/x/log", "extra.log"} <= set(tree)


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_kill_9_mid_transfer_never_leaves_a_truncated_file_and_a_rerun_completes(make_cluster, tmp_path, method):
    cluster = make_cluster(2)
    project = tmp_path / "project"
    project.mkdir()
    big = os.urandom(6 * 1024 * 1024)
    (project / "big.bin").write_bytes(big)
    (project / "small.py").write_text("print(1)\n")
    digest = hashlib.sha256(big).hexdigest()
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "sync", str(project), "--hosts", str(cluster.inventory),
                             "--method", method, "--bwlimit", "1024"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # wait until the big file is being written on h1 under a temporary name
    w = cluster.workdir
    deadline = time.monotonic() + 30
    started = False
    while time.monotonic() < deadline and not started:
        r = cluster.ssh(1, f"find {w} -name '*big.bin?*' -size +100k 2>/dev/null")
        started = bool(r.stdout.strip())
        time.sleep(0.2)
    assert started, "the transfer never started"
    if method == "rsync":
        assert any("rsync" in argv for _, argv in processes_mentioning(str(project)))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    proc.stderr.close()
    for i in (1, 2):
        r = cluster.ssh(i, f"test ! -e {w}/big.bin || sha256sum {w}/big.bin")
        assert r.returncode == 0
        assert r.stdout == "" or r.stdout.split()[0] == digest, "a truncated big.bin under its final name"
        assert cluster.ssh(i, f"test -e {w}/big.bin").returncode == 1     # killed well before the end
    # the watchdog stops the orphaned rsync (and its ssh): no process of this transfer outlives clusterctl
    deadline = time.monotonic() + 30     # generous: the loop ends as soon as they are gone
    while time.monotonic() < deadline and processes_mentioning(str(project)):
        time.sleep(0.2)
    assert processes_mentioning(str(project)) == []
    time.sleep(1)
    for i in (1, 2):
        r = cluster.ssh(i, f"find {w} -name '*big.bin?*' -newermt '-1 seconds'")
        assert r.stdout.strip() == "", f"h{i} still receiving after the kill: {r.stdout}"
    rerun = sync(cluster, project, "--method", method)
    for i in (1, 2):
        assert "big.bin" in rerun[f"h{i}"]["moved"]
        assert cluster.ssh(i, f"sha256sum {w}/big.bin").stdout.split()[0] == digest
        assert remote_tree(cluster, i) == ["big.bin", "small.py"]        # no temporary files left behind


def processes_mentioning(text):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace")
        except OSError:
            continue
        if text in argv and int(pid) != os.getpid():
            found.append((int(pid), argv.replace("\0", " ")[:200]))
    return found


def write_shards(directory, world, seed=b""):
    """A prepared data directory in the data helper's manifest format (random tokens)."""
    directory.mkdir(parents=True, exist_ok=True)
    shards = []
    for r in range(world):
        name = f"shard-{r:05d}-of-{world:05d}.bin"
        data = hashlib.sha256(seed + bytes([r])).digest() * 4000    # equal shards, as prepare makes them
        (directory / name).write_bytes(data)
        shards.append({"file": name, "tokens": len(data) // 2, "sha256": hashlib.sha256(data).hexdigest()})
    val = b"\x01\x00" * 500
    (directory / "val.bin").write_bytes(val)
    manifest = {"format": 1, "tokenizer": {"type": "byte"}, "vocab_size": 257, "dtype": "uint16",
                "world_size": world, "tokens_per_shard": shards[0]["tokens"], "dropped_tokens": 0,
                "source": "test", "shards": shards,
                "val": {"file": "val.bin", "tokens": 500, "sha256": hashlib.sha256(val).hexdigest()}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def push(cluster, data_dir, *args):
    r = clusterctl("data", "push", str(data_dir), "--hosts", str(cluster.inventory), "--json", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


def test_push_three_shards_to_three_hosts(make_cluster, tmp_path):
    cluster = make_cluster(3)
    cluster.set_session_path(3, cluster.path_without("rsync"))      # h3 gets its shard over SFTP
    manifest = write_shards(tmp_path / "tiny", 3)
    where = f"{cluster.workdir}/data/tiny"
    # h1 holds a stale shard of a 2-rank preparation
    assert cluster.ssh(1, f"mkdir -p {where} && echo old > {where}/shard-00001-of-00002.bin").returncode == 0
    first = push(cluster, tmp_path / "tiny")
    assert first["h1"]["removed"] == ["shard-00001-of-00002.bin"]
    assert (first["h1"]["method"], first["h3"]["method"]) == ("rsync", "sftp")
    for i in (1, 2, 3):
        shard = manifest["shards"][i - 1]
        assert remote_tree(cluster, i, where) == sorted([shard["file"], "manifest.json", "val.bin"])
        sums = cluster.ssh(i, f"cd {where} && sha256sum {shard['file']} val.bin").stdout.split()
        assert sums[0] == shard["sha256"] and sums[2] == manifest["val"]["sha256"]
    second = push(cluster, tmp_path / "tiny")
    assert all(h["sent"] == [] and len(h["unchanged"]) == 3 for h in second.values()), second
    # one shard corrupted on h2: only that file is sent again
    assert cluster.ssh(2, f"echo x >> {where}/{manifest['shards'][1]['file']}").returncode == 0
    third = push(cluster, tmp_path / "tiny")
    assert third["h2"]["sent"] == [manifest["shards"][1]["file"]] and third["h1"]["sent"] == []


def test_push_refuses_another_world_size_in_one_line(make_cluster, tmp_path):
    cluster = make_cluster(3)
    write_shards(tmp_path / "tiny", 2)
    r = clusterctl("data", "push", str(tmp_path / "tiny"), "--hosts", str(cluster.inventory))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "world size 2" in r.stderr and "clusterctl data prepare --world 3" in r.stderr

