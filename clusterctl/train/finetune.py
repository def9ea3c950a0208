"""What a fine-tune (`--model DIR`) reads before it trains: the model mlx-lm loads, its jsonl records tokenized with
the model's own tokenizer, the loaders that deal them to the ranks as mlx-lm's batches (data/records.py), and the
held-out and test sets scored as `mlx_lm.lora` scores them. trainer.train_model puts it together with the strategy,
the optimizer and fit.

    source = model_source(config, rank)               # this host's model-store copy, or --model as given
    records = open_records(config, tokenizer, rank, world)
    records.width                                     # the widest row a micro-batch can need: the memory plan's
    model, tokenizer, model_config = lm.load(source, ...)
    packed = choose_packing(model, records, ...)       # per-record attention (and the head at targets alone),
                                                       # checked on this model
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ConfigError
from ..trainer_contract import MODEL_DIR_ENV


def model_source(config, rank: int) -> str:
    """Where this rank reads --model from: its host's model-store copy when run pushed the model there
    (MODEL_DIR_ENV, set per host), else --model as given. The run's records keep --model as given."""
    stored = os.environ.get(MODEL_DIR_ENV)
    if not stored:
        return config.model
    if not os.path.isfile(os.path.join(stored, "config.json")):
        raise ConfigError(f"{MODEL_DIR_ENV}={stored}: no model there on this host (run puts --model into every "
                          "host's model store before the launch: run it again)")
    if rank == 0:
        print(f"model: {config.model}, read from {stored} (this host's model store)", flush=True)
    return stored


@dataclass
class Records:
    """This rank's training loader, the held-out set and the test set (None without test.jsonl), and the line that
    says what they are."""
    train: object           # records.RecordLoader
    val: object             # records.HeldOut
    test: object | None     # records.HeldOut
    summary: str

    @property
    def width(self) -> int:
        """The widest row one of the sets can need (the longest record, rounded up as rows are)."""
        from ..data.records import round_up

        return round_up(max(max((len(t) for t in s.ids), default=1) for s in self._sets()))

    def _sets(self):
        return [self.train.seqs, self.val.seqs] + ([self.test.seqs] if self.test is not None else [])

    def loaders(self) -> list:
        return [s for s in (self.train, self.val, self.test) if s is not None]

    def one_record_a_row(self) -> None:
        """Each record in a row of its own, under the model's own causal mask (a model packing would change)."""
        for s in self.loaders():
            s.packed = False


def open_records(config, tokenizer, rank: int, world: int) -> Records:
    """--data's records (or `data prepare`'s, this rank's shard), tokenized and cut to --max-seq-length."""
    from ..data import records

    if not config.data:
        raise ConfigError(f"--model {config.model} needs --data DIR: a directory of train.jsonl (and valid.jsonl) "
                          "records (docs/finetune.md#data)")
    mask, cut = config.mask_prompt == "on", config.max_seq_length
    pad = tokenizer.eos_token_id
    prepared = records.read_prepared(config.data)
    if prepared is not None:
        records.check_prepared(prepared, config.data, world, config.model, cut, mask)
        mine = records.load_records(config.data, prepared["shards"][rank])
        held = records.load_records(config.data, prepared["val"])
        # a rank draws its own share of each global batch from its own shard
        if config.batch_size % world:
            raise ConfigError(f"--batch-size {config.batch_size} is the global batch (records a step, as mlx-lm's), "
                              f"which {world} ranks cannot share equally: give a multiple of {world}")
        train = records.RecordLoader(mine, config.batch_size // world, config.accum, 1, 0, config.seed + rank, pad,
                                     ranks_alike=world)
        summary = (f"prepared records: {len(mine):,} on rank {rank} (its shard), {prepared['records']:,} in all, "
                   f"{prepared['tokens']:,} tokens; held out: {prepared['held_out']['records']:,} records "
                   f"({prepared['held_out']['from']})")
    else:
        if not records.is_records_dir(config.data):
            raise ConfigError(f"--data {config.data}: with --model, a directory holding train.jsonl (mlx-lm's layout) "
                              "is needed" + (" (this one holds shards from `data prepare` for the bundled model)"
                                             if os.path.isfile(os.path.join(config.data, "manifest.json")) else ""))
        train_records, val_records, given = records.read_dir(config.data)
        seqs = records.tokenize_all(train_records, tokenizer, mask, cut)
        held = records.tokenize_all(val_records, tokenizer, mask, cut)
        train = records.RecordLoader(seqs, config.batch_size, config.accum, world, rank, config.seed, pad)
        where = records.VALID if given else f"every {records.VAL_EVERY}th record of {records.TRAIN}"
        summary = (f"{len(seqs):,} records, {seqs.tokens:,} tokens ({seqs.trained:,} trained on); held out: "
                   f"{len(held):,} records ({where})")
        if seqs.cut:
            summary += f"; {seqs.cut:,} records longer than --max-seq-length {cut} cut to it"
    train.grouped = config.group_by_length == "on"
    val = records.HeldOut(held, config.batch_size, world, rank, pad)
    return Records(train, val, test_set(config, tokenizer, rank, world), summary)


