"""The model store's pure pieces (transfer/localmodel.py) and its host helper (hosts/scripts/modelstore.py) run
on this machine's file system; the real-sshd tests are tests/ssh/test_model_store_ssh.py."""
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import pytest

from clusterctl.errors import ModelError
from clusterctl.hosts.scripts import program
from clusterctl.inventory import DEFAULT_MODEL_STORE, load as load_inventory
from clusterctl.transfer.localmodel import (HashCache, ModelFile, describe, host_files, manifest_text, match,
                                            model_digest, model_name, sanitise)


def make_model(root, weights=b"w" * 1000, name="m"):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "tokenizer.json").write_text("{}")
    (d / "model-00001-of-00002.safetensors").write_bytes(weights)
    (d / "model-00002-of-00002.safetensors").write_bytes(weights[::-1] + b"x")
    (d / ".DS_Store").write_bytes(b"never part of the model")
    return d


@pytest.mark.parametrize("raw, clean", [
    ("Qwen3-8B-4bit", "Qwen3-8B-4bit"), ("my model (v2)", "my-model-v2"), ("$(touch x); y", "touch-x-y"),
    ("..hidden", "hidden"), ("-rf", "rf"), ("", "model"), ("::", "model"), ("a" * 100, "a" * 64),
    ("Llama 3.1 8B Instruct", "Llama-3.1-8B-Instruct"), ("modèle", "mod-le"),
])
def test_sanitise(raw, clean):
    assert sanitise(raw) == clean


def test_manifest_is_canonical_and_the_digest_changes_with_any_field():
    a = [ModelFile("b.safetensors", 3, "0" * 64), ModelFile("a.json", 1, "1" * 64)]
    assert manifest_text(a) == manifest_text(list(reversed(a)))
    assert json.loads(manifest_text(a))["files"][0] == ["a.json", 1, "1" * 64]
    d = model_digest(a)
    assert len(d) == 64 and d == hashlib.sha256(manifest_text(a).encode()).hexdigest()
    for changed in ([ModelFile("b.safetensors", 4, "0" * 64), a[1]], [ModelFile("c.safetensors", 3, "0" * 64), a[1]],
                    [ModelFile("b.safetensors", 3, "2" * 64), a[1]], a[:1]):
        assert model_digest(changed) != d


def test_describe_hashes_once_then_reads_the_cache(tmp_path):
    d = make_model(tmp_path)
    cache = HashCache(str(tmp_path / "cache.json"))
    m = describe(str(d), cache)
    assert [f.path for f in m.files] == ["config.json", "model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors", "tokenizer.json"]
    assert m.name == "m" and m.key == f"m-{m.digest[:12]}" and cache.hashed == 4
    assert m.file("config.json").sha256 == hashlib.sha256(b'{"model_type": "llama"}').hexdigest()
    again = HashCache(str(tmp_path / "cache.json"))
    assert describe(str(d), again) == m and again.hashed == 0          # nothing read the second time
    (d / "tokenizer.json").write_text('{"changed": 1}')
    third = HashCache(str(tmp_path / "cache.json"))
    assert describe(str(d), third).digest != m.digest and third.hashed == 1
    assert oct(os.stat(tmp_path / "cache.json").st_mode & 0o777) == "0o600"


def test_a_hugging_face_snapshot_is_the_same_model_under_its_repo_name(tmp_path):
    from lmfixture import hub_snapshot

    d = make_model(tmp_path)
    (d / "sub").mkdir()
    (d / "sub" / "extra.json").write_text("{}")
    snap = hub_snapshot(d, tmp_path / "hf", "mlx-community/Tiny-4bit")
    assert os.path.islink(snap / "sub" / "extra.json")
    cache = HashCache(str(tmp_path / "c.json"))
    linked, plain = describe(str(snap), cache), describe(str(d), cache)
    assert linked.digest == plain.digest and linked.files == plain.files
    assert model_name(str(snap)) == "mlx-community/Tiny-4bit" and linked.name == "mlx-community-Tiny-4bit"
    os.symlink("config.json", d / "alias.json")              # a link that stays inside the model directory
    assert "alias.json" in [f.path for f in describe(str(d), cache).files]


