"""Where documents come from: the embedded stories, local .txt / .jsonl files or directories, or a
Hugging Face dataset already on this machine.

Every source numbers its documents k = 0, 1, 2, … in a fixed order (a directory's files sorted by path),
and `Source.documents(want)` skips the documents `want(k)` rejects without generating (embedded),
decoding (.txt) or parsing (.jsonl) them — this is how a rank reads only its own slice of a corpus.
Nothing holds the corpus in memory: every source is a generator over a stream.

Source strings:
    embedded                the default story corpus (stories.DEFAULT_STORIES stories, seed 0)
    embedded:COUNT[:SEED]   COUNT stories of another seed
    PATH.txt                documents separated by one or more blank lines
    PATH.jsonl              one JSON object per line; its "text" field is the document
    DIR                     every .txt and .jsonl file below DIR, sorted by path (hidden ones skipped)
    hf:NAME[:SPLIT]         a Hugging Face dataset from the local cache or a save_to_disk directory (the
                            optional `datasets` package; never downloads), column "text", split "train"
"""
from __future__ import annotations

import json
import os
from typing import Callable, Iterator

from ..errors import SourceError
from .stories import DEFAULT_STORIES, story

DOCUMENT_SUFFIXES = (".txt", ".jsonl")


def embedded_documents(seed: int = 0, count: int | None = None) -> Iterator[str]:
    """The embedded stories, in order; story k depends only on (seed, k)."""
    for k in range(DEFAULT_STORIES if count is None else count):
        yield story(seed, k)


def iter_documents(source: str) -> Iterator[str]:
    """Every document of `source` (see the module docstring for the forms it takes), streamed."""
    for _, text in open_source(source).documents():
        yield text


def is_val(k: int, fraction: float) -> bool:
    """Whether document k is held out for validation: the last document of every 1/fraction, evenly spread
    and the same for every source, world size and rank (0.01 -> documents 99, 199, 299, …)."""
    return fraction > 0 and int((k + 1) * fraction) > int(k * fraction)


class Source:
    """One corpus. `size` is its length in `unit`s (bytes or documents) when known; `done` is how far
    iteration has come in the same unit, for progress bars."""

    def __init__(self, spec: str):
        self.spec = spec
        self.done = 0
        self.size: int | None = None
        self.unit = "bytes"
        self._files: list[str] = []
        self._hf = None
        if spec == "embedded" or spec.startswith("embedded:"):
            self.kind, self.unit = "embedded", "documents"
            self.count, self.seed = _embedded_args(spec)
            self.size = self.count
        elif spec.startswith("hf:"):
            self.kind, self.unit = "hf", "documents"
            self._hf, self.column = _open_hf(spec)
            self.size = len(self._hf)
        elif os.path.isdir(spec):
            self.kind = "directory"
            self._files = _document_files(spec)
            self.size = sum(os.path.getsize(f) for f in self._files)
        elif os.path.isfile(spec):
            if not spec.endswith(DOCUMENT_SUFFIXES):
                raise SourceError(f"{spec}: unknown source kind: expected a .txt or .jsonl file, a directory of "
                                  f"them, 'embedded' or hf:NAME")
            self.kind = "file"
            self._files = [spec]
            self.size = os.path.getsize(spec)
        elif ":" in spec.split("/")[0] and not os.path.exists(spec):
            raise SourceError(f"{spec}: unknown source kind: expected 'embedded', a .txt or .jsonl file, a "
                              f"directory of them, or hf:NAME[:SPLIT]")
        else:
            raise SourceError(f"{spec}: no such file or directory")

    def documents(self, want: Callable[[int], bool] | None = None) -> Iterator[tuple[int, str]]:
        """(k, text) for every document k with want(k) (all when want is None), in order."""
        want = want or (lambda k: True)
        self.done = 0
        if self.kind == "embedded":
            for k in range(self.count):
                self.done = k + 1
                if want(k):
                    yield k, story(self.seed, k)
        elif self.kind == "hf":
            yield from self._hf_documents(want)
        else:
            k = 0
            for path in self._files:
                reader = _jsonl_documents if path.endswith(".jsonl") else _txt_documents
                for text in reader(path, k, want, self):
                    if text is not None:
                        yield k, text
                    k += 1

    def _hf_documents(self, want) -> Iterator[tuple[int, str]]:
        for k, row in enumerate(self._hf.select_columns([self.column])):
            self.done = k + 1
            if want(k):
                yield k, row[self.column]


