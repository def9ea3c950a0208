"""Fine-tuning data in the layout mlx-lm's trainer reads: a directory with `train.jsonl` (and `valid.jsonl`),
one JSON object a line, each one of

    {"text": "..."}                                                  trained on every token
    {"prompt": "...", "completion": "..."}                           the model's chat template, user then assistant
    {"messages": [{"role": "user", "content": "..."}, ...]}          the model's chat template (optional "tools")

Prompts are masked as mlx-lm's `--mask-prompt` masks them: the loss counts only the tokens after what the chat
template renders for every message but the last (with the generation prompt), so a model learns its answers,
not the questions (`--mask-prompt off` trains on every token).

The tokenized records are packed back to back into one stream (no padding: every position of a row is a real
token) and cut into rows of block_size + 1 tokens; the last row's tail is filled with masked tokens. A row's
targets that belong to a prompt carry the label -1 (IGNORE), which the loss leaves out.

Order: the rows of a step's global batch are a pure function of (seed, step), and rank r takes its slice of
them, micro-batch i of rank r being slots (r x accum + i) x batch ... of the global batch. So one rank with
--accum 2 trains on exactly the rows two ranks with --accum 1 do (the same run, to float rounding), and a
resumed or elastic run continues the same sequence. Every rank reads and tokenizes the whole file: fine-tuning
sets are small beside the model (a 10,000-record set is a few MB), and the global order needs every row's place.
"""
from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass

from ..errors import SourceError

IGNORE = -1
MAX_BLOCK_SIZE = 1 << 20  # tokens a row: beyond any model's context (a 400-digit --block-size overflowed the packing)
TRAIN, VALID = "train.jsonl", "valid.jsonl"
KINDS = ("text", "completions", "chat")
VAL_EVERY = 20            # without valid.jsonl: every 20th training record is held out instead


def is_records_dir(path: str | None) -> bool:
    return bool(path) and os.path.isfile(os.path.join(path, TRAIN)) and not os.path.isfile(os.path.join(path, "manifest.json"))


@dataclass(frozen=True)
class Record:
    kind: str            # text | completions | chat
    value: dict
    where: str           # file:line


def _kind(obj, where: str) -> str:
    if not isinstance(obj, dict):
        raise SourceError(f"{where}: a record must be a JSON object, not {type(obj).__name__}")
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            raise SourceError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise SourceError(f"{where}: messages[{i}] needs a string \"role\" and a string \"content\"")
        return "chat"
    if "prompt" in obj or "completion" in obj:
        for key in ("prompt", "completion"):
            if not isinstance(obj.get(key), str):
                raise SourceError(f"{where}: a completions record needs string \"prompt\" and \"completion\" "
                                  f"({key} is {'missing' if key not in obj else type(obj[key]).__name__})")
        return "completions"
    if "text" in obj:
        if not isinstance(obj["text"], str):
            raise SourceError(f"{where}: \"text\" must be a string, not {type(obj['text']).__name__}")
        return "text"
    keys = ", ".join(sorted(obj)) or "none"
    raise SourceError(f"{where}: no \"text\", \"prompt\"/\"completion\" or \"messages\" (keys: {keys})")