def test_set(config, tokenizer, rank: int, world: int, pad_target: int | None = None):
    """test.jsonl beside the training records, as a held-out set (None when there is none and --test is not on)."""
    from ..data import records

    path = os.path.join(config.data, records.TEST) if config.data else None
    if not path or not os.path.isfile(path):
        if config.test == "on":
            raise ConfigError(f"--test: no {records.TEST} in --data {config.data} (mlx-lm's layout: train.jsonl, "
                              f"valid.jsonl, test.jsonl)")
        return None
    if config.test == "off":
        return None
    seqs = records.tokenize_all(records.read_records(path), tokenizer, config.mask_prompt == "on",
                                config.max_seq_length)
    return records.HeldOut(seqs, config.batch_size, world, rank, tokenizer.eos_token_id, pad_target)


def choose_packing(model, data: Records, vocab: int, known: bool, rank: int) -> bool:
    """Whether records share rows with per-record attention (packing.py): `known` for a strategy that cuts the model
    itself (zero3: llama, mistral, qwen2, qwen3, whose rotary attention packs exactly), else checked on the model
    by one small forward pass. Otherwise every record gets a row of its own, and rank 0 says so."""
    from .packing import attention_share, packs_exactly, splits_exactly

    if known or packs_exactly(model, vocab):
        # the head's logits only where a target is (not at a masked prompt or padding): checked on this model
        data.train.picked = known or splits_exactly(model, vocab)
        share = attention_share(model)                    # how much wider rows cost: records.row_width
        for s in data.loaders():
            s.attention = share
        return True
    data.one_record_a_row()
    if rank == 0:
        print("note: this model does not compute a record packed beside another as it computes it alone (absolute "
              "positions, or state carried along a row): one record a row, padded (docs/finetune.md#packed-rows)",
              flush=True)
    return False


def start_adapters(model, config, rank: int) -> None:
    """--resume-adapter-file: the adapters' weights before the first step (mlx-lm's: only the weights; the
    optimizer starts afresh), every name checked against the adapters the model has."""
    if not config.resume_adapter_file:
        return
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if not config.adapter:
        raise ConfigError("--resume-adapter-file starts adapters: give --adapter lora or dora (--fine-tune-type)")
    try:
        weights = mx.load(config.resume_adapter_file)
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"--resume-adapter-file {config.resume_adapter_file}: not readable ({e})") from None
    have = dict(tree_flatten(model.trainable_parameters()))
    wrong = [k for k, v in weights.items() if k not in have or have[k].shape != v.shape]
    if wrong or not weights:
        raise ConfigError(f"--resume-adapter-file {config.resume_adapter_file}: "
                          + (f"{wrong[0]} is not an adapter of this run's shape (--num-layers, --lora-rank and "
                             "--lora-keys must be the file's)" if wrong else "holds no weights"))
    model.load_weights(list(weights.items()), strict=False)
    if rank == 0:
        print(f"adapters: started from {config.resume_adapter_file} ({len(weights)} arrays)", flush=True)


def scored_adapters(model, config, rank: int) -> None:
    """Scoring only (--test without --train): the adapters of --adapter-path put on the model as mlx-lm's own
    load_adapters puts them (its adapter_config.json says which layers, rank and scale), or none: the base alone."""
    if not config.adapter_path:
        if rank == 0:
            print("test: scoring the model as it is (no --adapter-path)", flush=True)
        return
    from mlx_lm.tuner.utils import load_adapters

    try:
        load_adapters(model, config.adapter_path)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"--adapter-path {config.adapter_path}: not adapters mlx-lm can load ({e})") from None
    model.freeze()
    if rank == 0:
        print(f"test: scoring the adapters of {config.adapter_path}", flush=True)