def links_out(tmp_path):
    """A model whose directory links to a file outside it (and outside any hub cache entry)."""
    d = make_model(tmp_path)
    (tmp_path / "secret").write_text("a key")
    os.symlink(tmp_path / "secret", d / "notes.txt")
    return d


@pytest.mark.parametrize("case, says", [
    ("outside", "notes.txt is a link to {secret}, outside the model directory: copy the file into the model"),
    ("hub-outside", "notes.txt is a link to {secret}, outside the model directory and its Hugging Face cache entry"),
    ("nothing", "notes.txt is a link to nothing (gone.txt): finish the download, or remove the link"),
    ("loop", "sub/up is a link to {model}, a directory that holds it (a loop)"),
    ("backslash", "the file a\\b.txt has a backslash in its name, which the hosts' store refuses: rename it"),
    ("not-utf8", "the file 'bad\\udcff.txt' has a name that is not UTF-8"),
])
def test_what_the_hosts_must_not_get_is_refused_before_anything_is_hashed(tmp_path, case, says):
    from lmfixture import hub_snapshot

    d = links_out(tmp_path) if case in ("outside", "hub-outside") else make_model(tmp_path)
    if case == "hub-outside":
        os.unlink(d / "notes.txt")
        d = hub_snapshot(d, tmp_path / "hf")
        os.symlink(tmp_path / "secret", d / "notes.txt")
    elif case == "nothing":
        os.symlink("gone.txt", d / "notes.txt")
    elif case == "loop":
        (d / "sub").mkdir()
        os.symlink("..", d / "sub" / "up")
    elif case == "backslash":
        (d / "a\\b.txt").write_text("x")
    elif case == "not-utf8":
        open(os.path.join(os.fsencode(d), b"bad\xff.txt"), "w").close()
    cache = HashCache(str(tmp_path / "c.json"))
    with pytest.raises(ModelError) as e:
        describe(str(d), cache)
    assert says.format(secret=tmp_path / "secret", model=os.path.realpath(d)) in str(e.value)
    assert str(e.value).startswith(str(d)) and "\n" not in str(e.value) and cache.hashed == 0


@pytest.mark.parametrize("remove, says", [("config.json", "has no config.json"),
                                          ("weights", "has no *.safetensors weights")])
def test_not_a_model_is_refused_in_one_line(tmp_path, remove, says):
    d = make_model(tmp_path)
    if remove == "weights":
        for n in os.listdir(d):
            if n.endswith(".safetensors"):
                os.unlink(d / n)
    else:
        os.unlink(d / remove)
    with pytest.raises(ModelError, match=re.escape(says)) as e:
        describe(str(d), HashCache(str(tmp_path / "c.json")))
    assert "\n" not in str(e.value)


HELD = {"path": "/s/tiny-aaaa11112222", "pid": 41, "run": "20261126-101010-abcdef", "command": "python -c ..."}


@pytest.mark.parametrize("held, forced, says", [
    ([("h1", HELD), ("h2", dict(HELD, pid=52)), ("h1", dict(HELD, pid=43))], False,
     "tiny-aaaa11112222 is in use: run 20261126-101010-abcdef on h1, h2: stop it first (clusterctl kill "
     "20261126-101010-abcdef), or give --force to stop it and remove the model"),
    ([("h1", dict(HELD, run=None, command="mlx_lm.server --model /s/tiny-aaaa11112222"))], True,
     "tiny-aaaa11112222 is in use: pid 41 on h1 (mlx_lm.server --model /s/tiny-aaaa11112222): stop it first "
     "(--force stops clusterctl runs only)"),
    ([("h2", {"path": "/s/.partial/tiny-aaaa11112222@h2~2", "push": True})], False,
     "tiny-aaaa11112222 is in use: a push on h2: let the push finish (or stop it), then remove the model"),
])
def test_a_model_in_use_is_refused_in_one_line_naming_what_uses_it(held, forced, says):
    from clusterctl.transfer.models import in_use

    assert in_use(held, forced) == says


