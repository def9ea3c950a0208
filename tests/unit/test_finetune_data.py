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


def test_a_record_becomes_its_inputs_and_targets_with_the_prompt_masked():
    I = records.IGNORE
    assert records.pairs([10, 11, 12, 13, 14], 2) == ([10, 11, 12, 13], [I, 12, 13, 14])
    assert records.pairs([20, 21, 22], 0) == ([20, 21], [21, 22])
    # mlx-lm's test score also predicts one padding token after the record (docs/from-mlx-lm.md#scores)
    assert records.pairs([20, 21, 22], 0, pad_target=0) == ([20, 21, 22], [21, 22, 0])


def test_packing_fills_rows_longest_first_and_numbers_each_records_positions():
    seqs = [records.pairs(list(range(100, 100 + n)), 0) for n in (20, 9, 13, 5)]      # 19, 8, 12 and 4 positions
    rows = records.pack(seqs, filler=0)
    # placed in rows of 24 (the longest rounded up to 8): 19 + 4 in one, 8 + 12 in the next; then trimmed to the
    # fullest row's 23, which computes no position that no record fills in every row
    assert rows.shape == (2, 23)
    I = records.IGNORE
    assert rows.segments[0] == [0] * 19 + [1] * 4 and rows.segments[1] == [0] * 8 + [1] * 12 + [-1] * 3
    assert rows.tokens[0][:19] == seqs[0][0] and rows.tokens[0][19:23] == seqs[3][0] and rows.tokens[1][20] == 0
    assert rows.labels[1][20:] == [I] * 3
    targets = sorted(t for row in rows.labels for t in row if t != I)
    assert targets == sorted(t for _, lab in seqs for t in lab)                 # every target once
    apart = records.pack(seqs, filler=0, together=False)
    assert apart.shape == (4, 19) and all(set(seg) <= {0, -1} for seg in apart.segments)
    # a width given is kept as it is
    assert records.pack(seqs, filler=0, width=32).shape == (2, 32)


class Seqs(records.Sequences):
    """n records whose tokens name the record."""
    def __init__(self, n):
        super().__init__([[k] * (3 + k % 4) for k in range(n)], [0] * n)


@pytest.mark.parametrize("grouped", [False, True])
def test_one_rank_with_accum_2_and_half_the_batch_takes_the_records_two_ranks_take(grouped):
    one = records.RecordLoader(Seqs(10), batch_size=2, accum=2, world=1, rank=0, seed=3, filler=0)
    two = [records.RecordLoader(Seqs(10), batch_size=4, accum=1, world=2, rank=r, seed=3, filler=0) for r in range(2)]
    for loader in (one, *two):
        loader.grouped = grouped
    for step in range(8):                  # past an epoch (10 records, 4 a step): the next permutation continues
        assert one.indices(2 * step) == two[0].indices(step)
        assert one.indices(2 * step + 1) == two[1].indices(step)
        assert one.step_tokens(step) == two[0].step_tokens(step) == two[1].step_tokens(step)
    seen = [k for step in range(5) for k in two[0].global_batch(step)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))   # each epoch whole
    assert seen[:10] != seen[10:20]        # and reshuffled
    x, y, seg = one.step(0, 2)
    assert x.shape == y.shape == seg.shape and x.shape[0] == 2
    one.picked = True
    x, y, seg, picks = one.step(0, 2)
    assert picks.shape[0] == 2 and picks.shape[1] % records.PICK_MULTIPLE == 0
    for i in range(2):          # the flat positions with a target, then -1
        trained = [k for k, t in enumerate(y[i].reshape(-1).tolist()) if t != records.IGNORE]
        assert [p for p in picks[i].tolist() if p >= 0] == trained and set(picks[i].tolist()[len(trained):]) <= {-1}
    with pytest.raises(SourceError, match="the global batch .* which 3 ranks cannot share equally"):
        records.RecordLoader(Seqs(10), batch_size=4, accum=1, world=3, rank=0, seed=3, filler=0)


def test_grouped_by_length_a_batch_holds_records_near_in_length_in_no_order_through_the_epoch():
    lengths = [8 + (k * 37) % 90 for k in range(600)]
    seqs = records.Sequences([[1] * n for n in lengths], [0] * 600)
    loader = records.RecordLoader(seqs, batch_size=8, accum=1, world=1, rank=0, seed=1, filler=0)
    plain = [loader.global_batch(g) for g in range(75)]
    loader.grouped, loader._orders = True, {}
    grouped = [loader.global_batch(g) for g in range(75)]
    assert sorted(sum(grouped, [])) == list(range(600))                  # an epoch: every record once

    def spread(batches):
        return sum(max(lengths[k] for k in b) - min(lengths[k] for k in b) for b in batches) / len(batches)
    assert spread(grouped) < spread(plain) / 4
    firsts = [lengths[b[0]] for b in grouped[:32]]                          # runs of 16 in shuffled order
    assert firsts != sorted(firsts)


