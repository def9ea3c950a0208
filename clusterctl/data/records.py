"""Fine-tuning data in the layout mlx-lm's trainer reads: a directory with `train.jsonl` (and `valid.jsonl`),
one JSON object a line, each one of

    {"text": "..."}                                                  trained on every token
    {"prompt": "...", "completion": "..."}                           the model's chat template, user then assistant
    {"messages": [{"role": "user", "content": "..."}, ...]}          the model's chat template (optional "tools")

Prompts are masked as mlx-lm's `--mask-prompt` masks them: the loss counts only the tokens after what the chat
template renders for every message but the last (with the generation prompt), so a model learns its answers,
not the questions (`--mask-prompt off` trains on every token).

A step's global batch is `batch_size` records (mlx-lm's --batch-size: global, so it must divide by the world), and
rank r takes its slice of them: micro-batch i of optimizer step s is global batch s x accum + i, records drawn
epoch by epoch in a permutation that depends on (seed, epoch) only. So one rank with --accum 2 and half the batch
trains on exactly the records two ranks do (the same run, to float rounding), and a resumed or elastic run
continues the same sequence. Every rank reads and tokenizes the whole file: fine-tuning sets are small beside the
model (a 10,000-record set is a few MB), and the global order needs every record's place.

Under --group-by-length an epoch's permutation is then sorted by length in windows of LENGTH_WINDOW records, cut
into runs that are shuffled (RecordLoader._order), so a batch's records are near in length.

A rank's records are packed into rows (first-fit, longest first, into rows at least as wide as the longest record,
wider where that is less work: row_width; then no wider than the fullest row), each position carrying its record's
segment number, so attention stays inside a record (train/packing.py) and packed training computes what padded
training computes, record by record, without computing the padding. A record longer than --max-seq-length is cut
to it, as mlx-lm cuts it.
Targets that belong to a prompt carry the label -1 (IGNORE), which the loss leaves out.
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
TRAIN, VALID, TEST = "train.jsonl", "valid.jsonl", "test.jsonl"
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


@dataclass(frozen=True)
class Sequences:
    """Tokenized records: each one's token ids and how many leading ones are prompt (not trained on), every record
    cut to `max_len` tokens; `cut` is how many were longer (mlx-lm cuts them too, with a warning)."""
    ids: list[list[int]]
    offsets: list[int]
    cut: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(t) for t in self.ids)

    @property
    def trained(self) -> int:
        """Targets the loss counts: a record's tokens after the first and after its prompt."""
        return sum(max(len(t) - max(o, 1), 0) for t, o in zip(self.ids, self.offsets))

    def __len__(self) -> int:
        return len(self.ids)


def tokenize_all(records: list[Record], tokenizer, mask_prompt: bool, max_len: int) -> Sequences:
    ids, offsets, cut = [], [], 0
    for r in records:
        t, o = tokenize(r, tokenizer, mask_prompt)
        if len(t) > max_len:
            t, cut = t[:max_len], cut + 1
        ids.append(t)
        offsets.append(min(o, len(t)))
    return Sequences(ids, offsets, cut)


ROW_MULTIPLE = 8       # the widths row_width tries step by this; pack then trims a row to its fullest (a new width
                       # compiles the step anew: ~10 ms, once)


def round_up(n: int, multiple: int = ROW_MULTIPLE) -> int:
    """n (at least 1) rounded up to a multiple: a row's width from its longest record, by default."""
    return -(-max(n, 1) // multiple) * multiple


@dataclass(frozen=True)
class Rows:
    """A micro-batch of packed rows, (rows, width) each: `tokens` the inputs, `labels` the targets (IGNORE: not
    trained), `segments` which record of its row each position belongs to (padding: -1), for per-record attention."""
    tokens: list[list[int]]
    labels: list[list[int]]
    segments: list[list[int]]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.tokens), len(self.tokens[0]) if self.tokens else 0


def pairs(ids: list[int], offset: int, pad_target: int | None = None) -> tuple[list[int], list[int]]:
    """A record as (inputs, labels): token k + 1 is the target after inputs[0..k], trained unless it is prompt
    (k + 1 < offset). `pad_target`: also score the token after the record's last (mlx-lm's test score does:
    docs/from-mlx-lm.md#scores)."""
    inputs, labels = list(ids[:-1]), [t if k + 1 >= offset else IGNORE for k, t in enumerate(ids[1:])]
    if pad_target is not None and ids:
        inputs.append(ids[-1])
        labels.append(pad_target)
    return inputs, labels


