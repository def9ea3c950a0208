"""sync and shard push to a `local: true` host (this machine, no SSH): the core end to end, quickly."""
import os
import hashlib
import json

import pytest

from clusterctl.hosts.connector import Connector
from clusterctl.inventory import parse
from clusterctl.transfer.shards import ShardError, files_for_host, push_shards, read_manifest
from clusterctl.transfer.sync import SyncError, SyncOptions, destination, plan_sync, sync_tree


def local_cluster(tmp_path, slots=1):
    return parse(f"hosts: [{{name: here, local: true, slots: {slots}, workdir: {json.dumps(str(tmp_path / 'w'))}}}]\n",
                 "inv.yaml")


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_local_sync_is_incremental_and_dry_run_moves_nothing(tmp_path, method):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("a\n")
    (src / "b.py").write_text("b\n")
    cluster = local_cluster(tmp_path)
    plan = plan_sync(str(src))
    dry = sync_tree(Connector(cluster), plan, SyncOptions(method=method, dry_run=True))["here"].value
    assert sorted(dry.moved) == ["b.py", "pkg/a.py"] and not (tmp_path / "w").exists()
    first = sync_tree(Connector(cluster), plan, SyncOptions(method=method))["here"].value
    assert sorted(first.moved) == ["b.py", "pkg/a.py"] and first.moved_bytes == 4
    assert (tmp_path / "w" / "pkg" / "a.py").read_text() == "a\n"
    assert sync_tree(Connector(cluster), plan, SyncOptions(method=method))["here"].value.moved == []
    (src / "b.py").write_text("changed\n")
    again = sync_tree(Connector(cluster), plan_sync(str(src)), SyncOptions(method=method))["here"].value
    assert again.moved == ["b.py"] and (tmp_path / "w" / "b.py").read_text() == "changed\n"


def test_dest_must_stay_inside_the_workdir(tmp_path):
    host = local_cluster(tmp_path).hosts[0]
    assert destination(host, "code/x") == str(tmp_path / "w" / "code" / "x")
    assert destination(host, None) == str(tmp_path / "w")
    for bad in ("../up", "/abs", "~/home", "a/../../b"):
        with pytest.raises(SyncError):
            destination(host, bad)


def write_manifest(d, world):
    d.mkdir(parents=True, exist_ok=True)
    shards = []
    for r in range(world):
        name = f"shard-{r:05d}-of-{world:05d}.bin"
        (d / name).write_bytes(bytes([r]) * 100)
        shards.append({"file": name, "tokens": 50, "sha256": hashlib.sha256(bytes([r]) * 100).hexdigest()})
    (d / "val.bin").write_bytes(b"v" * 10)
    m = {"format": 1, "tokenizer": {"type": "byte"}, "vocab_size": 256, "dtype": "uint16", "world_size": world,
         "tokens_per_shard": 50, "dropped_tokens": 0, "source": "test", "shards": shards,
         "val": {"file": "val.bin", "tokens": 5, "sha256": hashlib.sha256(b"v" * 10).hexdigest()}}
    (d / "manifest.json").write_text(json.dumps(m))
    return m


def test_push_to_a_two_slot_host_gets_both_ranks_and_removes_stale_shards(tmp_path):
    write_manifest(tmp_path / "tiny", 2)
    cluster = local_cluster(tmp_path, slots=2)
    stale = tmp_path / "w" / "data" / "tiny" / "shard-00000-of-00004.bin"
    stale.parent.mkdir(parents=True)
    stale.write_text("old")
    first = push_shards(Connector(cluster), str(tmp_path / "tiny"))["here"].value
    assert first.ranks == [0, 1] and first.removed == ["shard-00000-of-00004.bin"]
    assert sorted(p.name for p in stale.parent.iterdir()) == [
        "manifest.json", "shard-00000-of-00002.bin", "shard-00001-of-00002.bin", "val.bin"]
    assert push_shards(Connector(cluster), str(tmp_path / "tiny"))["here"].value.sent == []


