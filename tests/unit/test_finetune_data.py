"""Fine-tuning records (data/records.py): mlx-lm's jsonl layout read and checked line by line, packed into rows
with the prompt masked, and the global row order that makes one rank with --accum 2 train what two ranks do."""
import json
import os

import pytest

from clusterctl.data import records
from clusterctl.errors import SourceError


def write(tmp_path, *lines, name="train.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_each_kind_of_record_is_recognised_and_blank_lines_are_not_records(tmp_path):
    path = write(tmp_path, '{"text": "a"}', "", '{"prompt": "p", "completion": "c"}', "   ",
                 '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}')
    got = records.read_records(path)
    assert [r.kind for r in got] == ["text", "completions", "chat"]
    assert [r.where for r in got] == [f"{path}:1", f"{path}:3", f"{path}:5"]


@pytest.mark.parametrize("line, says", [
    ('{"text": "a"', "not JSON (Expecting ',' delimiter at column 13)"),
    ('["text"]', "a record must be a JSON object, not list"),
    ('{"text": 3}', "\"text\" must be a string, not int"),
    ('{"prompt": "p"}', "a completions record needs string \"prompt\" and \"completion\" (completion is missing)"),
    ('{"messages": []}', "\"messages\" must be a non-empty list of {\"role\", \"content\"} objects"),
    ('{"messages": [{"role": "user"}]}', "messages[0] needs a string \"role\" and a string \"content\""),
    ('{"question": "q", "answer": "a"}', "no \"text\", \"prompt\"/\"completion\" or \"messages\" (keys: answer, question)"),
])
def test_a_bad_record_is_one_error_naming_file_and_line(tmp_path, line, says):
    path = write(tmp_path, '{"text": "fine"}', line)
    with pytest.raises(SourceError) as e:
        records.read_records(path)
    assert str(e.value) == f"{path}:2: {says}"


def test_a_file_that_is_not_utf8_or_has_no_records_is_refused(tmp_path):
    bad = tmp_path / "train.jsonl"
    bad.write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(SourceError, match="not UTF-8 text"):
        records.read_records(str(bad))
    with pytest.raises(SourceError, match="no records"):
        records.read_records(write(tmp_path, "", " "))


def test_without_valid_jsonl_every_20th_record_is_held_out(tmp_path):
    write(tmp_path, *[json.dumps({"text": str(i)}) for i in range(45)])
    train, held, given = records.read_dir(str(tmp_path))
    assert not given and [r.value["text"] for r in held] == ["19", "39"] and len(train) == 43
    write(tmp_path, '{"text": "v"}', name="valid.jsonl")
    train, held, given = records.read_dir(str(tmp_path))
    assert given and len(train) == 45 and [r.value["text"] for r in held] == ["v"]


def test_packing_keeps_every_target_once_and_masks_prompts_and_the_tail():
    # two sequences: 5 tokens with a 2-token prompt, then 4 tokens of text
    packed = records.pack([([10, 11, 12, 13, 14], 2), ([20, 21, 22, 23], 0)], block_size=4, filler=0)
    assert packed.rows == [[10, 11, 12, 13, 14], [14, 20, 21, 22, 23]]
    I = records.IGNORE
    assert packed.labels == [[I, I, 12, 13, 14], [14, 20, 21, 22, 23]]
    targets = [t for row in packed.labels for t in row[1:]]
    assert targets == [I, 12, 13, 14, 20, 21, 22, 23] and packed.trained == 7 and packed.tokens == 9
    tail = records.pack([([1, 2, 3, 4, 5, 6], 0)], block_size=4, filler=99)
    assert tail.rows == [[1, 2, 3, 4, 5], [5, 6, 99, 99, 99]]
    assert tail.labels[1] == [5, 6, I, I, I]


class Rows:
    """A stand-in Packed of n rows whose tokens name the row."""
    def __init__(self, n):
        self.rows = [[r] * 5 for r in range(n)]
        self.labels = self.rows
        self.tokens, self.trained = 5 * n, 4 * n


def test_one_rank_with_accum_2_takes_the_rows_two_ranks_take():
    one = records.RowLoader(Rows(10), batch_size=2, accum=2, world=1, rank=0, seed=3)
    two = [records.RowLoader(Rows(10), batch_size=2, accum=1, world=2, rank=r, seed=3) for r in range(2)]
    for step in range(8):                  # past an epoch (10 rows, 4 a step): the next permutation continues
        assert one.indices(2 * step) == two[0].indices(step)
        assert one.indices(2 * step + 1) == two[1].indices(step)
    seen = [i for step in range(5) for m in (2 * step, 2 * step + 1) for i in one.indices(m)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))   # each epoch whole
    assert seen[:10] != seen[10:20]        # and reshuffled
    x, y = one.batch(0)
    assert x.shape == (2, 4) and y.shape == (2, 4) and x[:, 0].tolist() == one.indices(0)


