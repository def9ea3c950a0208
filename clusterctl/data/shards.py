"""`clusterctl data prepare`: tokenize a corpus once into one equal shard per rank, plus manifest.json.

Streaming: documents are tokenized in small batches and appended to one temporary token file (and the
held-out ones to a temporary val file) in a staging directory inside DIR; only then is the total known,
so the train stream is cut into `world` shards of exactly T = total // world tokens each (the remainder
at the end is dropped, so every rank has the same data budget). sha256 is computed while the bytes are
written. Disk needs about twice the shard size while preparing; memory needs one batch of documents.

Publishing into DIR (a reader never sees a half-written file under its final name): the old
manifest.json goes first (readers then see "not prepared", never old metadata over new shards), the
finished files are renamed into place, the new manifest.json is written last (temp + rename), and
shards of another world size are removed.

Validation split: document k is held out when `is_val(k, val_fraction)` (the last document of every
1/val_fraction; see corpus.py). When that selects no document at all (a corpus of fewer than
1/val_fraction documents), the last val_fraction of the token stream is held out instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ..atomic import fsync_tree, write_text
from ..digest import file_sha256
from ..errors import ShardError, SourceError
from .corpus import is_val, open_source
from .tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

FORMAT = 1
MANIFEST = "manifest.json"
VAL_FILE = "val.bin"
TOKENIZER_FILE = "tokenizer.json"
ITEMSIZE = {"uint16": 2, "uint32": 4}
SHARD_NAME = re.compile(r"^shard-(\d{5})-of-(\d{5})\.bin$")
BATCH_CHARS = 1 << 20          # text per encode_batch call: enough for the HF tokenizer's threads
COPY_BLOCK = 4 << 20

Progress = Callable[[str, int, "int | None"], None]


@dataclass(frozen=True)
class TokenFileInfo:
    file: str
    tokens: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    format: int
    tokenizer: dict
    vocab_size: int
    dtype: str
    world_size: int
    tokens_per_shard: int
    dropped_tokens: int
    source: str
    shards: tuple[TokenFileInfo, ...]
    val: TokenFileInfo

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def to_json(self) -> str:
        d = asdict(self)
        d["shards"] = list(d["shards"])
        return json.dumps(d, indent=2) + "\n"

    @classmethod
    def from_dict(cls, d, where: str) -> "Manifest":
        def bad(what: str):
            return ShardError(f"{where}: {what} (re-run clusterctl data prepare)")
        if not isinstance(d, dict) or "format" not in d:
            raise bad("not a clusterctl manifest (no format field)")
        if d.get("kind") == "records":
            raise ShardError(f"{where}: records prepared from jsonl for fine-tuning a model: the trainer reads "
                             "them with --model (they travel with the project; data push and run --data send shards "
                             "for the bundled model)")
        if d.get("format") != FORMAT:
            raise bad(f"format {d.get('format')!r}, this clusterctl reads format {FORMAT}")
        ints = ("vocab_size", "world_size", "tokens_per_shard", "dropped_tokens")
        for key in ints:
            if not isinstance(d.get(key), int) or isinstance(d.get(key), bool) or d[key] < 0:
                raise bad(f"{key} must be a whole number")
        if d.get("dtype") not in ITEMSIZE or not isinstance(d.get("tokenizer"), dict) or \
                not isinstance(d.get("source"), str):
            raise bad("dtype, tokenizer or source is missing or malformed")
        if d["world_size"] < 1:
            raise bad("world_size must be at least 1")
        tokenizer_path = d["tokenizer"].get("path")
        if tokenizer_path is not None and not plain_name(tokenizer_path):   # read, sent and verified by this name
            raise bad(f"tokenizer.path {tokenizer_path!r} must be a plain file name in the data directory")

        def info(entry) -> TokenFileInfo:
            if not isinstance(entry, dict) or not plain_name(entry.get("file")) or \
                    not isinstance(entry.get("tokens"), int) or not isinstance(entry.get("sha256"), str):
                raise bad(f"malformed file entry {entry!r}: each needs file, tokens and sha256, and the file "
                          "must be a plain name in the data directory")
            return TokenFileInfo(entry["file"], entry["tokens"], entry["sha256"])

        shards = tuple(info(e) for e in d.get("shards") or [])
        expected = [shard_name(r, d["world_size"]) for r in range(d["world_size"])]
        if [s.file for s in shards] != expected:
            raise bad(f"expected shards {expected[0]} … {expected[-1]} for world size {d['world_size']}")
        if any(s.tokens != d["tokens_per_shard"] for s in shards):
            raise bad("shards of unequal token counts")
        return cls(FORMAT, d["tokenizer"], d["vocab_size"], d["dtype"], d["world_size"], d["tokens_per_shard"],
                   d["dropped_tokens"], d["source"], shards, info(d.get("val")))


def plain_name(name) -> bool:
    """A file name inside the data directory itself: not '', '.', '..', nothing with a slash or backslash."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\x00")


def shard_name(rank: int, world: int) -> str:
    return f"shard-{rank:05d}-of-{world:05d}.bin"


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 65535 else "uint32"