ATTENTION_ROOM = 4       # wider rows may hold up to 4x the attention scores of a row a record (the memory plan's)


def _first_fit(lengths: list[int], width: int, together: bool) -> list[list[int]]:
    """Records (by index) into rows of `width`, longest first, each into the first row with room for it."""
    rows: list[list[int]] = []
    free: list[int] = []
    for k in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        row = next((r for r, room in enumerate(free) if room >= lengths[k]), None) if together else None
        if row is None:
            rows.append([])
            free.append(width)
            row = len(rows) - 1
        rows[row].append(k)
        free[row] -= lengths[k]
    return rows


def row_width(lengths: list[int], attention: float = 0.0) -> int:
    """The width that packs these records at the least work, first-fit, longest first: from the longest rounded up
    to ROW_MULTIPLE, wider while that saves work and the rows' attention (rows x width^2, what a row's scores take)
    stays within ATTENTION_ROOM times what one row a record at the narrowest would take; the narrowest of equals.
    The work of a row is width x (1 + attention x width): a position's own work, and its attention to the width of
    its row (`attention`: that share per position of width, packing.attention_share's; 0: positions alone)."""
    def work(rows: int, width: int) -> float:
        return rows * width * (1.0 + attention * width)

    narrowest = round_up(max(lengths, default=1))
    best, best_cost = narrowest, work(len(_first_fit(lengths, narrowest, True)), narrowest)
    limit = ATTENTION_ROOM * len(lengths) * narrowest ** 2
    width = narrowest + ROW_MULTIPLE
    while width <= sum(lengths) + ROW_MULTIPLE - 1:
        rows = len(_first_fit(lengths, width, True))
        if rows * width ** 2 > limit:
            break
        if work(rows, width) < best_cost:
            best, best_cost = width, work(rows, width)
        width += ROW_MULTIPLE
    return best


def pack(sequences: list[tuple[list[int], list[int]]], filler: int, width: int | None = None,
         together: bool = True, attention: float = 0.0) -> Rows:
    """(inputs, labels) records into rows of `width` positions (default: row_width's, the least work, then trimmed
    to the fullest row), first-fit, longest first; positions no record fills are padding (IGNORE labels, segment
    -1). `together` False: a row for each record, as wide as the longest (for a model that cannot attend per
    record: train/packing.py)."""
    lengths = [len(i) for i, _ in sequences]
    longest = max(lengths, default=1)
    chosen = width is None
    if chosen:
        width = row_width(lengths, attention) if together else round_up(longest)
    if longest > width:
        raise SourceError(f"a record of {longest} tokens does not fit a row of {width}")
    placed = _first_fit(lengths, width, together) or [[]]
    if chosen:      # no wider than the fullest row: the rounding chose how records share rows, not extra padding
        width = max(max(sum(lengths[k] for k in members) for members in placed), 1)
    tokens, labels, segments = [], [], []
    for members in placed:
        t, lab, seg = [], [], []
        for s, k in enumerate(sorted(members)):
            inputs, targets = sequences[k]
            t += inputs
            lab += targets
            seg += [s] * len(inputs)
        pad = width - len(t)
        tokens.append(t + [filler] * pad)
        labels.append(lab + [IGNORE] * pad)
        segments.append(seg + [-1] * pad)
    return Rows(tokens, labels, segments)


PICK_MULTIPLE = 8        # the trained positions a micro-batch lists, rounded up to this (few compiled shapes)


def trained_positions(labels: list[list[list[int]]]) -> list[list[int]]:
    """For each micro-batch's (rows, width) labels, the flat indices (row x width + column) of the positions with a
    target, all micro-batches' lists padded with -1 to one length, a multiple of PICK_MULTIPLE: the only positions
    whose output (the model's head, its largest matrix for a small model) the loss needs (model.loss_fn)."""
    picks = [[k for k, t in enumerate(t for row in rows for t in row) if t != IGNORE] for rows in labels]
    n = round_up(max((len(p) for p in picks), default=1), PICK_MULTIPLE)
    return [p + [-1] * (n - len(p)) for p in picks]