def test_a_score_reads_every_record_once_in_file_order_every_rank_as_many_batches():
    seqs = Seqs(7)
    sets = [records.HeldOut(seqs, batch_size=4, world=2, rank=r, filler=0) for r in range(2)]
    got = [[sorted({t for row in x.tolist() for t in row if t}) for x, y, s in h.held_out(-1)] for h in sets]
    assert got[0] == [[1], [4, 5]] and got[1] == [[2, 3], [6]]    # batches: 0, 1 | 2, 3 and 4, 5 | 6 (0 is the filler)
    assert [len(list(h.held_out(1))) for h in sets] == [1, 1]
    assert [len(list(h.held_out(-1))) for h in sets] == [2, 2]


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


def test_prepared_records_deal_every_record_to_one_shard_and_read_back_as_written(tmp_path):
    pytest.importorskip("mlx_lm")
    import lmfixture
    from mlx_lm.utils import load_tokenizer

    model = lmfixture.make_model(tmp_path / "m")
    data = lmfixture.make_data(tmp_path / "chat", "chat", records=40)
    m = records.prepare_records(str(data), 3, str(tmp_path / "prep"), str(model), max_seq_length=24, mask_prompt=True)
    whole = records.tokenize_all(records.read_dir(str(data))[0], load_tokenizer(model), True, 24)
    assert m["kind"] == "records" and m["world_size"] == 3 and m["max_seq_length"] == 24 and whole.cut > 0
    assert [s["records"] for s in m["shards"]] == [len(range(r, len(whole), 3)) for r in range(3)]
    shards = [records.load_records(str(tmp_path / "prep"), s) for s in m["shards"]]
    got = sorted((tuple(t), o) for p in shards for t, o in zip(p.ids, p.offsets))
    assert got == sorted((tuple(t), o) for t, o in zip(whole.ids, whole.offsets))     # every record once, prompts too
    assert m["tokenizer_sha256"] == records.tokenizer_digest(str(model))
    (tmp_path / "prep" / m["shards"][1]["file"]).write_bytes(b"\0" * 8)
    with pytest.raises(SourceError, match="truncated or corrupted"):
        records.load_records(str(tmp_path / "prep"), m["shards"][1])
    with pytest.raises(SourceError, match="--max-seq-length from 1 to 1048576"):
        records.prepare_records(str(data), 2, str(tmp_path / "p2"), str(model), max_seq_length=int("9" * 400))
    with pytest.raises(SourceError, match="give the mlx-lm model directory you will fine-tune"):
        records.prepare_records(str(data), 2, str(tmp_path / "p2"), str(data), max_seq_length=32)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(SourceError, match="exists and holds no manifest.json of prepared records, which an earlier"):
        records.prepare_records(str(data), 2, str(tmp_path / "mine"), str(model), max_seq_length=32)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    # a manifest.json of someone else's (it was enough to have the directory replaced whole), or a file of yours
    # beside a prepare's own: neither is deleted
    (tmp_path / "mine" / "manifest.json").write_text('{"name": "my project"}')
    with pytest.raises(SourceError, match="holds another manifest.json, which an earlier `data prepare` did not write"):
        records.prepare_records(str(data), 2, str(tmp_path / "mine"), str(model), max_seq_length=32)
    (tmp_path / "prep" / "notes.txt").write_text("keep")
    with pytest.raises(SourceError, match="holds 'notes.txt', which an earlier"):
        records.prepare_records(str(data), 2, str(tmp_path / "prep"), str(model), max_seq_length=32)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep" == (tmp_path / "prep" / "notes.txt").read_text()
    (tmp_path / "prep" / "notes.txt").unlink()
    again = records.prepare_records(str(data), 2, str(tmp_path / "prep"), str(model), max_seq_length=32)   # its own: replaced
    assert again["world_size"] == 2 and sorted(os.listdir(tmp_path / "prep")) == sorted(
        ["manifest.json", "val.bin", *(s["file"] for s in again["shards"])])
    from clusterctl.data.shards import read_manifest
    with pytest.raises(Exception, match="records prepared from jsonl for fine-tuning a model"):
        read_manifest(str(tmp_path / "prep"))


def test_rows_are_as_wide_as_packs_the_records_at_the_least_work():
    def positions(lengths, attention=0.0):
        w = records.row_width(lengths, attention)
        return w, len(records._first_fit(lengths, w, True)) * w

    # positions alone (attention 0): the fewest positions, rows rounded up to 8 tokens
    assert positions([59, 59, 58, 61]) == (120, 240)        # two a row, where mlx-lm computes 4 x 64
    assert positions([15] * 8) == (16, 128)                  # a row each of 16 (two a row of 32 is no fewer)
    assert positions([40, 40, 40]) == (40, 120)              # nothing to gain by packing
    assert positions([20, 100, 35, 60]) == (216, 216)
    # wider only while the rows' attention (rows x width^2) stays within 4x a row a record at the narrowest
    assert positions([10] * 64) == (40, 640)                 # 16 rows of 40, not one of 640: 640^2 > 4 x 64 x 16^2
    # a row's attention weighed (the work of a position grows with its row's width): narrower rows
    assert positions([59, 59, 58, 61], 1 / 192) == (64, 256)     # the benchmark model's weight: a row each
    assert positions([20, 100, 35, 60], 1 / 192) == (120, 240)   # 100 + 20 and 60 + 35, not all four in 216
    assert positions([10] * 64, 1 / 20) == (24, 768)             # attention-heavy: two a row, not four