def read_manifest(data_dir: str) -> Manifest:
    """manifest.json of a prepared data directory, validated: the one reader for the trainer, the loader,
    `data push` and `run --data`."""
    path = os.path.join(data_dir, MANIFEST)
    if not os.path.isdir(data_dir):
        raise ShardError(f"{data_dir}: no such directory")
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except FileNotFoundError:
        raise ShardError(f"{data_dir}: no {MANIFEST} (make one with: clusterctl data prepare SOURCE --world N "
                         f"--out {data_dir})") from None
    except ValueError as e:
        raise ShardError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise ShardError(f"{path}: unreadable: {e}") from None
    return Manifest.from_dict(d, path)


def shard_file(data_dir: str, rank: int) -> Path:
    manifest = read_manifest(data_dir)
    if not 0 <= rank < manifest.world_size:
        raise ShardError(f"{data_dir}: rank {rank} is outside world size {manifest.world_size}")
    return Path(data_dir) / manifest.shards[rank].file


def verify_file(data_dir: str, info: TokenFileInfo, dtype: str, checksum: bool = True) -> None:
    """Raise ShardError unless the file has the manifest's length (and sha256, when `checksum`)."""
    path = os.path.join(data_dir, info.file)
    try:
        size = os.path.getsize(path)
    except OSError:
        raise ShardError(f"{path}: missing (the manifest lists it)") from None
    if size != info.tokens * ITEMSIZE[dtype]:
        raise ShardError(f"{path}: {size} bytes, the manifest says {info.tokens} {dtype} tokens "
                         f"({info.tokens * ITEMSIZE[dtype]} bytes): truncated or corrupted")
    if checksum and file_sha256(path) != info.sha256:
        raise ShardError(f"{path}: sha256 differs from the manifest: corrupted")


def prepare(source: str, world: int, out_dir: str, tokenizer=None, val_fraction: float = 0.01,
            progress: Progress | None = None) -> Manifest:
    """Tokenize `source` into `world` equal shards + val.bin + manifest.json in `out_dir`.

    progress(phase, done, total) is called now and then: phase "tokenize" counts the source's bytes (or
    documents, for embedded and hf: sources) with total None when unknown; phase "write" counts tokens.
    """
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ShardError(f"world size must be a whole number >= 1, not {world!r}")
    if not 0 <= val_fraction < 1:
        raise ShardError(f"val_fraction must be in [0, 1), not {val_fraction!r}")
    tok = load_tokenizer(tokenizer)
    src = open_source(source)
    dtype = dtype_for(tok.vocab_size)
    size = ITEMSIZE[dtype]
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ShardError(f"{out_dir}: exists and is not a directory")
    os.makedirs(out_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".prepare-", dir=out_dir)
    report = progress or (lambda phase, done, total: None)
    try:
        train_path, val_path = os.path.join(staging, "train.tmp"), os.path.join(staging, VAL_FILE)
        train, val = _tokenize(src, tok, dtype, train_path, val_path, val_fraction, report)
        if train + val == 0:
            raise SourceError(f"{source}: empty corpus (no documents with text)")
        if val == 0 and val_fraction > 0:
            val = max(1, int(train * val_fraction))
            train -= val
            _copy_range(train_path, train * size, val * size, val_path)
            os.truncate(train_path, train * size)
        per_shard = train // world
        if per_shard == 0:
            raise ShardError(f"{source}: {train} training tokens cannot fill {world} shards")
        report("write", 0, per_shard * world)
        shards = []
        for rank in range(world - 1, 0, -1):   # shard 0 is the head of train.tmp: truncated, not copied
            name = shard_name(rank, world)
            digest = _copy_range(train_path, rank * per_shard * size, per_shard * size, os.path.join(staging, name))
            shards.append(TokenFileInfo(name, per_shard, digest))
            report("write", (world - rank) * per_shard, per_shard * world)
        os.truncate(train_path, per_shard * size)
        os.replace(train_path, os.path.join(staging, shard_name(0, world)))
        shards.append(TokenFileInfo(shard_name(0, world), per_shard,
                                    file_sha256(os.path.join(staging, shard_name(0, world)))))
        report("write", per_shard * world, per_shard * world)
        spec = tok.spec()
        if isinstance(tok, HFTokenizer):
            # The shard directory carries its tokenizer, so the hosts (and `generate`) decode with it.
            shutil.copyfile(tok.path, os.path.join(staging, TOKENIZER_FILE))
            spec = {**spec, "path": TOKENIZER_FILE}
        manifest = Manifest(FORMAT, spec, tok.vocab_size, dtype, world, per_shard, train - per_shard * world,
                            _describe(source, src.kind), tuple(reversed(shards)),
                            TokenFileInfo(VAL_FILE, val, file_sha256(val_path)))
        _publish(staging, out_dir, manifest)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _tokenize(src, tok, dtype: str, train_path: str, val_path: str, val_fraction: float, report) -> tuple[int, int]:
    """Stream every document through the tokenizer; returns (train tokens, val tokens) written."""
    counts = [0, 0]
    with open(train_path, "wb") as train_f, open(val_path, "wb") as val_f:
        outs = (train_f, val_f)
        batch: list[tuple[int, str]] = []
        chars = 0

        def flush():
            for held_out, data in _encode(tok, dtype, batch, val_fraction):
                outs[held_out].write(data)
                counts[held_out] += len(data) // ITEMSIZE[dtype]
            batch.clear()
            report("tokenize", src.done, src.size)

        for k, text in src.documents():
            if not text:
                continue
            batch.append((k, text))
            chars += len(text)
            if chars >= BATCH_CHARS:
                flush()
                chars = 0
        flush()
    return counts[0], counts[1]


