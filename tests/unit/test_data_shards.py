"""prepare(): equal shards, exact content, checksums, the val split, atomic replacement, bad input."""
import hashlib
import json
import os
from array import array

import pytest

from clusterctl.data.corpus import is_val, iter_documents
from clusterctl.data.shards import (MANIFEST, Manifest, prepare, read_manifest, reshard, shard_file, shard_name,
                                    verify_file)
from clusterctl.data.tokenizer import ByteTokenizer
from clusterctl.errors import ShardError, SourceError


def token_stream(source, val_fraction=0.01):
    """What prepare must write, computed the obvious way: (train tokens, val tokens)."""
    tok, train, val = ByteTokenizer(), [], []
    for k, text in enumerate(iter_documents(source)):
        (val if is_val(k, val_fraction) else train).extend(tok.encode(text) + [tok.eos_id])
    return train, val


def read_tokens(path, code="H"):
    a = array(code)
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a.tolist()


def test_prepare_writes_equal_shards_with_exactly_the_corpus_tokens(tmp_path):
    events = []
    m = prepare("embedded:300", 3, str(tmp_path), progress=lambda *e: events.append(e))
    train, val = token_stream("embedded:300")
    per = len(train) // 3
    assert (m.world_size, m.tokens_per_shard, m.dropped_tokens) == (3, per, len(train) - 3 * per)
    assert (m.dtype, m.vocab_size, m.tokenizer, m.source) == ("uint16", 257, {"type": "byte"}, "embedded:300")
    assert [s.file for s in m.shards] == ["shard-00000-of-00003.bin", "shard-00001-of-00003.bin",
                                          "shard-00002-of-00003.bin"]
    for rank, info in enumerate(m.shards):
        path = tmp_path / info.file
        assert read_tokens(path) == train[rank * per:(rank + 1) * per]
        assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and info.tokens == per
    assert read_tokens(tmp_path / "val.bin") == val and m.val.tokens == len(val) > 0
    assert sorted(os.listdir(tmp_path)) == sorted([s.file for s in m.shards] + ["val.bin", MANIFEST])
    assert read_manifest(str(tmp_path)) == m
    assert json.loads((tmp_path / MANIFEST).read_text())["shards"][1]["tokens"] == per
    assert shard_file(str(tmp_path), 2) == tmp_path / "shard-00002-of-00003.bin"
    phases = {e[0] for e in events}
    assert phases == {"tokenize", "write"} and events[-1] == ("write", 3 * per, 3 * per)
    assert ("tokenize", 300, 300) in events


def test_a_small_corpus_holds_out_its_tail_when_no_document_is_selected(tmp_path):
    (tmp_path / "c.txt").write_text("alpha beta gamma\n\ndelta epsilon\n")
    m = prepare(str(tmp_path / "c.txt"), 2, str(tmp_path / "out"), val_fraction=0.1)
    train, _ = token_stream(str(tmp_path / "c.txt"), 0)
    n_val = int(len(train) * 0.1)
    assert read_tokens(tmp_path / "out" / "val.bin") == train[len(train) - n_val:]
    assert m.tokens_per_shard == (len(train) - n_val) // 2
    m = prepare(str(tmp_path / "c.txt"), 1, str(tmp_path / "none"), val_fraction=0)
    assert m.val.tokens == 0 and read_tokens(tmp_path / "none" / m.shards[0].file) == train


def test_rerun_with_another_world_size_replaces_the_directory(tmp_path):
    prepare("embedded:100", 4, str(tmp_path))
    (tmp_path / "notes.txt").write_text("mine")
    m = prepare("embedded:100", 2, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(["shard-00000-of-00002.bin", "shard-00001-of-00002.bin",
                                                   "val.bin", MANIFEST, "notes.txt"])
    assert read_manifest(str(tmp_path)).world_size == 2 == m.world_size


def test_a_failed_prepare_leaves_no_partial_file_under_a_final_name(tmp_path):
    before = prepare("embedded:60", 2, str(tmp_path))
    snapshot = {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)}

    def interrupt(phase, done, total):
        if phase == "write":
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        prepare("embedded:90", 3, str(tmp_path), progress=interrupt)
    assert {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)} == snapshot   # no staging left
    assert read_manifest(str(tmp_path)) == before


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(ShardError, match="world size must be a whole number >= 1"):
        prepare("embedded:10", 0, out)
    with pytest.raises(SourceError, match="no such file"):
        prepare(str(tmp_path / "missing.txt"), 2, out)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(SourceError, match="empty corpus"):
        prepare(str(tmp_path / "empty.txt"), 2, out)
    (tmp_path / "tiny.txt").write_text("ab\n")
    with pytest.raises(ShardError, match="3 training tokens cannot fill 4 shards"):
        prepare(str(tmp_path / "tiny.txt"), 4, out, val_fraction=0)
    assert os.listdir(out) == []       # the failed runs left no staging directory behind