def read_records(path: str) -> list[Record]:
    """Every record of a jsonl file, checked: a line that is not JSON, or not a record of a known kind, is one
    error naming file:line (never skipped). Blank lines are not records."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    obj = json.loads(line.rstrip("\r\n"))
                except ValueError as e:
                    raise SourceError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
                records.append(Record(_kind(obj, where), obj, where))
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise SourceError(f"{path}: {e.strerror}") from None
    if not records:
        raise SourceError(f"{path}: no records")
    return records


def read_dir(data_dir: str) -> tuple[list[Record], list[Record], bool]:
    """(train records, held-out records, whether valid.jsonl gave them)."""
    train = read_records(os.path.join(data_dir, TRAIN))
    valid_path = os.path.join(data_dir, VALID)
    if os.path.isfile(valid_path):
        return train, read_records(valid_path), True
    if len(train) < 2:
        raise SourceError(f"{data_dir}: one training record and no {VALID}: add {VALID} for the held-out loss")
    held = [r for i, r in enumerate(train) if i % VAL_EVERY == VAL_EVERY - 1] or train[-1:]
    keep = [r for r in train if r not in held]
    return keep, held, False


def tokenize(record: Record, tokenizer, mask_prompt: bool) -> tuple[list[int], int]:
    """(token ids, offset): the ids of the record and how many leading ones are prompt (not trained on)."""
    if record.kind == "text":
        ids = list(tokenizer.encode(record.value["text"]))
        if not ids or ids[-1] != tokenizer.eos_token_id:
            ids.append(tokenizer.eos_token_id)
        return ids, 0
    if record.kind == "completions":
        messages = [{"role": "user", "content": record.value["prompt"]},
                    {"role": "assistant", "content": record.value["completion"]}]
    else:
        messages = record.value["messages"]
    if not getattr(tokenizer, "chat_template", None):
        raise SourceError(f"{record.where}: a {record.kind} record is rendered with the model's chat template, and "
                          "this tokenizer has none (tokenizer_config.json chat_template); use {\"text\": ...} records")
    tools = record.value.get("tools")
    try:
        ids = list(tokenizer.apply_chat_template(messages, tools=tools, return_dict=False))
        offset = 0
        if mask_prompt and len(messages) > 1:
            prompt = tokenizer.apply_chat_template(messages[:-1], tools=tools, return_dict=False,
                                                   add_generation_prompt=messages[-1]["role"] == "assistant")
            offset = len(prompt)
    except Exception as e:  # noqa: BLE001 - a template is a program of the model's (jinja2 raises anything)
        raise SourceError(f"{record.where}: the model's chat template failed on this record: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return ids, offset


@dataclass
class Packed:
    """Rows of block_size + 1 token ids and, per position, the label it is trained to predict (IGNORE:
    not trained); `tokens` is how many real tokens the records had, `trained` how many targets count."""
    rows: list[list[int]]
    labels: list[list[int]]
    tokens: int
    trained: int


def pack(sequences: list[tuple[list[int], int]], block_size: int, filler: int) -> Packed:
    """The sequences back to back, cut into rows of block_size + 1 (neighbouring rows share one token, so every
    target is in exactly one row). Token k of a sequence is a target unless k < offset (its prompt)."""
    stream, trained = [], []
    for ids, offset in sequences:
        stream.extend(ids)
        trained.extend(k >= offset for k in range(len(ids)))
    total = len(stream)
    if total < 2:
        raise SourceError("the records hold fewer than 2 tokens: nothing to train on")
    n_rows = -(-(total - 1) // block_size)
    pad = n_rows * block_size + 1 - total
    stream += [filler] * pad
    trained += [False] * pad
    rows, labels = [], []
    for r in range(n_rows):
        a = r * block_size
        row = stream[a:a + block_size + 1]
        rows.append(row)
        labels.append([t if trained[a + j] else IGNORE for j, t in enumerate(row)])
    return Packed(rows, labels, total, sum(trained[1:]))


def rows_of(records: list[Record], tokenizer, block_size: int, mask_prompt: bool) -> Packed:
    return pack([tokenize(r, tokenizer, mask_prompt) for r in records], block_size, tokenizer.eos_token_id)


class RowLoader:
    """Micro-batch m of rank `rank`: batch(m) -> (x, y), (batch, block_size) int32 each, y the labels shifted by
    one with IGNORE where the target is not trained on. Rows are drawn epoch by epoch in a permutation that
    depends on (seed, epoch) only; see the module docstring for which rows a rank's micro-batch takes."""

    def __init__(self, packed: Packed, batch_size: int, accum: int, world: int, rank: int, seed: int,
                 shuffle: bool = True):
        import mlx.core as mx

        self.rows = mx.array(packed.rows, dtype=mx.int32)
        self.labels = mx.array(packed.labels, dtype=mx.int32)
        self.n = len(packed.rows)
        self.batch_size, self.accum, self.world, self.rank, self.seed = batch_size, accum, world, rank, seed
        self.shuffle = shuffle
        self._orders: dict[int, list[int]] = {}
        self.tokens, self.trained = packed.tokens, packed.trained

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(self.n))
            if self.shuffle:
                random.Random(f"clusterctl-rows:{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}        # the loader walks forward: one epoch's order at a time
        return self._orders[epoch]

    def indices(self, m: int) -> list[int]:
        step, i = divmod(m, self.accum)
        first = step * self.batch_size * self.accum * self.world + (self.rank * self.accum + i) * self.batch_size
        out = []
        for slot in range(first, first + self.batch_size):
            epoch, at = divmod(slot, self.n)
            out.append(self._order(epoch)[at])
        return out

    def batch(self, m: int):
        import mlx.core as mx

        idx = mx.array(self.indices(m), dtype=mx.int32)
        return self.rows[idx][:, :-1], self.labels[idx][:, 1:]


# ---- prepared once: `clusterctl data prepare RECORDS_DIR --tokenizer MODEL_DIR --world N` --------------------
# The same rows, tokenized once here rather than by every rank, dealt to N shards: row k of a seeded shuffle of
# every row goes to shard k % N, so rank r reads only its own file. Each shard (and val.bin) holds its rows as
# little-endian int32, row by row: the block_size + 1 token ids, then their block_size + 1 labels. A rank then
# draws its own rows (RowLoader with world 1): the run no longer equals one on another world size, as with any
# prepared shards; manifest.json says what they were made with, checked by the trainer.

KIND = "records"
PREPARED_FORMAT = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "vocab.json", "merges.txt", "tiktoken.model")


