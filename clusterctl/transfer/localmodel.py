"""A model directory on this machine as the model store sees it (transfer/models.py): its files, their sizes and
sha256, and the digest that names its content.

    model = describe("~/models/Qwen3-8B-4bit")      # LocalModel: name, digest, files
    model.key                                        # "Qwen3-8B-4bit-1f2e3d4c5b6a": the entry's name on a host

The digest is the sha256 of a canonical manifest (every file's path, size and sha256, sorted by path), so two
directories with the same files have one digest, and any change of any byte, name or file gives another.
Hashing 40 GB takes minutes, so sha256s are cached in ~/.cache/clusterctl/model-hashes.json (XDG_CACHE_HOME
honoured), keyed by the file's real path, size and mtime_ns: describing an unchanged model again reads no file.

A link in the model is followed when it stays inside the model directory or, for a Hugging Face snapshot
(`…/hub/models--ORG--NAME/snapshots/REV`, links into `…/blobs`), inside its hub cache entry; any other link is
refused here, before anything is hashed or sent (model_paths). A snapshot is called ORG/NAME (model_name).

The pure pieces (name sanitising, the manifest, matching a NAME or a digest prefix to entries) are here too,
tested on canned values in tests/unit/test_model_store.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..atomic import write_text
from ..digest import file_sha256
from ..errors import ModelError

WEIGHTS = ".safetensors"
DIGEST_SHOWN = 12                 # hex digits of the digest in an entry's name and in tables
CACHE_NAME = "model-hashes.json"
HUB_PREFIX = "models--"        # a Hugging Face hub cache entry: models--ORG--NAME/{refs,snapshots,blobs}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class ModelFile:
    path: str          # relative to the model directory, "/"-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class LocalModel:
    root: str                      # the model directory, absolute
    name: str                      # its base name, sanitised
    files: tuple[ModelFile, ...]   # sorted by path
    digest: str                    # sha256 of manifest_text(files)

    @property
    def key(self) -> str:
        """The entry's directory name in a host's store: NAME-DIGEST12."""
        return entry_key(self.name, self.digest)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, path: str) -> ModelFile:
        for f in self.files:
            if f.path == path:
                return f
        raise ModelError(f"{path}: not a file of the model in {self.root}")


# ---- pure -----------------------------------------------------------------------------------------------

def sanitise(name: str) -> str:
    """A directory's base name as an entry name: letters, digits, `.`, `_` and `-` (runs of anything else become
    one `-`), not starting with `.` or `-`, at most 64 characters; "model" when nothing is left."""
    clean = _UNSAFE.sub("-", name).lstrip(".-")[:64].rstrip(".-")
    return clean or "model"


def entry_key(name: str, digest: str) -> str:
    return f"{name}-{digest[:DIGEST_SHOWN]}"


def manifest_text(files: Iterable[ModelFile]) -> str:
    """The canonical manifest the digest is the sha256 of: one JSON line, files sorted by path."""
    rows = [[f.path, f.size, f.sha256] for f in sorted(files, key=lambda f: f.path)]
    return json.dumps({"format": 1, "files": rows}, separators=(",", ":"), ensure_ascii=True)


def model_digest(files: Iterable[ModelFile]) -> str:
    return hashlib.sha256(manifest_text(files).encode("ascii")).hexdigest()


def host_files(model: LocalModel, chosen: Sequence[str] | None) -> list[str]:
    """What one host gets: every file, or with `chosen` (weight files, for a host that reads only some) those
    plus every file that is not a weight file (config, tokenizer, index: a host needs them all)."""
    if chosen is None:
        return [f.path for f in model.files]
    for path in chosen:
        model.file(path)
    wanted = set(chosen)
    return [f.path for f in model.files if f.path in wanted or not f.path.endswith(WEIGHTS)]


def match(entries: Sequence[dict], which: str) -> list[dict]:
    """The entries (dicts with key, name, digest) that `which` names: an entry name (NAME-DIGEST12), a model
    name (as typed, or as the store writes it: `org/name` is `org-name`), or a digest prefix of 4+ hex digits.
    Raises ModelError, in one line, when none does or when the matches are more than one model (a name two
    different models carry, a prefix too short)."""
    w = which.strip()
    hexy = re.fullmatch(r"[0-9a-fA-F]{4,64}", w) is not None
    found = [e for e in entries if w in (e.get("key"), e.get("name")) or sanitise(w) == e.get("name")
             or (hexy and (e.get("digest") or "").startswith(w.lower()))]
    if not found:
        raise ModelError(f"no model in the store is named {which!r} or has a digest starting with it "
                         "(`clusterctl models --hosts INVENTORY` lists them)")
    models = sorted({e.get("digest") or e["key"] for e in found})
    if len(models) > 1:
        keys = sorted({e["key"] for e in found})
        raise ModelError(f"{which!r} matches {len(models)} models ({', '.join(keys)}): give a longer digest prefix "
                         "or the entry name")
    return found


# ---- this machine -------------------------------------------------------------------------------------

def check_model_dir(path: str) -> str:
    """The absolute path of an mlx-lm model directory, or one line saying why it is not one."""
    root = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(root):
        raise ModelError(f"{path}: not a directory (give an mlx-lm model directory: config.json and *.safetensors)")
    if not os.path.isfile(os.path.join(root, "config.json")):
        raise ModelError(f"{path} is not an mlx-lm model directory: it has no config.json (give the directory that "
                         "holds config.json and the *.safetensors weights)")
    if not any(n.endswith(WEIGHTS) and os.path.isfile(os.path.join(root, n)) for n in os.listdir(root)):
        raise ModelError(f"{path} is not an mlx-lm model directory: it has no *.safetensors weights (convert or "
                         "download the model with mlx-lm first)")
    return root


def hub_entry(root: str) -> str | None:
    """The Hugging Face hub cache entry (`…/models--ORG--NAME`) that `root`, a real path, is a snapshot of
    (`…/models--ORG--NAME/snapshots/REV`), or None."""
    snapshots = os.path.dirname(root)
    entry = os.path.dirname(snapshots)
    if os.path.basename(snapshots) == "snapshots" and os.path.basename(entry).startswith(HUB_PREFIX):
        return entry
    return None


def model_name(root: str) -> str:
    """What a model directory is called: ORG/NAME for a Hugging Face snapshot (its directory's own name is a
    revision), else the directory's base name."""
    entry = hub_entry(os.path.realpath(root))
    if entry is None:
        return os.path.basename(os.path.normpath(root))
    return "/".join(os.path.basename(entry)[len(HUB_PREFIX):].split("--", 1))