def test_host_files_keeps_every_non_weight_file(tmp_path):
    m = describe(str(make_model(tmp_path)), HashCache(str(tmp_path / "c.json")))
    assert host_files(m, None) == [f.path for f in m.files]
    assert host_files(m, ["model-00002-of-00002.safetensors"]) == [
        "config.json", "model-00002-of-00002.safetensors", "tokenizer.json"]
    with pytest.raises(ModelError, match="not a file of the model"):
        host_files(m, ["nope.safetensors"])


ENTRIES = [
    {"key": "qwen-aaaa11112222", "name": "qwen", "digest": "aaaa1111" + "0" * 56, "host": "h1"},
    {"key": "qwen-aaaa11112222", "name": "qwen", "digest": "aaaa1111" + "0" * 56, "host": "h2"},
    {"key": "qwen-aaaa33334444", "name": "qwen", "digest": "aaaa3333" + "0" * 56, "host": "h1"},
    {"key": "llama-bbbb00000000", "name": "llama", "digest": "bbbb" + "0" * 60, "host": "h1"},
]


def test_match_by_name_key_and_prefix():
    assert [e["host"] for e in match(ENTRIES, "llama")] == ["h1"]
    assert len(match(ENTRIES, "aaaa1111")) == 2                                 # one model on two hosts
    assert [e["key"] for e in match(ENTRIES, "qwen-aaaa33334444")] == ["qwen-aaaa33334444"]
    assert len(match(ENTRIES, "AAAA3")) == 1
    assert [e["key"] for e in match(ENTRIES + [{"key": "org-m-cccc00000000", "name": "org-m", "digest": "cccc",
                                                "host": "h1"}], "org/m")] == ["org-m-cccc00000000"]


@pytest.mark.parametrize("which, says", [("qwen", "'qwen' matches 2 models (qwen-aaaa11112222, qwen-aaaa33334444)"),
                                         ("aaaa", "matches 2 models"), ("mistral", "no model in the store"),
                                         ("bbb", "no model in the store")])       # 3 hex digits: too short
def test_match_refuses_ambiguity_and_absence_in_one_line(which, says):
    with pytest.raises(ModelError, match=re.escape(says)) as e:
        match(ENTRIES, which)
    assert "\n" not in str(e.value)


