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


def make_tokenizer(dest: Path, vocab: int = 320, corpus: list[str] | None = None) -> None:
    """A byte-level BPE with ChatML's special tokens and template, trained on `corpus` (default: the sentences and
    sums the small models' data is made of) and the chat template's words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = corpus or sentences(400) + [f"{q} {a}" for q, a in qa(200)]
    tok.train_from_iterator(corpus + ["user assistant system"] * 20, trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
        "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE, "model_max_length": 1024}))


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


# ---- a pretrained base: a small llama that has learned the embedded stories, and a chat task about them ---------
# What fine-tuning quality is measured on (tests/train/test_finetune_quality.py, benchmarks/bench_lora_quality.py):
# a base that knows plain text (its held-out story loss is low), a chat task it has never seen (a question about a
# story's opening, a short answer), and held-out stories to tell whether a fine-tune made it forget the text.

def story_text(seed: int, k: int) -> str:
    from clusterctl.data.stories import story
    return story(seed, k)


def story_question(seed: int, k: int) -> tuple[str, str]:
    """(prompt, answer) about story k: its first sentence and the one that answers, a question, and the answer in
    a few words read from the story itself."""
    import re

    sentences = re.split(r"(?<=[.!?\"])\s+(?=[A-Z\"])", story_text(seed, k))
    name = re.search(r"(?:named|called) (\w+)\.$|^(\w+) was a ", sentences[0])
    name = name.group(1) or name.group(2)
    asked = [("found a ", r"found a (.+?) by the", f"What did {name} find?", "A {}."),
             (" had a friend, a ", r"had a friend, a (\w+) named (\w+)\.", f"Who is {name}'s friend?", "{1}, a {0}."),
             ("lived in ", r"lived in (.+?) with", f"Where does {name} live?", "In {}.")]
    key, pattern, question, answer = asked[random.Random(f"question:{seed}:{k}").randrange(len(asked))]
    where = next(s for s in sentences if key in s)
    return f"{sentences[0]} {where}\n\n{question}", answer.format(*re.search(pattern, where).groups())


def pretrain(dest, steps: int = 120, layers: int = 2, dim: int = 64, mlp: int = 128, batch: int = 8,
             block: int = 64, lr: float = 6e-3, seed: int = 0) -> Path:
    """A llama trained from random weights on plain stories (seed 1's), saved as mlx-lm saves a model: the base
    whose knowledge a fine-tune should keep. AdamW, cosine from 3e-3, packed rows of `block` tokens."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm.models import llama
    from mlx_lm.utils import load_tokenizer, save_model

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    make_tokenizer(dest, 512, [story_text(7, k) for k in range(300)])
    tokenizer = load_tokenizer(dest)
    config = {"model_type": "llama", "hidden_size": dim, "num_hidden_layers": layers, "intermediate_size": mlp,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
              "vocab_size": tokenizer.vocab_size, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "max_position_embeddings": 1024, "torch_dtype": "float32", "architectures": ["LlamaForCausalLM"]}
    stream = []
    k = 0
    while len(stream) < steps * batch * block + block + 1:
        stream += tokenizer.encode(story_text(1, k)) + [tokenizer.eos_token_id]
        k += 1
    tokens = mx.array(stream, dtype=mx.int32)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    schedule = optim.cosine_decay(lr, steps, lr / 30)
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01, bias_correction=True)

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    step_fn = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    from functools import partial

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y):
        loss, grads = step_fn(model, x, y)
        optimizer.update(model, grads)
        return loss

    rng = random.Random(seed)
    order = list(range(0, len(stream) - block - 1, block))
    rng.shuffle(order)
    for i in range(steps):
        starts = mx.array(order[i * batch:(i + 1) * batch])[:, None]
        rows = tokens[starts + mx.arange(block + 1)[None]]
        loss = step(rows[:, :-1], rows[:, 1:])
        mx.eval(loss, state)
    save_model(dest, model)
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return dest


def story_tasks(dest, train: int = 400, valid: int = 40, test: int = 60) -> dict:
    """The chat task (dest/chat: train, valid and test.jsonl of messages records about stories of seed 2) and held-out
    plain text (dest/text: test.jsonl of seed 3's stories as text records, which no training saw)."""
    dest = Path(dest)

    def chat(first, n):
        out = []
        for k in range(first, first + n):
            prompt, answer = story_question(2, k)
            out.append(json.dumps({"messages": [{"role": "user", "content": prompt},
                                                {"role": "assistant", "content": answer}]}))
        return "\n".join(out) + "\n"

    (dest / "chat").mkdir(parents=True, exist_ok=True)
    (dest / "chat" / "train.jsonl").write_text(chat(0, train))
    (dest / "chat" / "valid.jsonl").write_text(chat(train, valid))
    (dest / "chat" / "test.jsonl").write_text(chat(train + valid, test))
    (dest / "text").mkdir(parents=True, exist_ok=True)
    texts = "\n".join(json.dumps({"text": story_text(3, k)}) for k in range(test)) + "\n"
    for name in ("train.jsonl", "valid.jsonl", "test.jsonl"):       # mlx-lm's --test loads all three
        (dest / "text" / name).write_text(texts)
    return {"chat": dest / "chat", "text": dest / "text"}