def test_read_manifest_validates(tmp_path):
    with pytest.raises(ShardError, match="no manifest.json"):
        read_manifest(str(tmp_path))
    m = prepare("embedded:40", 2, str(tmp_path))
    good = json.loads(m.to_json())
    for change, message in [({"format": 2}, "format 2"), ({"world_size": 3}, "expected shards"),
                            ({"dtype": "int8"}, "dtype"), ({"tokens_per_shard": -1}, "whole number"),
                            ({"val": {"file": "../x"}}, "malformed file entry"),
                            ({"val": {"file": "..", "tokens": 1, "sha256": "x"}}, "malformed file entry"),
                            # issue 25 item 3: the tokenizer's path was read, sent and verified unchecked
                            ({"tokenizer": {"kind": "hf", "path": "../../victim.txt"}}, "tokenizer.path '../../victim.txt'"),
                            ({"tokenizer": {"kind": "hf", "path": "a\\b.json"}}, "must be a plain file name")]:
        (tmp_path / MANIFEST).write_text(json.dumps({**good, **change}))
        with pytest.raises(ShardError, match=message):
            read_manifest(str(tmp_path))
    (tmp_path / MANIFEST).write_text(m.to_json())
    with pytest.raises(ShardError, match="rank 2 is outside world size 2"):
        shard_file(str(tmp_path), 2)


def test_verify_file_catches_truncation_and_corruption(tmp_path):
    m = prepare("embedded:40", 2, str(tmp_path))
    verify_file(str(tmp_path), m.shards[1], m.dtype)
    path = tmp_path / m.shards[1].file
    data = path.read_bytes()
    path.write_bytes(data[:-2])
    with pytest.raises(ShardError, match="truncated or corrupted"):
        verify_file(str(tmp_path), m.shards[1], m.dtype)
    path.write_bytes(b"\x00\x00" + data[2:])
    with pytest.raises(ShardError, match="sha256 differs"):
        verify_file(str(tmp_path), m.shards[1], m.dtype)


def test_hf_tokenizer_shards_carry_their_tokenizer(tmp_path):
    from test_data_tokenizer import make_tokenizer_json

    from clusterctl.data.loader import rank_tokens
    path = make_tokenizer_json(tmp_path / "tok.json")
    m = prepare("embedded:50", 2, str(tmp_path / "out"), tokenizer=path)
    assert m.tokenizer["path"] == "tokenizer.json" and (tmp_path / "out" / "tokenizer.json").exists()
    assert m.dtype == "uint16" and m.vocab_size == 600
    train, _ = rank_tokens(1, 2, data_dir=str(tmp_path / "out"), tokenizer=path)
    assert len(train) == m.tokens_per_shard
    from clusterctl.data.tokenizer import load_tokenizer
    tok = load_tokenizer(m.tokenizer, base_dir=str(tmp_path / "out"))
    assert "they went to" in tok.decode(train.window(0, 200))


def test_manifest_round_trips_through_json(tmp_path):
    m = prepare("embedded:30", 1, str(tmp_path))
    assert Manifest.from_dict(json.loads(m.to_json()), "x") == m
    assert shard_name(3, 12) == "shard-00003-of-00012.bin"


def test_a_vocabulary_past_65535_gets_uint32_shards(tmp_path):
    from clusterctl.data.loader import rank_tokens

    class WideBytes(ByteTokenizer):          # byte ids, but an EOS id that needs 32 bits
        vocab_size, eos_id = 70000, 69999

        def spec(self):
            return {"type": "byte"}
    m = prepare("embedded:20", 1, str(tmp_path), tokenizer=WideBytes(), val_fraction=0)
    assert m.dtype == "uint32" and m.vocab_size == 70000
    train, _ = token_stream("embedded:20", 0)
    expected = [69999 if t == 256 else t for t in train]
    assert read_tokens(tmp_path / m.shards[0].file, "I") == expected
    tokens, _ = rank_tokens(0, 1, data_dir=str(tmp_path))
    assert tokens.window(0, len(tokens)).tolist() == expected


def test_reshard_cuts_the_same_tokens_into_another_number_of_equal_shards(tmp_path):
    """An elastic restart on fewer ranks: the 3-rank shards, read in rank order, are cut into 2 (and back)."""
    prepare("embedded:300", 3, str(tmp_path / "three"))
    train, val = token_stream("embedded:300")
    stream = train[:3 * (len(train) // 3)]          # what the 3 shards hold
    m = reshard(str(tmp_path / "three"), 2, str(tmp_path / "two"))
    per = len(stream) // 2
    assert (m.world_size, m.tokens_per_shard, m.dropped_tokens) == (2, per, len(train) - 2 * per)
    for rank, info in enumerate(m.shards):
        path = tmp_path / "two" / info.file
        assert read_tokens(path) == stream[rank * per:(rank + 1) * per]
        assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert read_tokens(tmp_path / "two" / "val.bin") == val
    assert read_manifest(str(tmp_path / "two")) == m            # a valid manifest, every file verified
    for info in m.shards:
        verify_file(str(tmp_path / "two"), info, m.dtype)
    back = reshard(str(tmp_path / "two"), 3, str(tmp_path / "two"))   # in place: the 2-rank shards are gone
    assert sorted(os.listdir(tmp_path / "two")) == sorted([s.file for s in back.shards] + ["val.bin", MANIFEST])
    with pytest.raises(ShardError, match="cannot fill"):
        reshard(str(tmp_path / "three"), 10**9, str(tmp_path / "many"))
