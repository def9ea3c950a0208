"""`clusterctl models` against the real loopback sshd cluster: a model pushed once, found again, resumed after a
kill, repaired when damaged, refused when it is not a model (transfer/models.py, docs/models.md)."""
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

MB = 1024 * 1024


def make_model(root, name="tiny model", seed=b"", big=2 * MB):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "llama"}' + seed.decode())
    (d / "tokenizer.json").write_text('{"version": "1.0"}')
    (d / "model-00001-of-00002.safetensors").write_bytes(os.urandom(big))
    (d / "model-00002-of-00002.safetensors").write_bytes(os.urandom(MB))
    return d


def store_of(cluster):
    """A store path with a space and a quote in it, inside each host's private root."""
    return f"{cluster.host_root}/my store/it's"


def start(make_cluster):
    cluster = make_cluster(2)
    cluster.write_inventory(model_store=store_of(cluster))
    return cluster


def models(cluster, tmp_path, *args, ok=True, env=None):
    r = clusterctl("models", *args, "--hosts", str(cluster.inventory), cwd=tmp_path, own_cache=True, timeout=180,
                   env=env)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def push(cluster, tmp_path, model, *args, env=None):
    r = models(cluster, tmp_path, "push", str(model), "--json", *args, env=env)
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


def sha_on(cluster, i, path):
    """The file's sha256 on host i, by its Python (a Mac has no sha256sum)."""
    code = "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"
    r = cluster.ssh(i, f"{sys.executable} -c {sq(code)} {sq(path)}")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


def sq(text):
    return "'" + text.replace("'", "'\\''") + "'"


def local_sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamps(cluster, i, entry):
    return cluster.ssh(i, f"cd {sq(entry)} && stat -c '%n %i %.9Y' *").stdout


def test_push_once_then_nothing_moves_and_same_name_models_get_two_entries(make_cluster, tmp_path):
    cluster = start(make_cluster)
    model = make_model(tmp_path)
    first = push(cluster, tmp_path, model)
    total = sum(p.stat().st_size for p in model.iterdir())
    for i in (1, 2):       # relayed: this machine -> h1 -> h2 (transfer/relay.py), each file's bytes once to each
        h = first[f"h{i}"]
        assert h["ok"] and not h["reused"] and h["method"] == "relay" and len(h["sent_files"]) == 4
        assert h["sent_bytes"] == total and h["note"] == f"relayed from {'this machine' if i == 1 else 'h1'}"
        entry = h["path"]
        assert entry.startswith(store_of(cluster) + "/tiny-model-") and entry.endswith(h["digest"][:12])
        for f in model.iterdir():
            assert sha_on(cluster, i, f"{entry}/{f.name}") == local_sha(f)
        assert cluster.ssh(i, f"test -f {sq(entry)}/.clusterctl-entry.json").returncode == 0
        assert cluster.ssh(i, f"ls -A {sq(store_of(cluster))}/.partial").stdout == ""      # nothing left staged
    before = {i: stamps(cluster, i, first[f"h{i}"]["path"]) for i in (1, 2)}
    r = models(cluster, tmp_path, "push", str(model))
    assert r.stdout.count("already there") == 2, r.stdout
    again = push(cluster, tmp_path, model)
    for i in (1, 2):
        h = again[f"h{i}"]
        assert h["reused"] and h["sent_bytes"] == 0 and h["sent_files"] == [] and h["method"] == ""
        assert stamps(cluster, i, h["path"]) == before[i]               # same inodes, same mtimes: untouched

    other = make_model(tmp_path / "elsewhere", seed=b" ")               # same name, other content
    second = push(cluster, tmp_path, other)
    assert second["h1"]["digest"] != first["h1"]["digest"] and second["h1"]["path"] != first["h1"]["path"]
    listed = json.loads(models(cluster, tmp_path, "--json").stdout)["hosts"]
    for h in listed:
        assert sorted((e["name"], e["state"]) for e in h["entries"]) == [("tiny-model", "complete")] * 2
        assert all(e["size"] == total + (e["digest"] == second["h1"]["digest"]) for e in h["entries"])
    table = models(cluster, tmp_path).stdout
    assert table.count("complete") == 4 and first["h1"]["digest"][:12] in table

    r = models(cluster, tmp_path, "rm", "tiny-model", ok=False)
    assert r.returncode == 2 and "matches 2 models" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # a folder of the user's in the store's: never listed, never removed (model_store may point at an old folder)
    mine = f"{store_of(cluster)}/my-own-checkpoints"
    assert cluster.ssh(1, f"mkdir {sq(mine)} && echo mine > {sq(mine)}/step-100.safetensors").returncode == 0
    r = models(cluster, tmp_path, "rm", "my-own-checkpoints", ok=False)
    assert r.returncode == 2 and "no model in the store is named 'my-own-checkpoints'" in r.stderr, r.stderr
    assert cluster.ssh(1, f"cat {sq(mine)}/step-100.safetensors").stdout == "mine\n"
    assert "my-own" not in models(cluster, tmp_path).stdout
    r = models(cluster, tmp_path, "rm", first["h1"]["digest"][:8])
    assert r.stdout.count("removed") == 2
    for i in (1, 2):
        assert cluster.ssh(i, f"test -e {sq(first['h1']['path'])}").returncode == 1
        assert cluster.ssh(i, f"test -f {sq(second['h1']['path'])}/config.json").returncode == 0