def test_all_shards_names_every_shard_for_every_host(tmp_path):
    """data push --all-shards (run --all-shards): a host holds every shard, so the trainer's balancing can give
    its rank rows of any other (docs/trainer.md#balanced-data-parallelism)."""
    write_manifest(tmp_path / "tiny", 4)
    cluster = parse(f"hosts: [{{name: here, local: true, workdir: {json.dumps(str(tmp_path / 'w'))}}}, "
                    "{name: a, hostname: 192.0.2.1}, {name: b, hostname: 192.0.2.2}, {name: c, hostname: 192.0.2.3}]\n",
                    "inv.yaml")
    here = cluster.hosts[0]
    assert [f for f, _ in files_for_host(read_manifest(str(tmp_path / "tiny")), here)] == [
        "shard-00000-of-00004.bin", "val.bin"]
    every = [f for f, _ in files_for_host(read_manifest(str(tmp_path / "tiny")), here, all_shards=True)]
    assert every == [f"shard-0000{k}-of-00004.bin" for k in range(4)] + ["val.bin"]
    alone = parse(f"hosts: [{{name: here, local: true, slots: 4, workdir: {json.dumps(str(tmp_path / 'w'))}}}]\n",
                  "inv.yaml")
    pushed = push_shards(Connector(alone), str(tmp_path / "tiny"), all_shards=True)["here"].value
    assert sorted(pushed.sent) == sorted(every + ["manifest.json"])


def test_manifest_validation(tmp_path):
    with pytest.raises(ShardError, match="no such directory"):
        read_manifest(str(tmp_path / "nope"))
    (tmp_path / "d").mkdir()
    with pytest.raises(ShardError, match="clusterctl data prepare"):
        read_manifest(str(tmp_path / "d"))
    (tmp_path / "d" / "manifest.json").write_text("{")
    with pytest.raises(ShardError, match="not valid JSON"):
        read_manifest(str(tmp_path / "d"))
    (tmp_path / "d" / "manifest.json").write_text('{"world_size": 2}')
    with pytest.raises(ShardError, match="not a clusterctl manifest"):
        read_manifest(str(tmp_path / "d"))
    m = write_manifest(tmp_path / "e", 2)
    m["shards"][1]["file"] = "../escape.bin"
    (tmp_path / "e" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardError, match="plain name"):
        read_manifest(str(tmp_path / "e"))


def test_world_size_mismatch_names_the_fix(tmp_path):
    write_manifest(tmp_path / "tiny", 3)
    with pytest.raises(ShardError) as info:
        push_shards(Connector(local_cluster(tmp_path, slots=2)), str(tmp_path / "tiny"))
    assert info.value.exit_code == 2 and "run `clusterctl data prepare --world 2`" in str(info.value)


def test_files_for_host_accepts_a_manifest_object(tmp_path):
    from types import SimpleNamespace as NS

    m = NS(world_size=2, shards=[NS(file="s0", sha256="a"), NS(file="s1", sha256="b")], val=NS(file="v", sha256="c"),
           tokenizer={"type": "byte"})
    host = local_cluster(tmp_path, slots=2).hosts[0]
    assert files_for_host(m, host) == [("s0", "a"), ("s1", "b"), ("v", "c")]


def test_an_hf_tokenized_dataset_sends_its_tokenizer_too(tmp_path):
    from types import SimpleNamespace as NS

    m = NS(world_size=1, shards=[NS(file="s0", sha256="a")], val=NS(file="v", sha256="c"),
           tokenizer={"type": "hf", "path": "tokenizer.json", "sha256": "d"})
    host = local_cluster(tmp_path).hosts[0]
    assert files_for_host(m, host) == [("s0", "a"), ("v", "c"), ("tokenizer.json", "d")]
    m.tokenizer = {"type": "byte"}
    assert files_for_host(m, host) == [("s0", "a"), ("v", "c")]


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_sync_delete_keeps_an_extra_name_that_is_the_same_file_as_a_synced_one(tmp_path, method):
    """`git mv Model.py model.py` then `sync --delete` to a case-insensitive Mac: the host still lists
    `Model.py`, which there is the same file as `model.py`. A hard link stands in for that on Linux."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.py").write_text("m\n")
    (src / "old.py").write_text("o\n")
    cluster = local_cluster(tmp_path)
    sync_tree(Connector(cluster), plan_sync(str(src)), SyncOptions(method=method))
    (src / "old.py").unlink()
    os.link(tmp_path / "w" / "model.py", tmp_path / "w" / "Model.py")
    options = SyncOptions(method=method, delete=True)
    dry = sync_tree(Connector(cluster), plan_sync(str(src)), SyncOptions(method=method, delete=True, dry_run=True))["here"].value
    assert dry.deleted == ["old.py"]
    done = sync_tree(Connector(cluster), plan_sync(str(src)), options)["here"].value
    assert done.deleted == ["old.py"]
    assert (tmp_path / "w" / "Model.py").exists() and (tmp_path / "w" / "model.py").read_text() == "m\n"