def test_inventory_model_store_default_defaults_and_per_host(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("defaults:\n  model_store: /srv/models\nhosts:\n  - a\n  - name: b\n    model_store: ~/m\n")
    a, b = load_inventory(str(inv)).hosts
    assert (a.model_store, b.model_store) == ("/srv/models", "~/m")
    inv.write_text("hosts: [a]\n")
    assert load_inventory(str(inv)).hosts[0].model_store == DEFAULT_MODEL_STORE == "~/.cache/clusterctl/models"
    inv.write_text("hosts:\n  - name: a\n    model_store: ''\n")
    with pytest.raises(Exception, match="inv.yaml:3: model_store must not be empty"):
        load_inventory(str(inv))


# ---- the host helper, run as a host runs it (python -c TEXT OP REQUEST), on listings it prints -------------

def helper(op, request):
    r = subprocess.run([sys.executable, "-c", program("modelstore.py"), op, json.dumps(request)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_helper_refuses_paths_that_leave_the_store(tmp_path):
    base = {"store": str(tmp_path / "s"), "name": "m", "digest": "d" * 64, "want": [], "verify": False}
    for key, files in (("../x", {}), (".hidden", {}), ("m", {"../../etc/passwd": [1, "0" * 64]}),
                       ("m", {"/etc/passwd": [1, "0" * 64]}), ("m", {"a/.git/x": [1, "0" * 64]})):
        r = subprocess.run([sys.executable, "-c", program("modelstore.py"), "prepare",
                            json.dumps(dict(base, key=key, files=files))], capture_output=True, text=True)
        assert r.returncode != 0 and "refused" in r.stderr.splitlines()[-1]
    assert not os.path.exists(tmp_path / "x")


def test_helper_lists_and_removes_only_what_the_store_made(tmp_path):
    store = tmp_path / "s"
    (store / "m-aaaa").mkdir(parents=True)
    (store / "m-aaaa" / "w.safetensors").write_bytes(b"12345")
    (store / "m-aaaa" / ".clusterctl-entry.json").write_text(json.dumps(
        {"name": "m", "digest": "aaaa" + "0" * 60, "files": {"w.safetensors": [5, "x"], "config.json": [2, "y"]},
         "present": ["w.safetensors"]}))
    (store / ".partial" / "n-bbbb@h1" / ".clusterctl-partial").mkdir(parents=True)
    (store / ".partial" / "n-bbbb@h1" / ".clusterctl-partial" / "w.safetensors").write_bytes(b"123")
    (store / ".partial" / "n-bbbb@h1" / ".clusterctl-push.json").write_text(json.dumps(
        {"name": "n", "digest": "bbbb", "files": {"w.safetensors": [10, "z"]}, "want": ["w.safetensors"]}))
    (store / "o-cccc").mkdir()                  # a repair cut off: the store's mark, no manifest
    (store / "o-cccc" / ".clusterctl-push.json").write_text("{}")
    (store / "my-own-checkpoints").mkdir()      # the user's, in the folder model_store points at
    (store / "my-own-checkpoints" / "step-100.safetensors").write_bytes(b"mine")
    rows = {e["key"]: e for e in helper("list", {"store": str(store)})["entries"]}
    assert sorted(rows) == ["m-aaaa", "n-bbbb", "o-cccc"]
    assert rows["m-aaaa"]["state"] == "complete" and rows["m-aaaa"]["size"] == 5
    assert (rows["m-aaaa"]["files"], rows["m-aaaa"]["model_files"]) == (1, 2)
    assert rows["n-bbbb"]["state"] == "partial" and rows["n-bbbb"]["size"] == 10
    assert 3 <= rows["n-bbbb"]["bytes"] < 10
    assert rows["o-cccc"]["state"] == "incomplete" and rows["o-cccc"]["digest"] is None
    assert helper("remove", {"store": str(store), "keys": ["m-aaaa", "n-bbbb", "o-cccc", "my-own-checkpoints"]}) == {
        "removed": [str(store / "m-aaaa"), str(store / "o-cccc"), str(store / ".partial" / "n-bbbb@h1")], "held": []}
    assert helper("list", {"store": str(store)})["entries"] == []
    assert (store / "my-own-checkpoints" / "step-100.safetensors").read_bytes() == b"mine"


def test_a_push_never_deletes_a_folder_of_the_users_where_its_entry_goes(tmp_path):
    store = tmp_path / "s"
    (store / "m-aaaa11112222").mkdir(parents=True)
    (store / "m-aaaa11112222" / "notes.txt").write_text("mine")
    request = {"store": str(store), "key": "m-aaaa11112222", "name": "m", "digest": "aaaa1111" + "0" * 56,
               "files": {}, "want": [], "verify": False, "slot": "h1"}
    for op in ("prepare", "finish"):
        r = subprocess.run([sys.executable, "-c", program("modelstore.py"), op, json.dumps(request)],
                           capture_output=True, text=True)
        assert r.returncode != 0 and r.stderr.splitlines()[-1] == (
            f"ValueError: refused: {store / 'm-aaaa11112222'} is in the way and is not the store's (no "
            ".clusterctl-entry.json in it): move it away"), r.stderr
        if op == "prepare":        # as if a push had got as far as finish: its directory, nothing in it to send
            (store / ".partial" / "m-aaaa11112222@h1").mkdir(parents=True, exist_ok=True)
            (store / ".partial" / "m-aaaa11112222@h1" / ".clusterctl-push.json").write_text(json.dumps(
                {"digest": request["digest"], "stamps": {}}))
    assert (store / "m-aaaa11112222" / "notes.txt").read_text() == "mine"


def complete_entry(store, key="m-aaaa11112222"):
    (store / key).mkdir(parents=True)
    (store / key / "config.json").write_text("{}")
    (store / key / ".clusterctl-entry.json").write_text(json.dumps({"name": "m", "digest": "aaaa1111" + "0" * 56,
                                                                    "files": {}, "present": []}))
    return store / key


def test_helper_remove_refuses_an_entry_a_process_names_and_says_which_run(tmp_path):
    store = tmp_path / "my store"
    entry = complete_entry(store)
    other = complete_entry(store, "m-aaaa1111222")          # a name that starts like it is another entry
    # as a serve rank's command line names it: the run's token, then its spec (JSON) naming the entry
    spec = json.dumps({"name": "m", "models": [str(entry)]})
    rank = subprocess.Popen([sys.executable, "-c", "#clusterctl-run-20261126-101010-abcdef\nimport time; time.sleep(60)",
                             spec], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not (answer := helper("remove", {"store": str(store), "keys": [entry.name], "dry": True}))["held"]:
            assert time.monotonic() < deadline, "the rank never showed in ps"
            time.sleep(0.05)
        assert answer["held"] == [{"path": str(entry), "pid": rank.pid, "run": "20261126-101010-abcdef",
                                   "command": answer["held"][0]["command"]}]
        assert answer["held"][0]["command"].startswith(f"{sys.executable} -c #clusterctl-run-20261126-101010-abcdef")
        refused = helper("remove", {"store": str(store), "keys": [entry.name, other.name]})
        assert refused["removed"] == [] and refused["held"][0]["pid"] == rank.pid
        assert (entry / "config.json").exists() and (other / "config.json").exists()       # nothing, on this host
        assert helper("remove", {"store": str(store), "keys": [other.name]})["removed"] == [str(other)]
    finally:
        rank.kill()
        rank.wait()
    assert helper("remove", {"store": str(store), "keys": [entry.name]}) == {"removed": [str(entry)], "held": []}


def hold(store, key="m-aaaa11112222", slot="h1"):
    """The helper's `hold` as a push starts it: (its process, the slot it took)."""
    proc = subprocess.Popen([sys.executable, "-c", program("modelstore.py"), "hold",
                             json.dumps({"store": str(store), "key": key, "slot": slot})],
                            stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())["slot"]


def test_each_push_holds_its_own_slot_and_a_cut_off_one_is_continued_by_the_next(tmp_path):
    store = tmp_path / "s"
    first, a = hold(store)
    second, b = hold(store)
    try:
        assert (a, b) == ("h1", "h1~2")
        (store / ".partial" / "m-aaaa11112222@h1~2").mkdir()
        r = helper("remove", {"store": str(store), "keys": ["m-aaaa11112222"]})      # pushes are writing it
        assert r["removed"] == [] and {h["path"] for h in r["held"]} == {
            str(store / ".partial" / "m-aaaa11112222@h1"), str(store / ".partial" / "m-aaaa11112222@h1~2")}
        second.kill()                      # a push cut off (SIGKILL): its directory is free again
        second.wait()
        third, c = hold(store)
        assert c == "h1~2"                 # continued by the next push, not a new directory
        third.kill()
        third.wait()
    finally:
        for p in (first, second):
            p.kill()
            p.wait()
    assert helper("remove", {"store": str(store), "keys": ["m-aaaa11112222"]})["removed"] == [
        str(store / ".partial" / "m-aaaa11112222@h1~2")]
    assert os.listdir(store / ".partial") == []