def test_a_directory_that_is_not_a_model_is_refused_before_anything_moves(make_cluster, tmp_path):
    cluster = start(make_cluster)
    model = make_model(tmp_path)
    os.unlink(model / "config.json")
    r = models(cluster, tmp_path, "push", str(model), ok=False)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {model} is not an mlx-lm model directory: it has no config.json (give the directory that holds "
        "config.json and the *.safetensors weights)"]
    assert cluster.ssh(1, f"test -e {sq(store_of(cluster))}").returncode == 1


@pytest.mark.parametrize("method", ["rsync", "sftp", "auto"])      # auto: relayed, this machine -> h1 -> h2
def test_a_push_killed_mid_file_is_never_complete_and_resumes_with_fewer_bytes(make_cluster, tmp_path, method):
    cluster = start(make_cluster)
    model = make_model(tmp_path, big=6 * MB)
    big = "model-00001-of-00002.safetensors"
    (tmp_path / "tmp").mkdir()              # this machine's temporary files, apart from other tests'
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / ".cache"), "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "models", "push", str(model), "--hosts",
                             str(cluster.inventory), "--method", method, "--bwlimit", "1024"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = sq(store_of(cluster))
    deadline, started = time.monotonic() + 60, False
    while time.monotonic() < deadline and not started:
        r = cluster.ssh(1, f"find {store}/.partial -name '*{big}*' -size +1000k 2>/dev/null")
        started = bool(r.stdout.strip())
        time.sleep(0.2)
    assert started, "the transfer never started"
    # atomic: while the push runs, the store holds no entry, only .partial
    assert cluster.ssh(1, f"ls -A {store}").stdout.split() == [".partial"]
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    time.sleep(3)           # each host's watchdog ends the receiving side (KILL_GRACE_S)
    for i in (1, 2):
        assert cluster.ssh(i, f"ls -A {store}").stdout.split() == [".partial"], "an entry before every file was in"
    part = cluster.ssh(1, f"find {store}/.partial -path '*.clusterctl-partial/{big}' -size +1000k").stdout.splitlines()
    assert len(part) == 1, cluster.ssh(1, f"find {store}").stdout
    assert cluster.ssh(1, f"pgrep -f {sq(store_of(cluster))}").stdout == ""      # nothing left running there
    # rsync's file list, here: left behind by the killed push (SIGKILL runs no cleanup) ...
    assert bool(os.listdir(tmp_path / "tmp")) == (method == "rsync"), os.listdir(tmp_path / "tmp")

    again = push(cluster, tmp_path, model, "--method", method, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert os.listdir(tmp_path / "tmp") == []                                   # ... and removed by the next
    h1 = again["h1"]
    whole = sum((model / f).stat().st_size for f in h1["sent_files"])
    assert h1["ok"] and h1["resumed_bytes"] > 1000 * 1024 and big in h1["sent_files"]
    # the partial file was continued: what was already there did not travel again (64 KiB: rsync's checksums)
    assert h1["sent_bytes"] < whole - h1["resumed_bytes"] + 64 * 1024, (h1["sent_bytes"], whole, h1["resumed_bytes"])
    if method == "auto":     # relayed: each host received exactly what it lacked, h2 from h1
        assert [again[h]["method"] for h in ("h1", "h2")] == ["relay", "relay"]
        assert all(again[h]["sent_bytes"] + again[h]["resumed_bytes"] == whole for h in ("h1", "h2")), again
    for i in (1, 2):
        entry = again[f"h{i}"]["path"]
        for f in model.iterdir():
            assert sha_on(cluster, i, f"{entry}/{f.name}") == local_sha(f)
        assert cluster.ssh(i, f"find {sq(entry)} -name '.clusterctl-partial*'").stdout == ""
        assert cluster.ssh(i, f"ls -A {store}/.partial").stdout == ""


def test_a_relaying_host_killed_mid_push_the_chain_continues_from_what_each_host_holds(make_cluster, tmp_path):
    """The hop on h2 (relaying to h3) killed mid-push: the push goes round again from what each host holds, every
    host ends verified, no host receives a byte twice, and this machine sent the model once in all. h2 is a fake
    Mac (zsh login shell, macOS's userland): the hop runs there as on a Mac."""
    cluster = make_cluster(3, darwin={2})
    cluster.write_inventory(model_store=store_of(cluster))
    model = make_model(tmp_path, big=8 * MB)
    total = sum(p.stat().st_size for p in model.iterdir())
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / ".cache")}
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "models", "push", str(model), "--hosts",
                             str(cluster.inventory), "--bwlimit", "1500", "--json"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = sq(store_of(cluster))
    deadline, relay = time.monotonic() + 60, []
    while time.monotonic() < deadline and not relay:
        if cluster.ssh(2, f"find {store}/.partial -path '*clusterctl-partial*' -size +1000k").stdout.strip():
            relay = [pid for pid in cluster.session_pids(2) if _cmdline(pid)[:2] == [sys.executable.encode(), b"-c"]
                     and b"def relay(" in _cmdline(pid)[2]]
        time.sleep(0.1)
    assert len(relay) == 1, "h2's hop never received a MiB"
    os.kill(relay[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = err.splitlines()
    assert "push: relay: this machine -(ssh)-> h1 -> h2 -> h3" in lines
    assert any(line.startswith("push: relay again, from what each host holds: ") for line in lines), err
    answer = json.loads(out)
    hosts = {h["host"]: h for h in answer["hosts"]}
    for i in (1, 2, 3):
        h = hosts[f"h{i}"]
        assert h["ok"] and h["method"] == "relay" and h["sent_bytes"] == total, h      # each byte once to each
        for f in model.iterdir():
            assert sha_on(cluster, i, f"{h['path']}/{f.name}") == local_sha(f)
    assert sum(r["sent_here"] for r in answer["route"]) == total                  # and once from here
    assert all(cluster.ssh(i, f"ls -A {store}/.partial").stdout == "" for i in (1, 2, 3))
    assert cluster.refused(2) == []          # nothing GNU-only was asked of the Mac


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0") + [b"", b"", b""]
    except OSError:
        return [b"", b"", b""]


def overwrite(cluster, i, path, keep_mtime=False):
    """Some bytes in the middle of a stored file replaced, size kept (and with keep_mtime its mtime too)."""
    code = ("import os,sys; p=sys.argv[1]; st=os.stat(p); f=open(p,'r+b'); f.seek(st.st_size//2); "
            "f.write(b'X'*4096); f.close()" + ("; os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))" if keep_mtime else ""))
    r = cluster.ssh(i, f"{sys.executable} -c {sq(code)} {sq(path)}")
    assert r.returncode == 0, r.stderr


def test_a_damaged_file_is_found_resent_and_never_served(make_cluster, tmp_path):
    cluster = start(make_cluster)
    model = make_model(tmp_path)
    weight = "model-00001-of-00002.safetensors"
    entry = push(cluster, tmp_path, model)["h1"]["path"]
    overwrite(cluster, 1, f"{entry}/{weight}")
    fixed = push(cluster, tmp_path, model, "--direct")
    h1, h2 = fixed["h1"], fixed["h2"]
    assert h1["damaged"] == [weight] and h1["sent_files"] == [weight] and h1["path"] == entry
    assert 0 < h1["sent_bytes"] < (model / weight).stat().st_size // 2        # rsync's delta: the damaged blocks
    assert h2["reused"] and h2["damaged"] == []
    assert sha_on(cluster, 1, f"{entry}/{weight}") == local_sha(model / weight)
    # relayed: the chain begins at the host holding the model (h2), which sends h1 the file whole from its disk
    overwrite(cluster, 1, f"{entry}/{weight}")
    fixed = push(cluster, tmp_path, model)
    h1, h2 = fixed["h1"], fixed["h2"]
    assert h1["damaged"] == [weight] and h1["sent_files"] == [weight] and h1["note"] == "relayed from h2"
    assert h1["sent_bytes"] == (model / weight).stat().st_size and h2["reused"]
    assert sha_on(cluster, 1, f"{entry}/{weight}") == local_sha(model / weight)

    # damage that keeps size and mtime: the cheap check cannot see it; --verify re-hashes and repairs
    overwrite(cluster, 2, f"{entry}/{weight}", keep_mtime=True)
    assert push(cluster, tmp_path, model)["h2"]["reused"]
    verified = push(cluster, tmp_path, model, "--verify")
    assert verified["h2"]["damaged"] == [weight] and verified["h1"]["reused"]
    assert verified["h1"]["rehashed"] == 4
    assert sha_on(cluster, 2, f"{entry}/{weight}") == local_sha(model / weight)


def test_a_host_given_some_weights_gets_only_those_then_the_rest(make_cluster, tmp_path, monkeypatch):
    from clusterctl.hosts.connector import Connector
    from clusterctl.inventory import load
    from clusterctl.transfer.models import describe, list_models, push as push_model, require_all

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    cluster = start(make_cluster)
    model = describe(str(make_model(tmp_path)))
    connector = Connector(load(cluster.inventory))
    second = "model-00002-of-00002.safetensors"
    entries = require_all(push_model(connector, None, model, files={"h2": [second]}))
    assert len(entries["h1"].files) == 4
    assert entries["h2"].files == ["config.json", second, "tokenizer.json"]
    assert cluster.ssh(2, f"ls {sq(entries['h2'].path)}").stdout.split() == ["config.json", second, "tokenizer.json"]
    listed = list_models(connector)["h2"].value
    assert [(m.state, m.files, m.model_files) for m in listed] == [("complete", 3, 4)]
    whole = require_all(push_model(connector, None, model))
    assert whole["h1"].reused and whole["h2"].sent_files == ["model-00001-of-00002.safetensors"]
    assert whole["h2"].path == entries["h2"].path
    assert len(cluster.ssh(2, f"ls {sq(whole['h2'].path)}").stdout.split()) == 4


def test_fake_macs_store_verify_and_find_it_again(make_cluster, tmp_path):
    """zsh logins, BSD tools, no sha256sum (tests/sshcluster.py's fake Darwin): the store needs only the host's
    python and POSIX sh."""
    cluster = make_cluster(2, darwin={1, 2})
    cluster.write_inventory(model_store=store_of(cluster))
    model = make_model(tmp_path)
    first = push(cluster, tmp_path, model)
    assert all(h["ok"] and len(h["sent_files"]) == 4 for h in first.values()), first
    again = push(cluster, tmp_path, model, "--verify")
    assert all(h["reused"] and h["rehashed"] == 4 for h in again.values()), again
    assert [cluster.refused(i) for i in (1, 2)] == [[], []]


def test_hosts_sharing_one_store_push_side_by_side_and_one_entry_results(make_cluster, tmp_path):
    # a home on NFS, or a shared disk: every host's store is the same directory, pushed to at once
    cluster = make_cluster(3)
    shared = tmp_path / "shared store"          # outside the hosts' private roots: one directory for all
    cluster.write_inventory(model_store=str(shared))
    model = make_model(tmp_path, big=8 * MB)
    first = push(cluster, tmp_path, model)
    assert all(h["ok"] for h in first.values()) and len({h["path"] for h in first.values()}) == 1, first
    entry = next(iter(first.values()))["path"]
    for f in model.iterdir():
        assert local_sha(shared / os.path.basename(entry) / f.name) == local_sha(f)
    assert sorted(os.listdir(shared)) == [".partial", os.path.basename(entry)]
    assert os.listdir(shared / ".partial") == []          # every host's own push directory is gone
    again = push(cluster, tmp_path, model)
    assert all(h["reused"] and h["sent_bytes"] == 0 for h in again.values()), again


def test_hosts_sharing_one_store_each_with_some_weights_leave_one_entry_holding_all_of_them(make_cluster, tmp_path,
                                                                                            monkeypatch):
    # pipeline stages on hosts whose stores are one directory: each host's files join the one entry
    from clusterctl.hosts.connector import Connector
    from clusterctl.inventory import load
    from clusterctl.transfer.models import describe, push as push_model, require_all

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    cluster = make_cluster(2)
    shared = tmp_path / "shared"
    cluster.write_inventory(model_store=str(shared))
    model = describe(str(make_model(tmp_path, big=4 * MB)))
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    entries = require_all(push_model(Connector(load(cluster.inventory)), None, model,
                                     files={"h1": [first], "h2": [second]}))
    entry = shared / os.path.basename(entries["h1"].path)
    assert entries["h1"].path == entries["h2"].path
    assert sorted(os.listdir(entry)) == sorted([".clusterctl-entry.json", "config.json", first, second,
                                                "tokenizer.json"])
    for f in (first, second):
        assert local_sha(entry / f) == next(m.sha256 for m in model.files if m.path == f)
    again = require_all(push_model(Connector(load(cluster.inventory)), None, model))      # the whole model, anywhere
    assert all(e.reused for e in again.values()), again


def test_the_same_model_from_a_directory_of_another_name_moves_no_bytes(make_cluster, tmp_path):
    import shutil

    cluster = start(make_cluster)
    model = make_model(tmp_path)
    first = push(cluster, tmp_path, model)
    renamed = shutil.copytree(model, tmp_path / "renamed copy")
    second = push(cluster, tmp_path, renamed)
    for i in (1, 2):
        h, old = second[f"h{i}"], first[f"h{i}"]
        assert h["ok"] and h["sent_bytes"] == 0 and h["digest"] == old["digest"] and h["path"] != old["path"], h
        for f in model.iterdir():          # the same files, hard-linked from the first entry and hashed again
            assert sha_on(cluster, i, f"{h['path']}/{f.name}") == local_sha(f)
            inodes = cluster.ssh(i, f"stat -c %i {sq(h['path'] + '/' + f.name)} {sq(old['path'] + '/' + f.name)}")
            assert len(set(inodes.stdout.split())) == 1, inodes.stdout


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_a_hugging_face_snapshot_pushes_its_files_and_a_link_out_of_it_is_refused(make_cluster, tmp_path, method):
    """Issue 44 item 6: a snapshot is links into the hub cache's blobs. rsync copied the links (then failed with
    a wrong cause), SFTP followed any link, also one to a file outside the model (copied into every host's store).
    The model named by its hub id (issue 41), with the hub offline, is the cache's snapshot: the same entry; an id
    the cache lacks is one line naming the cache."""
    from lmfixture import hub_snapshot

    cluster = start(make_cluster)
    model = make_model(tmp_path)
    snap = hub_snapshot(model, tmp_path / "hf", "tiny-org/tiny-model")
    offline = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    pushed = push(cluster, tmp_path, "tiny-org/tiny-model", "--method", method, env=offline)
    for i in (1, 2):
        h = pushed[f"h{i}"]
        assert h["ok"] and h["method"] == method and os.path.basename(h["path"]).startswith("tiny-org-tiny-model-"), h
        for f in model.iterdir():
            assert cluster.ssh(i, f"test -f {sq(h['path'] + '/' + f.name)} && ! test -L {sq(h['path'] + '/' + f.name)}"
                               ).returncode == 0
            assert sha_on(cluster, i, f"{h['path']}/{f.name}") == local_sha(f)
    assert push(cluster, tmp_path, model)["h1"]["reused"]       # the same content: the same entry's files
    assert push(cluster, tmp_path, snap, env=offline)["h2"]["path"] == pushed["h2"]["path"]     # the snapshot itself
    r = models(cluster, tmp_path, "push", "tiny-org/absent", ok=False, env=offline)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: tiny-org/absent: no such directory here, and not in the Hugging Face cache here "
        f"({tmp_path / 'hf' / 'hub'}) while HF_HUB_OFFLINE is set: unset it to download the model once, or give a "
        "model directory"], r.stderr

    (tmp_path / "secret").write_text("a private key")
    os.symlink(tmp_path / "secret", snap / "notes.txt")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text("{}")
    (tmp_path / "odd" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "odd" / "a\\b.txt").write_text("x")           # issue 44 item 8: refused here, not on the hosts
    before = [cluster.ssh(i, f"find {sq(store_of(cluster))} | sort").stdout for i in (1, 2)]
    for model_dir, says in ((snap, f"notes.txt is a link to {tmp_path / 'secret'}, outside the model directory and "
                                   "its Hugging Face cache entry"),
                            (tmp_path / "odd", "the file a\\b.txt has a backslash in its name")):
        r = models(cluster, tmp_path, "push", str(model_dir), "--method", method, ok=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {model_dir}: {says}"), r.stderr
    assert [cluster.ssh(i, f"find {sq(store_of(cluster))} | sort").stdout for i in (1, 2)] == before
    assert cluster.ssh(1, f"grep -r 'a private key' {sq(store_of(cluster))}").returncode == 1


def test_three_pushes_of_one_model_at_once_all_succeed_with_one_verified_entry(make_cluster, tmp_path):
    """Issue 44 item 7: each push writes a directory of its own (they shared one per host: rsync exited 23,
    FileNotFoundError); the first to finish completes the entry, the others find it complete."""
    cluster = start(make_cluster)
    model = make_model(tmp_path, big=4 * MB)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / ".cache")}
    procs = [subprocess.Popen([sys.executable, "-m", "clusterctl", "models", "push", str(model), "--json", "--hosts",
                               str(cluster.inventory)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    answers = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in answers]
    paths = {h["path"] for out, _ in answers for h in json.loads(out)["hosts"]}
    assert len(paths) == 1, paths
    entry = paths.pop()
    for i in (1, 2):
        for f in model.iterdir():
            assert sha_on(cluster, i, f"{entry}/{f.name}") == local_sha(f)
        assert cluster.ssh(i, f"ls -A {sq(store_of(cluster))}").stdout.split() == [".partial", os.path.basename(entry)]
        assert cluster.ssh(i, f"ls -A {sq(store_of(cluster))}/.partial").stdout == ""
    again = push(cluster, tmp_path, model, "--verify")
    assert all(h["reused"] and h["damaged"] == [] for h in again.values()), again
