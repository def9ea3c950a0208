"""Fine-tuning quality against mlx_lm.lora: the model each trainer produces, before any speed is measured.

    .venv/bin/python benchmarks/bench_lora_quality.py [--steps 100]

A small llama (2 blocks, width 64) is trained here on plain stories (tests/lmfixture.py `pretrain`), quantized to 4
bits by mlx-lm's own convert, then adapted with LoRA to a chat task it has never seen (a question about a story's
opening, a short answer: `story_tasks`), one process each, side by side in one run:

- mlx_lm.lora with its defaults (`--iters N --num-layers -1`: its default of 16 layers refuses a 2-block model);
- the bundled trainer with its fine-tune defaults (`--adapter lora --steps N`), and with `--mask-prompt off` (then
  every setting is mlx-lm's default), the one default of ours that differs;
- a full fine-tune of the unquantized base, ours against `mlx_lm.lora --fine-tune-type full`;
- mlx-lm's own lora_config.yaml given to both (`-c`).

Every result is scored by mlx-lm's own evaluate (tests/mlxlmscore.py) on the chat test set (answers only, and whole
records) and on held-out stories (plain text: what the base knew), without mlx-lm's extra padding target (its
`--test` figure, with it, is kept too). Writes benchmarks/results/lora_quality.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from record import write_record  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    import lmfixture
    from mlxlmscore import score_in_process

    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        root = os.path.join(tmp, "lab")
        began = time.monotonic()
        lmfixture.pretrain(os.path.join(root, "base"))
        pretrain_s = time.monotonic() - began
        lmfixture.quantize(os.path.join(root, "base"), os.path.join(root, "base-4bit"), bits=4, group_size=32)
        lmfixture.story_tasks(root)

        def scores(model, adapter=None):
            sets = [(os.path.join(root, "chat"), True), (os.path.join(root, "chat"), False),
                    (os.path.join(root, "text"), False)]
            got = score_in_process(os.path.join(root, model), adapter, sets)
            return {"answers": got[0]["no_pad"], "records": got[1]["no_pad"], "text": got[2]["no_pad"],
                    "answers_mlx_lm_test": got[0]["mlx_lm"]}

        def timed(argv):
            began = time.monotonic()
            r = subprocess.run(argv, capture_output=True, text=True, cwd=root, timeout=1200)
            if r.returncode:
                raise SystemExit(f"{' '.join(argv[:6])} failed: {r.stderr[-2000:]}")
            return time.monotonic() - began

        def mlx_lm(name, model, *extra):
            out = os.path.join(root, name)
            seconds = timed([sys.executable, "-m", "mlx_lm", "lora", "--model", os.path.join(root, model), "--train",
                             "--data", os.path.join(root, "chat"), "--adapter-path", out, *extra])
            return {**scores(model, out), "seconds": round(seconds, 1)}

        def ours(name, model, *extra, result="adapters"):
            out = os.path.join(root, name)
            seconds = timed([sys.executable, "-m", "clusterctl.train", "--model", os.path.join(root, model), "--data",
                             os.path.join(root, "chat"), "--out", out, *extra])
            if result == "adapters":
                return {**scores(model, os.path.join(out, "adapters")), "seconds": round(seconds, 1)}
            return {**scores(os.path.relpath(os.path.join(out, "model"), root)), "seconds": round(seconds, 1)}

        n = str(args.steps)
        rows = {"base 4-bit": scores("base-4bit"), "base": scores("base"),
                "LoRA: mlx_lm.lora defaults": mlx_lm("m-lora", "base-4bit", "--iters", n, "--num-layers", "-1"),
                "LoRA: ours, defaults": ours("o-lora", "base-4bit", "--adapter", "lora", "--steps", n),
                "LoRA: ours, --mask-prompt off (mlx-lm's defaults)": ours("o-lora-off", "base-4bit", "--adapter",
                                                                          "lora", "--steps", n, "--mask-prompt", "off"),
                "full: mlx_lm.lora --fine-tune-type full": mlx_lm("m-full", "base", "--fine-tune-type", "full",
                                                                  "--iters", n, "--num-layers", "-1"),
                "full: ours, defaults": ours("o-full", "base", "--steps", n, result="model")}
        config = os.path.join(root, "lora_config.yaml")
        with open(config, "w") as f:
            f.write(f"model: {os.path.join(root, 'base-4bit')}\ntrain: true\nfine_tune_type: lora\ndata: "
                    f"{os.path.join(root, 'chat')}\nnum_layers: -1\nbatch_size: 4\niters: {n}\nlearning_rate: 5e-5\n"
                    "val_batches: -1\nsteps_per_eval: 1000\nlora_parameters:\n  rank: 8\n  scale: 20.0\n"
                    "  dropout: 0.0\n")
        m_out, o_out = os.path.join(root, "m-config"), os.path.join(root, "o-config")
        m_s = timed([sys.executable, "-m", "mlx_lm", "lora", "-c", config, "--adapter-path", m_out])
        o_s = timed([sys.executable, "-m", "clusterctl.train", "-c", config, "--out", o_out])
        rows["-c lora_config.yaml: mlx_lm.lora"] = {**scores("base-4bit", m_out), "seconds": round(m_s, 1)}
        rows["-c lora_config.yaml: ours"] = {**scores("base-4bit", os.path.join(o_out, "adapters")),
                                            "seconds": round(o_s, 1)}

    print(f"{'run':<52} {'answers':>8} {'records':>8} {'text':>7} {'mlx-lm --test':>13} {'s':>6}")
    for name, r in rows.items():
        print(f"{name:<52} {r['answers']:>8.4f} {r['records']:>8.4f} {r['text']:>7.4f} "
              f"{r['answers_mlx_lm_test']:>13.4f} {r.get('seconds', 0):>6.1f}")
    base4, base = rows["base 4-bit"]["text"], rows["base"]["text"]
    ratios = {
        "lora text / base": rows["LoRA: ours, defaults"]["text"] / base4,
        "lora answers ours / mlx_lm": rows["LoRA: ours, defaults"]["answers"] / rows["LoRA: mlx_lm.lora defaults"]["answers"],
        "full text / base": rows["full: ours, defaults"]["text"] / base,
        "full answers ours / mlx_lm": (rows["full: ours, defaults"]["answers"]
                                       / rows["full: mlx_lm.lora --fine-tune-type full"]["answers"]),
        "config records ours / mlx_lm": (rows["-c lora_config.yaml: ours"]["records"]
                                         / rows["-c lora_config.yaml: mlx_lm.lora"]["records"]),
        "config answers ours / mlx_lm": (rows["-c lora_config.yaml: ours"]["answers"]
                                         / rows["-c lora_config.yaml: mlx_lm.lora"]["answers"])}
    print(json.dumps({k: round(v, 4) for k, v in ratios.items()}))
    write_record("lora_quality", steps=args.steps, pretrain_seconds=round(pretrain_s, 1), rows=rows,
                 ratios=ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
