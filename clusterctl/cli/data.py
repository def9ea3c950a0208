"""clusterctl data prepare, data push, generate: datasets and the bundled trainer's checkpoints."""
from __future__ import annotations

import json
import shlex
import sys
import time

import click

from ..errors import EXIT_FAILED, EXIT_OK
from ..trainer_contract import RUNS_DIR
from ..transfer.push import METHODS
from . import app
from .console import Bars, one_line, size, table


@app.command('clusterctl generate --checkpoint runs/train-1 --prompt "Once upon a time"')
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(exists=True, file_okay=False),
              metavar="DIR", help="A run directory, its checkpoints/ or one step-N directory (latest wins).")
@click.option("--prompt", default="", help="Text to continue (default: start a new document).")
@click.option("--max-tokens", default=200, show_default=True, help="Tokens to generate at most.")
@click.option("--temperature", default=0.8, show_default=True, help="Sampling temperature; 0 is greedy.")
@click.option("--top-k", default=0, show_default=True, help="Sample from the k likeliest tokens (0: all).")
@click.option("--seed", default=0, show_default=True, help="Sampling seed.")
def generate_cmd(checkpoint_dir, prompt, max_tokens, temperature, top_k, seed):
    """Sample text from a checkpoint of the bundled trainer."""
    from ..train.generate import generate_text  # imports mlx: only this command pays for it

    pieces = generate_text(checkpoint_dir, prompt, max_tokens, temperature, seed, top_k)
    click.echo(prompt, nl=False)
    for piece in pieces:
        click.echo(piece, nl=False)
    click.echo()


@app.command("clusterctl export latest -o my-model")
@click.argument("run_ref", metavar="RUN")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="The model directory to write (replaced if it is an earlier export). Default: RUN's model/.")
@click.option("--runs-dir", default=RUNS_DIR, show_default=True, help="Where the project's runs/<id>/ directories are.")
@click.option("--dequantize", is_flag=True,
              help="An adapter run of a quantized base: write the fused model in the base's float dtype instead of "
                   "quantizing its layers again.")
def export_cmd(run_ref, out_dir, runs_dir, dequantize):
    """Write a run's latest checkpoint as an mlx-lm model directory.

    RUN: `latest`, a run id (or a unique prefix), a run directory, or a checkpoint directory. The result loads
    in `mlx_lm.generate --model DIR`, `mlx_lm.server` and `mlx_lm.convert -q`: a fine-tuned model (--model)
    with its source's config and tokenizer, a model trained from scratch as a llama with its tokenizer, an
    adapter run's (--adapter) base with its adapters fused in, as mlx_lm.fuse writes it.
    """
    import os

    from ..observe.runs import resolve
    from ..train.stepdirs import resolve as checkpoint_of
    from ..train.export import export   # imports mlx: only this command pays for it

    if os.path.isdir(run_ref) and (os.path.isfile(os.path.join(run_ref, "state.json"))
                                   or os.path.isdir(os.path.join(run_ref, "checkpoints"))):
        source = run_ref
    else:
        source = resolve(runs_dir, run_ref).dir
    ckpt = checkpoint_of(source, None)                     # <run>/checkpoints/step-N: the run is two up
    dest = out_dir or os.path.join(ckpt.parent.parent, "model")
    path = export(str(ckpt), dest, search=[os.getcwd(), os.path.dirname(os.path.abspath(runs_dir))],
                  dequantize=dequantize)
    click.echo(f"wrote {path}: mlx_lm.generate --model {shlex.quote(str(path))} --prompt \"...\"")


@app.command("clusterctl data prepare corpus.jsonl --world 4 --out data/", cls=click.Group)
def data_cmd():
    """Dataset shards: tokenize a corpus into one shard per rank."""


PHASES = {"tokenize": "tokenizing", "write": "writing shards"}


@data_cmd.command("prepare")
@click.argument("source")
@click.option("--world", type=int, required=True, metavar="N", help="Number of ranks: one shard each.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Directory for the shards, val.bin and manifest.json (replaced if it holds a dataset).")
@click.option("--tokenizer", default="byte", show_default=True, metavar="byte|PATH",
              help="byte (no downloads) or a local Hugging Face tokenizer.json (needs `tokenizers`).")
@click.option("--val-fraction", default=0.01, show_default=True, type=float,
              help="Share of documents held out in val.bin (every 1/F-th document).")
@click.option("--max-seq-length", type=int, default=2048, show_default=True, metavar="N",
              help="Records (a train.jsonl directory): a record longer than this many tokens is cut to it, as the "
                   "trainer's --max-seq-length.")
