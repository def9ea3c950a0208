"""Corpus sources: the embedded stories (deterministic, structured, learnable) and local files."""
import json
import os
import sys

import pytest

from clusterctl.data.corpus import embedded_documents, is_val, iter_documents, open_source
from clusterctl.data.stories import DEFAULT_STORIES, story
from clusterctl.errors import SourceError


def test_story_k_is_a_pure_function_of_seed_and_k():
    docs = list(embedded_documents(seed=3, count=20))
    assert docs == [story(3, k) for k in range(20)]
    assert list(embedded_documents(seed=3, count=20)) == docs
    assert docs[7] == story(3, 7) and docs[7] != docs[8]
    assert docs != list(embedded_documents(seed=4, count=20))
    assert len(set(docs)) == 20


def test_default_corpus_is_a_few_megabytes_of_structured_stories():
    first = list(embedded_documents(count=200))
    size = sum(len(d.encode()) for d in first) / 200 * DEFAULT_STORIES
    assert 2e6 < size < 8e6
    text = "\n".join(first)
    for marker in ('"', " said", "First, they went to", "The end.", "Once upon a time"):
        assert marker in text
    # every story follows the same arc, so the model sees the structure repeat
    assert all(d.endswith("The end.") and "At last, they went to" in d for d in first)
    # pronouns agree with the character: no story about Tom says "She lived"
    tom = [d for d in first if d.split(" named ")[-1].startswith("Tom.")]
    assert tom and all("She lived" not in d.split(" named ")[1][:20] for d in tom)


def test_embedded_source_forms():
    assert open_source("embedded").size == DEFAULT_STORIES
    assert list(iter_documents("embedded:3:7")) == [story(7, k) for k in range(3)]
    for bad in ("embedded:x", "embedded:-1", "embedded:1:2:3"):
        with pytest.raises(SourceError, match="expected embedded"):
            open_source(bad)


def test_only_wanted_stories_are_generated(monkeypatch):
    import clusterctl.data.corpus as corpus
    made = []
    monkeypatch.setattr(corpus, "story", lambda seed, k: made.append(k) or f"story {k}")
    got = list(open_source("embedded:100").documents(lambda k: k % 4 == 1))
    assert [k for k, _ in got] == list(range(1, 100, 4)) == made


def test_txt_documents_are_separated_by_blank_lines(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("first line\nsecond line\n\n\n  \nsecond doc\r\n\nthird\n")
    assert list(iter_documents(str(path))) == ["first line\nsecond line", "second doc", "third"]
    src = open_source(str(path))
    assert [k for k, _ in src.documents(lambda k: k != 1)] == [0, 2]
    assert src.done == src.size == os.path.getsize(path)


def test_jsonl_uses_the_text_field_and_reports_bad_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"text": "one", "id": 1}) + "\n\n" + json.dumps({"text": "two\nlines"}) + "\n")
    assert list(iter_documents(str(path))) == ["one", "two\nlines"]
    path.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(SourceError, match=r"a.jsonl:2: expected an object with a string \"text\" field"):
        list(iter_documents(str(path)))
    path.write_text("{oops\n")
    with pytest.raises(SourceError, match=r"a.jsonl:1: not a JSON line"):
        list(iter_documents(str(path)))


def test_a_directory_reads_its_txt_and_jsonl_files_in_path_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("from z\n")
    (tmp_path / "a.jsonl").write_text('{"text": "from a"}\n')
    (tmp_path / "notes.md").write_text("ignored\n")
    (tmp_path / ".hidden.txt").write_text("ignored\n")
    assert list(iter_documents(str(tmp_path))) == ["from a", "from z"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no .txt or .jsonl files"):
        open_source(str(tmp_path / "empty"))


def test_bad_sources_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(SourceError, match="no such file or directory"):
        open_source(str(tmp_path / "missing.txt"))
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(SourceError, match="unknown source kind"):
        open_source(str(tmp_path / "data.csv"))
    with pytest.raises(SourceError, match="unknown source kind"):
        open_source("s3://bucket/corpus")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(SourceError, match="not UTF-8"):
        list(iter_documents(str(tmp_path / "latin1.txt")))
    monkeypatch.setitem(sys.modules, "datasets", None)       # `import datasets` raises ImportError
    with pytest.raises(SourceError, match=r"needs the `datasets` package: pip install datasets$"):
        open_source("hf:roneneldan/TinyStories:validation")


def test_val_documents_are_evenly_spread():
    val = [k for k in range(1000) if is_val(k, 0.01)]
    assert val == list(range(99, 1000, 100))
    assert not any(is_val(k, 0) for k in range(1000))
    assert sum(is_val(k, 0.25) for k in range(1000)) == 250


def test_a_tiny_model_learns_the_embedded_stories():
    """The trainer issue needs loss to fall visibly within a few hundred steps: a byte bigram model
    (one 257 x 257 table) trained for 150 steps on the stories must lose >= 30% of its initial loss."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from clusterctl.data.loader import BatchLoader, rank_tokens

    mx.random.seed(0)
    train, val = rank_tokens(0, 4)
    loader = BatchLoader(train, 8, 64, seed=0, rank=0)
    model = nn.Embedding(257, 257)
    optimizer = optim.Adam(learning_rate=0.1)

    def loss_fn(m, x, y):
        return nn.losses.cross_entropy(m(x), y).mean()
    step = nn.value_and_grad(model, loss_fn)
    held_out = BatchLoader(val, 32, 64, seed=1, rank=0).batch(0)
    before = loss_fn(model, *held_out).item()
    for s in range(150):
        loss, grads = step(model, *loader.batch(s))
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state)
    after = loss_fn(model, *held_out).item()
    assert after <= 0.7 * before, (before, after)
