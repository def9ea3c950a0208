"""Small mlx-lm models and fine-tuning data made on the spot (nothing is downloaded): a byte-pair tokenizer
trained with `tokenizers` on a made-up corpus, with a ChatML chat template, and a llama or qwen3 model of a
few hundred thousand parameters built with mlx-lm's own classes and saved as mlx-lm saves models."""
from __future__ import annotations

import json
import random
from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NAMES = ["Tom", "Ann", "Lily", "Sam", "Max", "Mia", "Ben", "Zoe"]
THINGS = ["a red ball", "a small dog", "a blue kite", "an old map", "a green frog", "a shiny key"]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(NAMES)} found {rng.choice(THINGS)} in the park and was very happy." for _ in range(n)]


def qa(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        out.append((f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."))
    return out


def make_tokenizer(dest: Path, vocab: int = 320) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = sentences(400) + [f"{q} {a}" for q, a in qa(200)] + ["user assistant system"] * 20
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
        "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE, "model_max_length": 512}))


def make_model(dest, kind: str = "llama", layers: int = 2, dim: int = 64, mlp: int = 128, tied: bool = False,
               dtype: str = "float32", seed: int = 0, files: int = 1, heads: int = 4, kv_heads: int = 2) -> Path:
    """An mlx-lm model directory at `dest`: config.json, model.safetensors (or `files` weight files, layers in
    order, with their index, as mlx-lm writes a big model), tokenizer (llama, qwen3 or qwen2)."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import save_model

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    make_tokenizer(dest)
    vocab = json.loads((dest / "tokenizer.json").read_text())["model"]["vocab"]
    config = {"model_type": kind, "hidden_size": dim, "num_hidden_layers": layers, "intermediate_size": mlp,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-5,
              "vocab_size": len(vocab) + 3, "rope_theta": 10000.0, "tie_word_embeddings": tied,
              "max_position_embeddings": 512, "torch_dtype": dtype}
    if kind == "qwen3":
        config.update(head_dim=dim // heads, architectures=["Qwen3ForCausalLM"])
        from mlx_lm.models import qwen3 as arch
    elif kind == "qwen2":         # mlx-lm pipelines it (and shards it)
        config.update(architectures=["Qwen2ForCausalLM"])
        from mlx_lm.models import qwen2 as arch
    else:
        config.update(architectures=["LlamaForCausalLM"])
        from mlx_lm.models import llama as arch
    mx.random.seed(seed)
    model = arch.Model(arch.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: p.astype(getattr(mx, dtype)), model.parameters()))
    mx.eval(model.parameters())
    save_model(dest, model)
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    if files > 1:
        split_weights(dest, files, layers)
    return dest


def quantize(src, dest, bits: int = 4, group_size: int = 32, mode: str = "affine") -> Path:
    """`src` quantized into `dest` as `mlx_lm.convert -q` writes it (mlx-lm's own convert), the tokenizer with it."""
    from mlx_lm import convert

    dest = Path(dest)
    convert(str(src), mlx_path=str(dest), quantize=True, q_bits=bits, q_group_size=group_size, q_mode=mode)
    return dest


def split_weights(dest: Path, files: int, layers: int) -> None:
    """model.safetensors as `files` files, the layers in order (the embedding with the first, the rest with the
    last), and model.safetensors.index.json mapping each weight to its file."""
    import re

    import mlx.core as mx

    weights = mx.load(str(dest / "model.safetensors"))
    names = [f"model-{i + 1:05d}-of-{files:05d}.safetensors" for i in range(files)]
    where = {}
    for key in weights:
        layer = re.search(r"\.layers\.(\d+)\.", key)
        where[key] = names[int(layer.group(1)) * files // layers] if layer else names[0 if "embed" in key else -1]
    for name in names:
        mx.save_safetensors(str(dest / name), {k: v for k, v in weights.items() if where[k] == name},
                            metadata={"format": "mlx"})
    (dest / "model.safetensors").unlink()
    total = sum(v.nbytes for v in weights.values())
    (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": dict(sorted(where.items()))}))


def make_data(dest, kind: str = "chat", records: int = 120, valid: bool = True, seed: int = 0) -> Path:
    """train.jsonl (and valid.jsonl) of `chat`, `completions` or `text` records."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    def lines(n, s):
        if kind == "text":
            return [json.dumps({"text": t}) for t in sentences(n, s)]
        if kind == "completions":
            return [json.dumps({"prompt": q, "completion": a}) for q, a in qa(n, s)]
        return [json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                for q, a in qa(n, s)]

    (dest / "train.jsonl").write_text("\n".join(lines(records, seed)) + "\n")
    if valid:
        (dest / "valid.jsonl").write_text("\n".join(lines(max(records // 10, 4), seed + 1000)) + "\n")
    return dest


def make_inputs(root) -> dict:
    """What the fine-tuning tests train on, under `root`: a bfloat16 llama, a tied float32 qwen3, chat records with
    valid.jsonl and text records without (every 20th held out)."""
    root = Path(root)
    return {"llama": make_model(root / "llama", "llama", dtype="bfloat16"),
            "qwen3": make_model(root / "qwen3", "qwen3", tied=True),
            "chat": make_data(root / "chat", "chat"),
            "text": make_data(root / "text", "text", valid=False)}


def hub_snapshot(model_dir, hf_home, repo: str = "tiny-org/tiny", revision: str = "0" * 40) -> Path:
    """`model_dir` as the Hugging Face hub caches a download, under HF_HOME: hub/models--ORG--NAME/ with
    blobs/<sha256> (each file's content once), snapshots/REVISION/<file> -> ../../blobs/<sha256> (relative links,
    one ../ more per subdirectory) and refs/main naming the revision. The snapshot directory is returned: what
    `huggingface-cli download` prints and what users give clusterctl."""
    import hashlib
    import os
    import shutil

    entry = Path(hf_home) / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = entry / "snapshots" / revision
    (entry / "blobs").mkdir(parents=True, exist_ok=True)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(revision)
    for path in sorted(Path(model_dir).rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(model_dir)
        blob = entry / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(path, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    return snapshot