def open_source(source: str) -> Source:
    return Source(os.fspath(source))


def _embedded_args(spec: str) -> tuple[int, int]:
    parts = spec.split(":")[1:]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(parts) > 2 or len(values) != len(parts) or any(v < 0 for v in values):
        raise SourceError(f"{spec}: expected embedded, embedded:COUNT or embedded:COUNT:SEED (whole numbers)")
    return (values[0] if values else DEFAULT_STORIES), (values[1] if len(values) > 1 else 0)


def _document_files(directory: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, f) for f in files if f.endswith(DOCUMENT_SUFFIXES) and not f.startswith(".")]
    if not found:
        raise SourceError(f"{directory}: no .txt or .jsonl files in this directory")
    return sorted(found)


def _txt_documents(path: str, k: int, want, source: Source) -> Iterator[str | None]:
    """Blank-line separated documents; yields None for a document `want` rejects (never decoded)."""
    base = source.done
    lines: list[bytes] = []
    with open(path, "rb") as f:
        for line in f:
            source.done += len(line)
            if line.strip():
                lines.append(line)
                continue
            if lines:
                yield _decode_document(path, lines) if want(k) else None
                k, lines = k + 1, []
        if lines:
            yield _decode_document(path, lines) if want(k) else None
    source.done = base + os.path.getsize(path)


def _decode_document(path: str, lines: list[bytes]) -> str:
    try:
        return b"".join(lines).decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: not UTF-8 text ({e.reason} at a document starting "
                          f"{lines[0][:40]!r})") from None


def _jsonl_documents(path: str, k: int, want, source: Source) -> Iterator[str | None]:
    """One document per non-blank line; a line `want` rejects is not parsed (yields None)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            source.done += len(line)
            if not line.strip():
                continue
            if not want(k):
                k += 1
                yield None
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise SourceError(f"{path}:{number}: not a JSON line: {e}") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise SourceError(f'{path}:{number}: expected an object with a string "text" field')
            k += 1
            yield row["text"]


def _open_hf(spec: str):
    name, _, split = spec[3:].partition(":")
    if not name:
        raise SourceError(f"{spec}: expected hf:NAME or hf:NAME:SPLIT")
    # Offline before the import: `datasets` reads these once, and clusterctl never downloads at run time
    # (docs/facts/data.md#no-network-at-run-time).
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise SourceError(f"{spec}: reading a Hugging Face dataset needs the `datasets` package: "
                          f"pip install datasets") from None
    # If `datasets` was imported before us the variables came too late; its config flags still count.
    for flag in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if hasattr(datasets, "config") and hasattr(datasets.config, flag):
            setattr(datasets.config, flag, True)
    try:
        if os.path.isdir(name):
            ds = datasets.load_from_disk(name)
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split or "train"]
        else:
            ds = datasets.load_dataset(name, split=split or "train")
    except Exception as e:  # noqa: BLE001 - datasets raises many types; the user needs its first line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SourceError(f"{spec}: cannot load from the local cache (clusterctl never downloads): {first}") from None
    columns = [c for c, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
    column = "text" if "text" in ds.features else (columns[0] if len(columns) == 1 else None)
    if column is None:
        raise SourceError(f"{spec}: no 'text' column (string columns: {', '.join(columns) or 'none'})")
    return ds, column