def stack(batches: list[Rows], filler: int, segments: bool = True, picks: bool = False):
    """Micro-batches as (accum, rows, width) arrays (x, y and, for packed rows, segments), each padded to the
    largest's shape; `picks`: then also (accum, K) the trained positions of each (trained_positions)."""
    import mlx.core as mx

    n = max(b.shape[0] for b in batches)
    w = max(b.shape[1] for b in batches)

    def grow(rows, value):
        return [r + [value] * (w - len(r)) for r in rows] + [[value] * w for _ in range(n - len(rows))]

    kinds = (("tokens", filler), ("labels", IGNORE)) + ((("segments", -1),) if segments else ())
    arrays = {f: [grow(getattr(b, f), v) for b in batches] for f, v in kinds}
    out = tuple(mx.array(a, dtype=mx.int32) for a in arrays.values())
    if picks:
        out += (mx.array(trained_positions(arrays["labels"]), dtype=mx.int32),)
    return out


LENGTH_WINDOW = 256       # records of an epoch's permutation sorted by length together (RecordLoader._order),
LENGTH_RUN = 16           # in runs of this many, shuffled


class RecordLoader:
    """The records of this rank's micro-batches: micro-batch m (of optimizer step m // accum) holds this rank's
    slice of global batch m: `batch_size` records (global) of an epoch's permutation, which depends on (seed,
    epoch) only; see the module docstring. `step(s)` is optimizer step s's micro-batches as (accum, rows, width)
    arrays: tokens, labels and segments."""

    packed = True           # records share rows (per-record attention); False: a row each (finetune.py)
    picked = False          # also the trained positions: the model's head computed there alone (finetune.py)
    attention = 0.0         # a position's attention work per position of its row's width (row_width)
    grouped = False         # --group-by-length: an epoch's order sorted by length in windows (_order)

    def __init__(self, seqs: Sequences, batch_size: int, accum: int, world: int, rank: int, seed: int, filler: int,
                 ranks_alike: int = 1):
        if batch_size % world:
            raise SourceError(f"--batch-size {batch_size} is the global batch (records a step, as mlx-lm's), which "
                              f"{world} ranks cannot share equally: give a multiple of {world}")
        self.seqs, self.batch_size, self.accum, self.world, self.rank = seqs, batch_size, accum, world, rank
        self.seed, self.filler = seed, filler
        self.share = batch_size // world
        # prepared shards: each rank draws from its own records, so the step's tokens are this rank's x the ranks
        self.ranks_alike = ranks_alike
        self._orders: dict[int, list[int]] = {}
        self._pairs: dict[int, tuple[list[int], list[int]]] = {}

    def _order(self, epoch: int) -> list[int]:
        """The epoch's order: a permutation. `grouped` (--group-by-length): each LENGTH_WINDOW records of it then
        sorted by length and cut into runs of LENGTH_RUN, the runs of a window shuffled. So a batch's records are
        near in length (little padding, as in mlx-lm's batches of records sorted by length), the lengths come in
        no order through the epoch, and which records meet in a batch changes from epoch to epoch. Either way it
        depends on (seed, epoch) only, not on the batch size (one rank with --accum 2 takes the records two ranks
        take)."""
        if epoch not in self._orders:
            rng = random.Random(f"clusterctl-records:{self.seed}:{epoch}")
            order = list(range(len(self.seqs)))
            rng.shuffle(order)
            if self.grouped:
                order = self._by_length(order, rng)
            self._orders = {epoch: order}        # the loader walks forward: one epoch's order at a time
        return self._orders[epoch]

    def _by_length(self, order: list[int], rng: random.Random) -> list[int]:
        out = []
        for w in range(0, len(order), LENGTH_WINDOW):
            window = sorted(order[w:w + LENGTH_WINDOW], key=lambda k: len(self.seqs.ids[k]))
            runs = [window[r:r + LENGTH_RUN] for r in range(0, len(window), LENGTH_RUN)]
            rng.shuffle(runs)
            out += [k for run in runs for k in run]
        return out

    def global_batch(self, g: int) -> list[int]:
        """The records of global batch g, every rank's."""
        n = len(self.seqs)
        return [self._order(slot // n)[slot % n] for slot in range(g * self.batch_size, (g + 1) * self.batch_size)]

    def indices(self, m: int) -> list[int]:
        """This rank's records in micro-batch m."""
        return self.global_batch(m)[self.rank * self.share:(self.rank + 1) * self.share]

    def _pair(self, k: int):
        if k not in self._pairs:
            self._pairs[k] = pairs(self.seqs.ids[k], self.seqs.offsets[k])
        return self._pairs[k]

    def rows(self, m: int) -> Rows:
        return pack([self._pair(k) for k in self.indices(m)], self.filler, together=self.packed,
                    attention=self.attention)

    def step(self, s: int, accum: int):
        """Optimizer step s's micro-batches, stacked: (x, y, segments), (accum, rows, width) each (no segments when
        each record has a row of its own), then the trained positions when `picked` (stack)."""
        if accum != self.accum:
            raise ValueError(f"this loader deals micro-batches for --accum {self.accum}, not {accum}")
        return stack([self.rows(s * accum + i) for i in range(accum)], self.filler, self.packed,
                     self.packed and self.picked)

    def step_tokens(self, s: int) -> int:
        """The real tokens of optimizer step s, every rank's (what tokens/s counts)."""
        mine = sum(len(self.seqs.ids[k]) for i in range(self.accum) for k in self.global_batch(s * self.accum + i))
        return mine * self.ranks_alike


class HeldOut:
    """Records scored as mlx-lm's evaluate scores them: in file order, global batches of `batch_size` records (the
    first `batches` of them, -1: all), rank r taking its slice; every trained target weighs the same. `pad_target`:
    also score the token after each record's last, as mlx-lm does (docs/from-mlx-lm.md#scores)."""

    packed = True
    attention = 0.0         # as RecordLoader's

    def __init__(self, seqs: Sequences, batch_size: int, world: int, rank: int, filler: int,
                 pad_target: int | None = None):
        self.seqs, self.batch_size, self.world, self.rank, self.filler = seqs, batch_size, world, rank, filler
        self.pad_target = pad_target

    def count(self, batches: int) -> int:
        total = -(-len(self.seqs) // self.batch_size)
        return total if batches < 0 else min(batches, total)

    def held_out(self, batches: int):
        """(x, y, segments), (rows, width) each, for each of the first `batches` global batches. Every rank gets
        the same number (a rank whose slice is empty scores a row of padding: zero3's gathers need every rank)."""
        import mlx.core as mx

        share = -(-self.batch_size // self.world)
        for b in range(self.count(batches)):
            first = b * self.batch_size + self.rank * share
            mine = range(first, min(first + share, (b + 1) * self.batch_size, len(self.seqs)))
            rows = pack([pairs(self.seqs.ids[k], self.seqs.offsets[k], self.pad_target) for k in mine], self.filler,
                        together=self.packed, attention=self.attention)
            kinds = (rows.tokens, rows.labels) + ((rows.segments,) if self.packed else ())
            yield tuple(mx.array(a, dtype=mx.int32) for a in kinds)


# ---- prepared once: `clusterctl data prepare RECORDS_DIR --tokenizer MODEL_DIR --world N` --------------------
# The same records, tokenized once here rather than by every rank, dealt to N shards: record k of a seeded shuffle
# goes to shard k % N, so rank r reads only its own file. Each shard (and val.bin) holds its records as
# little-endian int32: for each, its token count n, its prompt length, then its n token ids. A rank then draws its
# micro-batches from its own shard (RecordLoader with world 1, its share of the global batch): the run no longer
# equals one on another world size, as with any prepared shards; manifest.json says what they were made with,
# checked by the trainer.

KIND = "records"
PREPARED_FORMAT = 2      # 1: rows packed without per-record attention (prepare again)
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
    return f"records-{rank:05d}-of-{world:05d}.bin"


def _write_records(path: str, seqs: Sequences, which: list[int]) -> int:
    from array import array

    out = array("i")
    for k in which:
        out.extend((len(seqs.ids[k]), seqs.offsets[k]))
        out.extend(seqs.ids[k])
    if out.itemsize != 4:
        raise SourceError("this platform's C int is not 32 bits")
    if sys.byteorder != "little":
        out.byteswap()
    with open(path, "wb") as f:
        out.tofile(f)
    return len(which)


def prepare_records(source: str, world: int, out_dir: str, model_dir: str, max_seq_length: int = 2048,
                    mask_prompt: bool = False, seed: int = 0) -> dict:
    """Tokenize `source` (a train.jsonl directory) with the model's tokenizer into `world` shards of records in
    `out_dir` (replaced whole if it holds a dataset); returns the manifest."""
    from pathlib import Path

    from ..atomic import fsync_tree, replace_dir, write_text
    from ..digest import file_sha256

    if world < 1 or not 1 <= max_seq_length <= MAX_BLOCK_SIZE:
        raise SourceError(f"--world must be at least 1 and --max-seq-length from 1 to {MAX_BLOCK_SIZE} (got {world}, "
                          f"{max_seq_length})")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise SourceError(f"--tokenizer {model_dir}: records are tokenized with the model's own tokenizer and chat "
                          "template: give the mlx-lm model directory you will fine-tune (--model)")
    try:
        from mlx_lm.utils import load_tokenizer
    except ImportError:
        raise SourceError("tokenizing records for a model needs mlx-lm: pip install mlx-lm") from None
    train, held, given = read_dir(source)
    tokenizer = load_tokenizer(Path(model_dir))
    seqs = tokenize_all(train, tokenizer, mask_prompt, max_seq_length)
    val = tokenize_all(held, tokenizer, mask_prompt, max_seq_length)
    if len(seqs) < world:
        raise SourceError(f"{source}: {len(seqs)} records cannot give {world} ranks one each: use a smaller --world")
    order = list(range(len(seqs)))
    random.Random(f"clusterctl-prepare-records:{seed}").shuffle(order)
    out = os.path.abspath(out_dir)
    staging = f"{out}.tmp-{os.getpid()}"
    import shutil

    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    shards = []
    for r in range(world):
        name = shard_file(r, world)
        n = _write_records(os.path.join(staging, name), seqs, order[r::world])
        shards.append({"file": name, "records": n, "sha256": file_sha256(os.path.join(staging, name))})
    _write_records(os.path.join(staging, "val.bin"), val, list(range(len(val))))
    manifest = {"kind": KIND, "format": PREPARED_FORMAT, "world_size": world, "max_seq_length": max_seq_length,
                "mask_prompt": mask_prompt, "seed": seed, "model": os.path.abspath(model_dir),
                "tokenizer_sha256": tokenizer_digest(model_dir), "source": os.path.abspath(source),
                "records": len(train), "tokens": seqs.tokens, "trained": seqs.trained, "cut": seqs.cut,
                "held_out": {"records": len(held), "from": VALID if given else f"every {VAL_EVERY}th record"},
                "shards": shards, "val": {"file": "val.bin", "records": len(val),
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


def check_prepared(manifest: dict, where: str, world: int, model_dir: str, max_seq_length: int | None = None,
                   mask_prompt: bool | None = None) -> None:
    """One line for prepared records a run cannot use: made for another world size or another tokenizer (what the
    controller can tell), another --max-seq-length or prompt masking (the ranks, which know the run's settings)."""
    if manifest["world_size"] != world:
        raise SourceError(f"--data {where}: records prepared for world size {manifest['world_size']}, this run has "
                          f"{world} (prepare again with --world {world})")
    if manifest["tokenizer_sha256"] != tokenizer_digest(model_dir):
        raise SourceError(f"--data {where}: tokenized with {manifest['model']}'s tokenizer, which is not "
                          f"{model_dir}'s: prepare again with --tokenizer {model_dir}")
    if max_seq_length is not None and manifest["max_seq_length"] != max_seq_length:
        raise SourceError(f"--data {where}: records cut to --max-seq-length {manifest['max_seq_length']}, this run "
                          f"asks for {max_seq_length}: pass --max-seq-length {manifest['max_seq_length']} (or prepare "
                          "again)")
    if mask_prompt is not None and manifest["mask_prompt"] != mask_prompt:
        raise SourceError(f"--data {where}: prepared with --mask-prompt {'on' if manifest['mask_prompt'] else 'off'}; "
                          "pass the same, or prepare again")


def load_records(data_dir: str, entry: dict) -> Sequences:
    """One prepared file's records (checked against the manifest's count and the file's own framing)."""
    from array import array

    path = os.path.join(data_dir, entry["file"])
    try:
        size = os.path.getsize(path)
    except OSError:
        raise SourceError(f"{path}: missing (the manifest lists it)") from None
    data = array("i")
    if size % 4:
        raise SourceError(f"{path}: {size} bytes, not whole int32 values: truncated or corrupted")
    with open(path, "rb") as f:
        data.fromfile(f, size // 4)
    if sys.byteorder != "little":
        data.byteswap()
    ids, offsets, at = [], [], 0
    while at < len(data):
        n, offset = data[at], data[at + 1] if at + 1 < len(data) else -1
        if n < 0 or offset < 0 or at + 2 + n > len(data):
            break
        ids.append(data[at + 2:at + 2 + n].tolist())
        offsets.append(offset)
        at += 2 + n
    if at != len(data) or len(ids) != entry["records"]:
        raise SourceError(f"{path}: {size} bytes do not hold the {entry['records']} records the manifest lists: "
                          "truncated or corrupted (prepare again)")
    return Sequences(ids, offsets)
