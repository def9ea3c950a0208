"""Tokenizers: a byte-level one that needs nothing, and a local Hugging Face tokenizer.json.

Both have the same small interface (`name`, `vocab_size`, `eos_id`, `encode`, `encode_batch`, `decode`,
`spec`). `spec()` is what manifest.json records, and `load_tokenizer(spec)` turns it back into a tokenizer,
so the trainer decodes with exactly the tokenizer the shards were made with. Neither ever downloads
anything (docs/facts/data.md#no-network-at-run-time).
"""
from __future__ import annotations

import os

from ..digest import file_sha256
from ..errors import TokenizerError

# Tried in this order when a tokenizer.json names its end-of-document token; GPT-2 / Llama / others.
EOS_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; 256 is EOS, the separator prepare writes after every document."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(i for i in _ints(ids) if 0 <= i < 256).decode("utf-8", errors="replace")

    def spec(self) -> dict:
        return {"type": "byte"}


class HFTokenizer:
    """A local tokenizer.json through the optional `tokenizers` package (never downloads anything).

    EOS is the file's own end-of-text token when it has one (EOS_TOKENS); otherwise one id past the
    vocabulary is reserved for it, and vocab_size counts it.
    """

    name = "hf"

    def __init__(self, path: str):
        if not os.path.isfile(path):    # the first thing to fix, whether or not `tokenizers` is installed
            raise TokenizerError(f"{path}: no such tokenizer file")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError(f"{path}: reading a tokenizer.json needs the `tokenizers` package: "
                                 f"pip install tokenizers") from None
        self.path = os.path.abspath(path)
        self.sha256 = file_sha256(path)
        try:
            self._tok = Tokenizer.from_file(self.path)
        except Exception as e:  # noqa: BLE001 - the Rust library raises a bare Exception for any bad file
            raise TokenizerError(f"{path}: not a tokenizer.json `tokenizers` can read: {e}") from None
        base = self._tok.get_vocab_size(with_added_tokens=True)
        found = [self._tok.token_to_id(t) for t in EOS_TOKENS]
        found = [i for i in found if i is not None]
        self.eos_id = found[0] if found else base
        self.vocab_size = base if found else base + 1

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # The Rust library encodes a batch on all cores; prepare feeds it documents in batches.
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode([i for i in _ints(ids) if i != self.eos_id and i < self.vocab_size])

    def spec(self) -> dict:
        return {"type": "hf", "path": self.path, "sha256": self.sha256}


def load_tokenizer(spec: str | dict | None, base_dir: str | None = None) -> ByteTokenizer | HFTokenizer:
    """None / "byte" / {"type": "byte"} -> ByteTokenizer; a path or {"type": "hf", "path", "sha256"} -> HF.

    A relative hf path is looked up in `base_dir` first (a shard directory keeps its own copy of the
    tokenizer.json); a recorded sha256 must match the file found.
    """
    if spec is None or spec == "byte":
        return ByteTokenizer()
    if isinstance(spec, (ByteTokenizer, HFTokenizer)):
        return spec
    if isinstance(spec, str):
        return HFTokenizer(spec)
    if not isinstance(spec, dict) or spec.get("type") not in ("byte", "hf"):
        raise TokenizerError(f"unknown tokenizer {spec!r}: expected 'byte' or a tokenizer.json path")
    if spec["type"] == "byte":
        return ByteTokenizer()
    path = spec.get("path")
    if not isinstance(path, str) or not path:
        raise TokenizerError(f"tokenizer spec {spec!r} has no path")
    if base_dir is not None and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    tok = HFTokenizer(path)
    if spec.get("sha256") and spec["sha256"] != tok.sha256:
        raise TokenizerError(f"{path}: tokenizer file changed since the shards were made (sha256 differs)")
    return tok




def _ints(ids):
    """Accept a list, an mx.array or any iterable of ints."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return [int(i) for i in ids]