def model_paths(root: str) -> list[str]:
    """Every file of the model below root, "/"-separated: regular files, and links that stay inside the model
    directory or, for a Hugging Face snapshot, inside its hub cache entry (a snapshot is links into the entry's
    blobs/): what is pushed is their content. Any other link, or a link to nothing, is refused in one line naming
    it, as is a name the hosts cannot store (a backslash, not UTF-8). Hidden names (.git, .DS_Store, .cache) are
    left out. Decided here, before anything is hashed or sent."""
    real = os.path.realpath(root)
    hub = hub_entry(real)
    inside = [real] + ([hub] if hub else [])
    where = "the model directory" + (" and its Hugging Face cache entry" if hub else "")

    def followed(path: str) -> str:
        rel = shown(os.path.relpath(path, root))
        target = os.path.realpath(path)
        if not os.path.exists(path):
            raise ModelError(f"{root}: {rel} is a link to nothing ({os.readlink(path)}): finish the download, or "
                             "remove the link")
        if not any(target == r or target.startswith(r + os.sep) for r in inside):
            raise ModelError(f"{root}: {rel} is a link to {target}, outside {where}: copy the file into the model "
                             "directory, or remove the link")
        return target

    out = []
    for directory, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for d in dirs:
            full = os.path.join(directory, d)
            if os.path.islink(full):
                target = followed(full)
                if (os.path.realpath(directory) + os.sep).startswith(target + os.sep):
                    raise ModelError(f"{root}: {shown(os.path.relpath(full, root))} is a link to {target}, a directory "
                                     "that holds it (a loop): remove the link")
        for n in sorted(names):
            full = os.path.join(directory, n)
            if n.startswith(".") or not (os.path.islink(full) or os.path.isfile(full)):
                continue
            if os.path.islink(full) and not os.path.isfile(followed(full)):
                continue               # a link to a FIFO or a device: no more part of the model than one itself
            out.append(storable(os.path.relpath(full, root).replace(os.sep, "/"), root))
    return sorted(out)


def storable(rel: str, root: str) -> str:
    """`rel` when a host's store can hold a file of that name; else one line naming it."""
    if "\\" in rel:
        raise ModelError(f"{root}: the file {shown(rel)} has a backslash in its name, which the hosts' store refuses: "
                         "rename it")
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise ModelError(f"{root}: the file {shown(rel)} has a name that is not UTF-8, which the hosts' store refuses: "
                         "rename it") from None
    return rel


def shown(name: str) -> str:
    """A file name for a one-line message: as it is, or quoted with escapes when it holds a newline or the like."""
    return name if name.isprintable() else repr(name)


def cache_path() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "clusterctl", CACHE_NAME)


class HashCache:
    """sha256 by (real path, size, mtime_ns), kept in one JSON file written atomically."""

    def __init__(self, path: str | None = None):
        self.path = path or cache_path()
        try:
            with open(self.path, encoding="utf-8") as f:
                self.known = dict(json.load(f).get("files", {}))
        except (OSError, ValueError, AttributeError):
            self.known = {}
        self.changed = False
        self.hashed = 0            # files read this time (none for an unchanged model)

    def sha256(self, path: str) -> tuple[int, str]:
        real = os.path.realpath(path)
        st = os.stat(real)
        seen = self.known.get(real)
        if seen and seen[0] == st.st_size and seen[1] == st.st_mtime_ns:
            return st.st_size, seen[2]
        digest = file_sha256(real)
        self.hashed += 1
        self.known[real] = [st.st_size, st.st_mtime_ns, digest]
        self.changed = True
        return st.st_size, digest

    def save(self) -> None:
        if not self.changed:
            return
        live = {p: v for p, v in self.known.items() if os.path.exists(p)}      # forget files that are gone
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_text(self.path, json.dumps({"format": 1, "files": live}), mode=0o600)


def describe(model_dir: str, cache: HashCache | None = None) -> LocalModel:
    """A model directory's files, sizes, sha256s (cached) and digest; refused in one line when the directory is
    not an mlx-lm model (no config.json, no *.safetensors)."""
    root = check_model_dir(model_dir)
    cache = cache or HashCache()
    files = []
    for rel in model_paths(root):
        size, sha = cache.sha256(os.path.join(root, rel))
        files.append(ModelFile(rel, size, sha))
    cache.save()
    return LocalModel(root, sanitise(model_name(root)), tuple(files), model_digest(files))
