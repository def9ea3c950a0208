"""Throughput of `clusterctl data prepare` (tokenize + split + sha256 + publish) in tokens/s.

    .venv/bin/python benchmarks/bench_prepare.py [--world 4] [--repeat 3] [--stories 20000]

Sources: the embedded default corpus (generated on the fly), the same kind of stories written to a local
.txt file and a .jsonl file (--stories of them, ~940 bytes each), and that .txt file through a Hugging Face
BPE tokenizer.json (when `tokenizers` is installed; trained here on 500 stories, vocab 2,000). Each run
is a fresh subprocess, so its peak RSS shows whether prepare streams (it must not grow with the corpus).
Also times generating the default corpus alone. Median of --repeat runs, interleaved.
Writes benchmarks/results/prepare.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from clusterctl.data.corpus import embedded_documents  # noqa: E402

ONE_RUN = """\
import json, resource, sys, time
from clusterctl.data.shards import prepare
source, world, out, tok = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
start = time.perf_counter()
m = prepare(source, world, out, tokenizer=None if tok == "byte" else tok)
elapsed = time.perf_counter() - start
tokens = m.tokens_per_shard * m.world_size + m.dropped_tokens + m.val.tokens
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"elapsed_s": elapsed, "tokens": tokens, "peak_rss_mb": peak_mb}))
"""


def hf_tokenizer(path: str) -> str | None:
    try:
        import tokenizers
        from tokenizers import decoders, models, pre_tokenizers, trainers
    except ImportError:
        return None
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(embedded_documents(count=500), trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<unk>", "<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stories", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        txt, jsonl = os.path.join(tmp, "stories.txt"), os.path.join(tmp, "stories.jsonl")
        with open(txt, "w", encoding="utf-8") as t, open(jsonl, "w", encoding="utf-8") as j:
            for doc in embedded_documents(seed=1, count=args.stories):
                t.write(doc + "\n\n")
                j.write(json.dumps({"text": doc}) + "\n")
        cases = [("embedded (default corpus)", "embedded", "byte"), (".txt file", txt, "byte"),
                 (".jsonl file", jsonl, "byte")]
        tok = hf_tokenizer(os.path.join(tmp, "tokenizer.json"))
        if tok:
            cases.append((".txt file, HF BPE tokenizer.json", txt, tok))
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in cases}
        generation = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            text_bytes = sum(len(d.encode()) for d in embedded_documents())
            generation.append(time.perf_counter() - start)
            for name, source, tokenizer in cases:
                out = os.path.join(tmp, "out")
                r = subprocess.run([sys.executable, "-c", ONE_RUN, source, str(args.world), out, tokenizer],
                                   capture_output=True, text=True, cwd=os.path.join(HERE, ".."), timeout=900)
                if r.returncode != 0:
                    raise RuntimeError(f"{name}: {r.stderr[-2000:]}")
                runs[name].append(json.loads(r.stdout))
        sizes = {txt: os.path.getsize(txt), jsonl: os.path.getsize(jsonl), "embedded": text_bytes}
        rows = []
        for name, source, tokenizer in cases:
            elapsed = statistics.median(r["elapsed_s"] for r in runs[name])
            tokens = runs[name][0]["tokens"]
            rows.append({"source": name, "tokenizer": "byte" if tokenizer == "byte" else "hf-bpe-2000",
                         "input_mb": round(sizes[source] / 1e6, 1), "tokens": tokens,
                         "elapsed_s": round(elapsed, 3), "tokens_per_s": round(tokens / elapsed),
                         "input_mb_per_s": round(sizes[source] / 1e6 / elapsed, 1),
                         "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs[name]), 1)})
    print(f"prepare --world {args.world}, median of {args.repeat} (fresh process each)\n")
    print("| source | tokenizer | input | tokens | time | tokens/s | MB/s | peak RSS |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['source']} | {r['tokenizer']} | {r['input_mb']} MB | {r['tokens']:,} | {r['elapsed_s']:.2f} s | "
              f"{r['tokens_per_s'] / 1e6:.1f} M | {r['input_mb_per_s']} | {r['peak_rss_mb']} MB |")
    gen = statistics.median(generation)
    print(f"\ngenerating the default embedded corpus alone: {text_bytes / 1e6:.1f} MB of text in {gen:.2f} s")
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.platform(),
              "python": platform.python_version(), "cpus": os.cpu_count(), "world": args.world,
              "repeat": args.repeat, "stories_in_files": args.stories, "rows": rows,
              "embedded_generation": {"text_mb": round(text_bytes / 1e6, 2), "elapsed_s": round(gen, 3)}}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "prepare.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