@click.option("--mask-prompt", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="Records: train on the answers only, as the trainer's --mask-prompt (its default for a fine-tune).")
@click.option("--seed", type=int, default=0, show_default=True, help="Records: the seed that deals records to shards.")
@click.option("--json", "as_json", is_flag=True, help="Print manifest.json instead of a summary.")
def data_prepare_cmd(source, world, out_dir, tokenizer, val_fraction, max_seq_length, mask_prompt, seed, as_json):
    """Tokenize SOURCE once into N equal shards plus manifest.json.

    SOURCE: `embedded` (the built-in stories; `embedded:COUNT[:SEED]`), a .txt file (documents separated
    by blank lines), a .jsonl file ("text" field), a directory of those, or hf:NAME[:SPLIT] (a dataset
    already in the local Hugging Face cache; needs `datasets`). A directory with train.jsonl (mlx-lm's layout:
    text, prompt/completion and messages records) becomes rows for fine-tuning a model with the trainer's
    --model: give that model's directory as --tokenizer (its chat template renders the records).
    """
    from ..data import records
    from ..data.shards import prepare

    if records.is_records_dir(source):
        start = time.monotonic()
        m = records.prepare_records(source, world, out_dir, tokenizer, max_seq_length, mask_prompt == "on", seed)
        if as_json:
            click.echo(json.dumps(m, indent=1))
            return
        cut = f", {m['cut']:,} cut to {max_seq_length} tokens" if m["cut"] else ""
        click.echo(f"{out_dir}: {m['records']:,} records, {m['tokens']:,} tokens ({m['trained']:,} trained on{cut}) in "
                   f"{world} shards of {', '.join(str(s['records']) for s in m['shards'])} records; "
                   f"val.bin {m['val']['records']} records; {time.monotonic() - start:.1f} s")
        return

    bars = None if as_json else Bars.on_terminal(err=True, unit="items")
    progress = (lambda phase, done, total: bars.update(PHASES.get(phase, phase), done, total)) if bars else None
    start = time.monotonic()
    try:
        manifest = prepare(source, world, out_dir, tokenizer=tokenizer, val_fraction=val_fraction, progress=progress)
    finally:
        if bars:
            bars.close()
    elapsed = time.monotonic() - start
    if as_json:
        click.echo(manifest.to_json(), nl=False)
        return
    total = manifest.tokens_per_shard * manifest.world_size + manifest.dropped_tokens + manifest.val.tokens
    click.echo(f"{out_dir}: {manifest.world_size} shards of {manifest.tokens_per_shard:,} {manifest.dtype} tokens "
               f"({manifest.tokenizer['type']} tokenizer, vocab {manifest.vocab_size}), val.bin "
               f"{manifest.val.tokens:,} tokens, {manifest.dropped_tokens:,} dropped")
    click.echo(f"{total:,} tokens in {elapsed:.1f} s ({total / max(elapsed, 1e-9):,.0f} tokens/s)")


@data_cmd.command(name="push")
@click.argument("data_dir")
@app.hosts_option
@click.option("--name", metavar="NAME", help="Directory name on the hosts (default: DATA_DIR's name).")
@click.option("--method", type=click.Choice(METHODS), default="auto", show_default=True,
              help="auto: rsync over ssh where both ends have it, else SFTP.")
@app.connect_timeout_option()
@click.option("--timeout", type=app.Seconds(above=True), metavar="S", default=7200.0, show_default=True,
              help="Seconds a host's whole transfer may take.")
@click.option("--all-shards", is_flag=True, help="Every shard to every host: the bundled trainer's balancing "
              "can then give a faster host rows of any shard.")
@app.strict_host_keys_option
@app.json_option
def data_push_cmd(data_dir, inventory_path, name, method, connect_timeout, timeout, all_shards, strict_host_keys,
                  as_json):
    """Send host i its shard i (+ val.bin, manifest), checked by sha256."""
    from ..transfer.shards import push_shards

    cluster = app.load(inventory_path)
    bars = None if as_json else Bars.on_terminal(cluster.names, threshold=Bars.LARGE)
    group = push_shards(app.connector(cluster, connect_timeout, strict_host_keys), data_dir, name=name,
                        method=method, timeout=timeout, progress=bars.update if bars else None,
                        all_shards=all_shards)
    if bars:
        bars.close()
    rows = []
    for o in group.values():
        r = o.value
        row = {"host": o.host.name, "ok": o.ok, "error": one_line(o.error) if o.error else None}
        if r is not None:
            row.update(dir=r.dir, ranks=r.ranks, sent=r.sent, sent_bytes=r.sent_bytes, unchanged=r.unchanged,
                       removed=r.removed, method=r.method, elapsed_s=round(r.elapsed_s, 3))
        rows.append(row)
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "hosts": rows}, indent=2))
    else:
        table([{"host": r["host"], "ranks": ",".join(map(str, r.get("ranks", []))),
                "sent": len(r.get("sent", [])), "bytes": size(r.get("sent_bytes", 0)),
                "unchanged": len(r.get("unchanged", [])), "removed": len(r.get("removed", [])),
                "time": f"{r['elapsed_s']:.1f}s" if "elapsed_s" in r else "",
                "note": f"error: {r['error']}" if r["error"] else r.get("dir", "")} for r in rows],
              ["host", "ranks", "sent", "bytes", "unchanged", "removed", "time", "note"])
        failed = len(group.failed)
        click.echo(f"{len(group) - failed} ok, {failed} failed", err=bool(failed))
    sys.exit(EXIT_OK if group.all_ok else EXIT_FAILED)
