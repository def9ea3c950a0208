"""Fine-tuning speed against mlx_lm.lora at the same settings, once both reach the same held-out loss: 2 loopback
sshd hosts (tests/sshcluster.py), ring, both launched as users launch them (`clusterctl run`), one config file in
mlx-lm's vocabulary given unchanged to both (`-c`), side by side in one run.

    .venv/bin/python benchmarks/bench_lora_speed.py [--iters 60]

The base: tests/lmfixture.py's `pretrain` llama (2 blocks, width 64), 4-bit (mlx-lm's convert). LoRA on every
block, batch 8 (global: 4 records a rank), learning rate 5e-5. Three cases: `chat` (a question about a story
and its answer, 55 to 100 tokens) with prompts not masked (mlx-lm's default) and masked (`mask_prompt: true` in
the file, for both), and `short` (one to three sentences of a story, 12 to 60 tokens). Ours runs twice: as it
is, and with `--group-by-length` (batches near in length, as mlx-lm's). Tokens/s is each trainer's own figure
(both count every record's real tokens), the median of its reports after the first two; the held-out loss is each
result's test-set loss scored by mlx-lm's own evaluate (tests/mlxlmscore.py, its padding target left out;
answers only where the prompt was masked).
Writes benchmarks/results/lora_speed.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_finetune import clusterctl_run  # noqa: E402
from record import write_record  # noqa: E402


def short_records(root: str) -> str:
    """One to three sentences of a story a record (12 to 60 tokens), train / valid / test."""
    import lmfixture

    out = os.path.join(root, "data", "short")
    os.makedirs(out)
    rng = random.Random(0)
    for name, first, n in (("train.jsonl", 0, 400), ("valid.jsonl", 400, 40), ("test.jsonl", 440, 60)):
        with open(os.path.join(out, name), "w") as f:
            for k in range(first, first + n):
                sentences = re.split(r"(?<=[.!?\"])\s+(?=[A-Z\"])", lmfixture.story_text(4, k))
                f.write(json.dumps({"text": " ".join(sentences[:rng.randint(1, 3)])}) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=60)
    args = parser.parse_args()
    import lmfixture
    from mlxlmscore import score_in_process
    from sshcluster import SSHCluster

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-lora-speed-") as tmp:
        project = os.path.join(tmp, "project")
        lmfixture.pretrain(os.path.join(tmp, "base"))
        lmfixture.quantize(os.path.join(tmp, "base"), os.path.join(project, "models", "base-4bit"), bits=4,
                           group_size=32)
        lmfixture.story_tasks(os.path.join(project, "data"))
        short_records(project)
        shutil.copy(os.path.join(HERE, "lora_metrics.py"), project)
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 2).start()
        try:
            for name, data, mask in (("chat", "chat", False), ("chat, --mask-prompt", "chat", True),
                                     ("short", "short", False)):
                key = name.replace(", --", "-").replace("-prompt", "")
                config = os.path.join(project, f"{key}.yaml")
                with open(config, "w") as f:
                    f.write(f"model: models/base-4bit\ntrain: true\nfine_tune_type: lora\ndata: data/{data}\n"
                            f"num_layers: -1\nbatch_size: 8\niters: {args.iters}\nlearning_rate: 5e-5\n"
                            f"mask_prompt: {'true' if mask else 'false'}\n"
                            "steps_per_report: 5\nsteps_per_eval: 100000\nval_batches: 1\nsave_every: 100000\n"
                            "lora_parameters: {rank: 8, scale: 20.0, dropout: 0.0}\n")
                theirs_dir = f"theirs-{key}"
                _, r = clusterctl_run(project, str(cluster.inventory), "ring",
                                      ["--fetch", theirs_dir, "lora_metrics.py", "-c", f"{key}.yaml",
                                       "--adapter-path", theirs_dir])
                reports = [json.loads(line.split("LORA_METRICS ", 1)[1]) for line in r.stdout.splitlines()
                           if "LORA_METRICS " in line]
                theirs_tps = statistics.median([x["real_tokens_per_s"] for x in reports if x["rank"] == 0][2:])
                base = os.path.join(project, "models", "base-4bit")
                sets = [(os.path.join(project, "data", data), mask)]
                held_theirs = score_in_process(base, os.path.join(project, theirs_dir), sets)[0]["no_pad"]
                row = {"mlx_lm_tokens_per_s": theirs_tps, "held_out_mlx_lm": held_theirs}
                for variant, extra in (("ours", []), ("ours_grouped", ["--group-by-length"])):
                    _, r = clusterctl_run(project, str(cluster.inventory), "ring", ["--", "-c", f"{key}.yaml", *extra])
                    run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]+)", r.stderr).group(1)
                    [path] = glob.glob(os.path.join(project, "runs", run_id, "metrics.jsonl"))
                    tps = statistics.median([x["tokens_per_s"] for x in map(json.loads, open(path))
                                             if "tokens_per_s" in x][2:])
                    held = score_in_process(base, os.path.join(project, "runs", run_id, "adapters"), sets)[0]["no_pad"]
                    row.update({f"{variant}_tokens_per_s": tps, f"{variant}_over_mlx_lm": tps / theirs_tps,
                                f"held_out_{variant}": held, f"held_out_{variant}_over_mlx_lm": held / held_theirs})
                    print(f"{name} ({variant}): tokens/s {tps:,.0f}, mlx-lm {theirs_tps:,.0f} ({tps / theirs_tps:.2f}x); "
                          f"held-out {held:.4f}, mlx-lm {held_theirs:.4f} ({held / held_theirs:.3f}x)", flush=True)
                results[name] = row
        finally:
            cluster.stop_all()
    write_record("lora_speed", iters=args.iters, hosts=2, backend="ring", results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
