"""Tokenizers: the byte-level one, a real local tokenizer.json through `tokenizers`, and load_tokenizer."""
import json
import sys

import pytest

from clusterctl.data.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from clusterctl.errors import TokenizerError


def test_byte_tokenizer_round_trips_utf8_and_skips_eos():
    tok = ByteTokenizer()
    text = "Lily said, \"héllo ✓\"\nThe end."
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256 and tok.eos_id not in ids
    assert tok.decode(ids + [tok.eos_id] + ids) == text + text
    assert tok.decode([0xE2, 0x9C]) == "\ufffd"          # a cut multi-byte character is replaced, not raised
    assert (tok.vocab_size, tok.eos_id, tok.spec()) == (257, 256, {"type": "byte"})


def test_load_tokenizer_defaults_to_bytes_and_rejects_unknown_specs():
    assert isinstance(load_tokenizer(None), ByteTokenizer)
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    assert isinstance(load_tokenizer({"type": "byte"}), ByteTokenizer)
    with pytest.raises(TokenizerError, match="unknown tokenizer"):
        load_tokenizer({"type": "sentencepiece"})
    with pytest.raises(TokenizerError, match="no such tokenizer file"):
        load_tokenizer("/nonexistent/tokenizer.json")


def make_tokenizer_json(path, eos=True):
    """A small real BPE tokenizer trained with the `tokenizers` library itself."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    special = ["<unk>", "<|endoftext|>"] if eos else ["<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    from clusterctl.data.corpus import embedded_documents
    tok.train_from_iterator(embedded_documents(count=50), trainer)
    tok.save(str(path))
    return str(path)


def test_hf_tokenizer_encodes_decodes_and_finds_its_eos(tmp_path):
    path = make_tokenizer_json(tmp_path / "tokenizer.json")
    tok = load_tokenizer(path)
    assert isinstance(tok, HFTokenizer)
    text = "Once upon a time, there was a brave fox named Leo."
    ids = tok.encode(text)
    assert len(ids) < len(text.encode()) / 2            # real BPE merges, not bytes
    assert tok.eos_id == tok._tok.token_to_id("<|endoftext|>") and tok.vocab_size == tok._tok.get_vocab_size()
    assert tok.decode(ids + [tok.eos_id]) == text
    assert tok.encode_batch([text, "The end."]) == [ids, tok.encode("The end.")]
    spec = tok.spec()
    assert spec["type"] == "hf" and spec["path"] == path and len(spec["sha256"]) == 64
    assert load_tokenizer(spec).sha256 == spec["sha256"]


def test_hf_tokenizer_without_an_eos_token_reserves_one_past_the_vocabulary(tmp_path):
    tok = HFTokenizer(make_tokenizer_json(tmp_path / "tokenizer.json", eos=False))
    assert tok.eos_id == tok._tok.get_vocab_size() and tok.vocab_size == tok.eos_id + 1
    assert tok.decode(tok.encode("The end.") + [tok.eos_id]) == "The end."


def test_hf_spec_refuses_a_changed_file_and_resolves_relative_paths(tmp_path):
    path = make_tokenizer_json(tmp_path / "tokenizer.json")
    spec = {"type": "hf", "path": "tokenizer.json", "sha256": load_tokenizer(path).sha256}
    assert load_tokenizer(spec, base_dir=str(tmp_path)).path == path
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["model"]["vocab"]["zzzz"] = 599
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(TokenizerError, match="changed since the shards were made"):
        load_tokenizer(spec, base_dir=str(tmp_path))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a tokenizer.json"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_missing_tokenizers_package_names_the_pip_command(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)     # makes `import tokenizers` raise ImportError
    with pytest.raises(TokenizerError, match=r"pip install tokenizers$"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))