def test_the_model_chat_template_masks_the_prompt_as_mlx_lm_does(tmp_path):
    pytest.importorskip("mlx_lm")
    import lmfixture
    from mlx_lm.utils import load_tokenizer

    lmfixture.make_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)
    rec = records.Record("completions", {"prompt": "What is 2 plus 3?", "completion": "2 plus 3 is 5."}, "x:1")
    ids, offset = records.tokenize(rec, tok, mask_prompt=True)
    assert tok.decode(ids[:offset]) == "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(ids[offset:]) == "2 plus 3 is 5.<|im_end|>\n"
    assert records.tokenize(rec, tok, mask_prompt=False)[1] == 0
    text, off = records.tokenize(records.Record("text", {"text": "Tom found a key."}, "x:2"), tok, True)
    assert off == 0 and text[-1] == tok.eos_token_id and tok.decode(text[:-1]) == "Tom found a key."


def test_a_chat_record_without_a_chat_template_names_the_record(tmp_path):
    pytest.importorskip("mlx_lm")
    import lmfixture
    from mlx_lm.utils import load_tokenizer

    lmfixture.make_tokenizer(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_tokenizer(tmp_path)
    rec = records.Record("chat", {"messages": [{"role": "user", "content": "hi"}]}, "d/train.jsonl:7")
    with pytest.raises(SourceError, match=r"^d/train.jsonl:7: a chat record is rendered with the model's chat template"):
        records.tokenize(rec, tok, True)


def test_prepared_rows_deal_every_row_to_one_shard_and_read_back_as_written(tmp_path):
    pytest.importorskip("mlx_lm")
    import lmfixture
    from mlx_lm.utils import load_tokenizer

    model = lmfixture.make_model(tmp_path / "m")
    data = lmfixture.make_data(tmp_path / "chat", "chat", records=40)
    m = records.prepare_records(str(data), 3, str(tmp_path / "prep"), str(model), block_size=32)
    whole = records.rows_of(records.read_dir(str(data))[0], load_tokenizer(model), 32, True)
    assert m["kind"] == "records" and m["world_size"] == 3 and m["block_size"] == 32
    assert [s["rows"] for s in m["shards"]] == [len(whole.rows[r::3]) for r in range(3)]
    shards = [records.load_rows(str(tmp_path / "prep"), s, 32) for s in m["shards"]]
    got = sorted(tuple(r + l) for p in shards for r, l in zip(p.rows, p.labels))
    assert got == sorted(tuple(r + l) for r, l in zip(whole.rows, whole.labels))     # every row once, labels too
    assert m["tokenizer_sha256"] == records.tokenizer_digest(str(model))
    (tmp_path / "prep" / m["shards"][1]["file"]).write_bytes(b"\0" * 8)
    with pytest.raises(SourceError, match="truncated or corrupted"):
        records.load_rows(str(tmp_path / "prep"), m["shards"][1], 32)
    with pytest.raises(SourceError, match="--block-size from 1 to 1048576"):
        records.prepare_records(str(data), 2, str(tmp_path / "p2"), str(model), block_size=int("9" * 400))
    with pytest.raises(SourceError, match="give the mlx-lm model directory you will fine-tune"):
        records.prepare_records(str(data), 2, str(tmp_path / "p2"), str(data), block_size=32)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(SourceError, match="exists and holds no manifest.json of prepared records, which an earlier"):
        records.prepare_records(str(data), 2, str(tmp_path / "mine"), str(model), block_size=32)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    # a manifest.json of someone else's (it was enough to have the directory replaced whole), or a file of yours
    # beside a prepare's own: neither is deleted
    (tmp_path / "mine" / "manifest.json").write_text('{"name": "my project"}')
    with pytest.raises(SourceError, match="holds another manifest.json, which an earlier `data prepare` did not write"):
        records.prepare_records(str(data), 2, str(tmp_path / "mine"), str(model), block_size=32)
    (tmp_path / "prep" / "notes.txt").write_text("keep")
    with pytest.raises(SourceError, match="holds 'notes.txt', which an earlier"):
        records.prepare_records(str(data), 2, str(tmp_path / "prep"), str(model), block_size=32)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep" == (tmp_path / "prep" / "notes.txt").read_text()
    (tmp_path / "prep" / "notes.txt").unlink()
    again = records.prepare_records(str(data), 2, str(tmp_path / "prep"), str(model), block_size=32)   # its own: replaced
    assert again["world_size"] == 2 and sorted(os.listdir(tmp_path / "prep")) == sorted(
        ["manifest.json", "val.bin", *(s["file"] for s in again["shards"])])
    from clusterctl.data.shards import read_manifest
    with pytest.raises(Exception, match="rows prepared from jsonl records for fine-tuning a model"):
        read_manifest(str(tmp_path / "prep"))