def tokenizer_digest(model_dir: str) -> str:
    """sha256 over the model directory's tokenizer files (names and contents): what the rows were made with."""
    import hashlib

    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            h.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def shard_file(rank: int, world: int) -> str:
    return f"rows-{rank:05d}-of-{world:05d}.bin"


def _write_rows(path: str, packed: Packed, rows: list[int]) -> int:
    from array import array

    out = array("i")
    for k in rows:
        out.extend(packed.rows[k])
        out.extend(packed.labels[k])
    if out.itemsize != 4:
        raise SourceError("this platform's C int is not 32 bits")
    if sys.byteorder != "little":
        out.byteswap()
    with open(path, "wb") as f:
        out.tofile(f)
    return len(rows)


def prepare_records(source: str, world: int, out_dir: str, model_dir: str, block_size: int, mask_prompt: bool = True,
                    seed: int = 0) -> dict:
    """Tokenize `source` (a train.jsonl directory) with the model's tokenizer into `world` shards of rows in
    `out_dir` (replaced whole if it holds a dataset); returns the manifest."""
    from pathlib import Path

    from ..atomic import fsync_tree, replace_dir, write_text
    from ..digest import file_sha256

    if world < 1 or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise SourceError(f"--world must be at least 1 and --block-size from 1 to {MAX_BLOCK_SIZE} (got {world}, "
                          f"{block_size})")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise SourceError(f"--tokenizer {model_dir}: records are tokenized with the model's own tokenizer and chat "
                          "template: give the mlx-lm model directory you will fine-tune (--model)")
    try:
        from mlx_lm.utils import load_tokenizer
    except ImportError:
        raise SourceError("tokenizing records for a model needs mlx-lm: pip install 'clusterctl[lm]'") from None
    train, held, given = read_dir(source)
    tokenizer = load_tokenizer(Path(model_dir))
    packed = rows_of(train, tokenizer, block_size, mask_prompt)
    val = rows_of(held, tokenizer, block_size, mask_prompt)
    if len(packed.rows) < world:
        raise SourceError(f"{source}: {len(packed.rows)} rows of {block_size + 1} tokens cannot give {world} ranks "
                          "one each: use a smaller --block-size or --world")
    order = list(range(len(packed.rows)))
    random.Random(f"clusterctl-prepare-rows:{seed}").shuffle(order)
    out = os.path.abspath(out_dir)
    staging = f"{out}.tmp-{os.getpid()}"
    import shutil

    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    shards = []
    for r in range(world):
        name = shard_file(r, world)
        n = _write_rows(os.path.join(staging, name), packed, order[r::world])
        shards.append({"file": name, "rows": n, "sha256": file_sha256(os.path.join(staging, name))})
    _write_rows(os.path.join(staging, "val.bin"), val, list(range(len(val.rows))))
    manifest = {"kind": KIND, "format": PREPARED_FORMAT, "world_size": world, "block_size": block_size,
                "mask_prompt": mask_prompt, "seed": seed, "model": os.path.abspath(model_dir),
                "tokenizer_sha256": tokenizer_digest(model_dir), "source": os.path.abspath(source),
                "records": len(train), "tokens": packed.tokens, "trained": packed.trained,
                "held_out": {"records": len(held), "from": VALID if given else f"every {VAL_EVERY}th record"},
                "shards": shards, "val": {"file": "val.bin", "rows": len(val.rows),
                                          "sha256": file_sha256(os.path.join(staging, "val.bin"))}}
    write_text(os.path.join(staging, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
    fsync_tree(staging)
    if os.path.isdir(out) and not os.path.islink(out):
        other = _not_prepared(out)
        if other:
            shutil.rmtree(staging, ignore_errors=True)
            raise SourceError(f"{out_dir} exists and holds {other}, which an earlier `data prepare` did not write: "
                              "give a new --out (it is replaced whole)")
    replace_dir(staging, out)
    return manifest


def _not_prepared(out: str) -> str | None:
    """What in `out` an earlier prepare_records did not write (one name, for the refusal), None when `out` is
    empty or holds only such a prepare's files: its manifest and the shards and held-out rows it lists."""
    names = set(os.listdir(out))
    if not names:
        return None
    try:
        manifest = read_prepared(out)
    except SourceError:
        manifest = None
    if manifest is None:
        return "no manifest.json of prepared records" if "manifest.json" not in names else "another manifest.json"
    try:
        ours = {"manifest.json", manifest["val"]["file"], *(shard["file"] for shard in manifest["shards"])}
    except (KeyError, TypeError):
        return "another manifest.json"
    return next((repr(name) for name in sorted(names - ours)), None)


def read_prepared(data_dir: str) -> dict | None:
    """A prepared records directory's manifest (None when `data_dir` is not one)."""
    path = os.path.join(data_dir, "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        return None
    if manifest.get("format") != PREPARED_FORMAT:
        raise SourceError(f"{path}: records format {manifest.get('format')!r}, this clusterctl reads "
                          f"{PREPARED_FORMAT} (prepare it again)")
    return manifest


def check_prepared(manifest: dict, where: str, world: int, model_dir: str, block_size: int | None = None,
                   mask_prompt: bool | None = None) -> None:
    """One line for prepared rows a run cannot use: made for another world size or another tokenizer (what the
    controller can tell), another block size or prompt masking (the ranks, which know the run's settings)."""
    if manifest["world_size"] != world:
        raise SourceError(f"--data {where}: rows prepared for world size {manifest['world_size']}, this run has {world} "
                          f"(prepare again with --world {world})")
    if manifest["tokenizer_sha256"] != tokenizer_digest(model_dir):
        raise SourceError(f"--data {where}: tokenized with {manifest['model']}'s tokenizer, which is not "
                          f"{model_dir}'s: prepare again with --tokenizer {model_dir}")
    if block_size is not None and manifest["block_size"] != block_size:
        raise SourceError(f"--data {where}: rows of --block-size {manifest['block_size']}, this run asks for "
                          f"{block_size}: pass --block-size {manifest['block_size']} (or prepare again)")
    if mask_prompt is not None and manifest["mask_prompt"] != mask_prompt:
        raise SourceError(f"--data {where}: prepared with --mask-prompt {'on' if manifest['mask_prompt'] else 'off'}; "
                          "pass the same, or prepare again")


def load_rows(data_dir: str, entry: dict, block_size: int) -> Packed:
    """One prepared file's rows (checked against the manifest's row count)."""
    from array import array

    path = os.path.join(data_dir, entry["file"])
    width = block_size + 1
    try:
        size = os.path.getsize(path)
    except OSError:
        raise SourceError(f"{path}: missing (the manifest lists it)") from None
    if size != entry["rows"] * 2 * width * 4:
        raise SourceError(f"{path}: {size} bytes, the manifest says {entry['rows']} rows of {width} tokens: "
                          "truncated or corrupted")
    data = array("i")
    with open(path, "rb") as f:
        data.fromfile(f, size // 4)
    if sys.byteorder != "little":
        data.byteswap()
    rows, labels = [], []
    for k in range(entry["rows"]):
        at = 2 * width * k
        rows.append(data[at:at + width].tolist())
        labels.append(data[at + width:at + 2 * width].tolist())
    trained = sum(t >= 0 for row in labels for t in row[1:])
    return Packed(rows, labels, entry["rows"] * block_size, trained)