def _encode(tok, dtype: str, batch: list[tuple[int, str]], val_fraction: float):
    """Yield (is_val, little-endian token bytes with EOS after every document) for the batch."""
    if isinstance(tok, ByteTokenizer) and dtype == "uint16":
        # Fast path: a byte b is the uint16 (b, 0) in little-endian; one C-level strided copy per document.
        for k, text in batch:
            raw = text.encode("utf-8")
            out = bytearray(2 * len(raw) + 2)
            out[0:2 * len(raw):2] = raw
            out[-2:] = tok.eos_id.to_bytes(2, "little")
            yield int(is_val(k, val_fraction)), bytes(out)
        return
    code = "H" if dtype == "uint16" else ("I" if array("I").itemsize == 4 else "L")
    for (k, _), ids in zip(batch, tok.encode_batch([text for _, text in batch])):
        out = array(code, ids)
        out.append(tok.eos_id)
        if sys.byteorder == "big":
            out.byteswap()
        yield int(is_val(k, val_fraction)), out.tobytes()


def _copy_range(src: str, start: int, length: int, dst: str) -> str:
    """Copy `length` bytes of `src` from `start` into a new file `dst`; return their sha256."""
    return _copy_span([src], start, length, dst)


def _copy_span(srcs: list[str], start: int, length: int, dst: str) -> str:
    """Copy `length` bytes of the files `srcs` read one after another as one stream, from `start`, into a
    new file `dst`; return their sha256."""
    h = hashlib.sha256()
    left = length
    with open(dst, "wb") as fout:
        for src in srcs:
            size = os.path.getsize(src)
            if start >= size:
                start -= size
                continue
            with open(src, "rb") as fin:
                fin.seek(start)
                start = 0
                while left:
                    block = fin.read(min(COPY_BLOCK, left))
                    if not block:
                        break
                    h.update(block)
                    fout.write(block)
                    left -= len(block)
            if not left:
                break
    if left:
        raise ShardError(f"{srcs[-1]}: ended early while splitting")
    return h.hexdigest()


def reshard(data_dir: str, world: int, out_dir: str) -> Manifest:
    """The prepared training tokens of `data_dir` cut again into `world` equal shards in `out_dir`, for a
    world that changed after `prepare` (an elastic restart, docs/run.md#restarts-and-elastic-runs). Nothing is
    tokenized again: the shards, read in rank order, are the stream prepare cut, and it is cut again the
    same way (what does not fill `world` equal shards is dropped); val.bin and the tokenizer file are
    copied. Returns the new manifest."""
    manifest = read_manifest(data_dir)
    if world < 1:
        raise ShardError(f"world size must be a whole number >= 1, not {world!r}")
    size = manifest.itemsize
    total = manifest.tokens_per_shard * manifest.world_size
    per_shard = total // world
    if per_shard == 0:
        raise ShardError(f"{data_dir}: {total} training tokens cannot fill {world} shards")
    os.makedirs(out_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".reshard-", dir=out_dir)
    try:
        srcs = [os.path.join(data_dir, s.file) for s in manifest.shards]
        shards = []
        for rank in range(world):
            name = shard_name(rank, world)
            digest = _copy_span(srcs, rank * per_shard * size, per_shard * size, os.path.join(staging, name))
            shards.append(TokenFileInfo(name, per_shard, digest))
        for name in {VAL_FILE, manifest.tokenizer.get("path")} - {None}:
            shutil.copyfile(os.path.join(data_dir, name), os.path.join(staging, name))
        new = Manifest(FORMAT, manifest.tokenizer, manifest.vocab_size, manifest.dtype, world, per_shard,
                       manifest.dropped_tokens + total - per_shard * world, manifest.source, tuple(shards),
                       manifest.val)
        _publish(staging, out_dir, new)
        return new
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _describe(source: str, kind: str) -> str:
    return os.path.abspath(source) if kind in ("file", "directory") else source


def _publish(staging: str, out_dir: str, manifest: Manifest) -> None:
    old_manifest = os.path.join(out_dir, MANIFEST)
    if os.path.exists(old_manifest):
        os.unlink(old_manifest)
    keep = {s.file for s in manifest.shards}
    fsync_tree(staging)             # the shards are on disk before the manifest that vouches for them
    for name in sorted(os.listdir(staging)):
        os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    write_text(old_manifest, manifest.to_json(), durable=True)
    for name in os.listdir(out_dir):
        if SHARD_NAME.match(name) and name not in keep:
            os.unlink(os.path.join(out_dir, name))
