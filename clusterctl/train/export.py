"""A checkpoint as an mlx-lm model directory, which `mlx_lm.generate --model DIR`, `mlx_lm.server`, `mlx_lm.convert -q`
and `clusterctl serve` take as it is:

    export(checkpoint_dir, dest)      # dest/config.json, model.safetensors (or model-0000k-of-0000n + index), tokenizer

A fine-tuned model (`--model SRC`) keeps SRC's config, tokenizer and other files, and its weights go back to SRC's
dtype (they were trained in float32). A model the bundled trainer trained from scratch is a Llama in mlx-lm's
`llama` layout: its parameters renamed, a config.json written, and its tokenizer as a tokenizer.json (the byte
tokenizer as a byte-level BPE with no merges: ids 0-255 are the bytes, 256 the end of text).

The directory appears whole or not at all: it is written beside `dest` and renamed into place. It replaces only
what an earlier export wrote: every export leaves MARKER in its directory (the run, the source model, the step:
`clusterctl serve` names a fine-tune by it), and anything else in the way is refused in one line, as are the
current directory, the run, the source model and any directory holding one of them (docs/security.md#what-export-may-replace).
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

import mlx.core as mx

from ..atomic import replace_dir, write_text
from ..errors import CheckpointError, DestinationRefused
from ..trainer_contract import EXPORT_MARKER
from . import stepdirs, strategies

MAX_FILE_BYTES = 5 * 2**30          # mlx-lm's own shard size
EOS_TEXT = "<|endoftext|>"
WEIGHT_FILES = ("model*.safetensors", "model.safetensors.index.json")
MARKER = EXPORT_MARKER      # in every directory export writes: the proof that a later export may replace it

_BLOCK_NAMES = {"attention_norm": "input_layernorm", "attention.wq": "self_attn.q_proj",
                "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
                "mlp_norm": "post_attention_layernorm", "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj",
                "mlp.down": "mlp.down_proj"}


def full_parameters(ckpt: Path, state: dict) -> dict[str, mx.array]:
    """Every parameter of a checkpoint, read in the format of the strategy that wrote it (its registry entry's)."""
    return strategies.get(state["strategy"]).full_parameters(ckpt)


def llama_name(name: str) -> str:
    """The bundled Transformer's parameter name in mlx-lm's llama layout."""
    if name == "embedding.weight":
        return "model.embed_tokens.weight"
    if name == "norm.weight":
        return "model.norm.weight"
    parts = name.split(".")          # layers.<i>.<module path>.weight
    if parts[0] != "layers" or parts[-1] != "weight":
        raise CheckpointError(f"no llama name for parameter {name!r}")
    inner = ".".join(parts[2:-1])
    if inner not in _BLOCK_NAMES:
        raise CheckpointError(f"no llama name for parameter {name!r}")
    return f"model.layers.{parts[1]}.{_BLOCK_NAMES[inner]}.weight"


def llama_config(model: dict, eos_id: int) -> dict:
    """config.json for the bundled Transformer's shape (the checkpoint's state["model"])."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": model["dim"],
            "num_hidden_layers": model["n_layers"], "intermediate_size": model["mlp_dim"],
            "num_attention_heads": model["n_heads"], "num_key_value_heads": model["n_heads"],
            "rms_norm_eps": model.get("norm_eps", 1e-5), "vocab_size": model["vocab_size"],
            "rope_theta": model["rope_theta"], "rope_traditional": False,
            "max_position_embeddings": model["block_size"], "tie_word_embeddings": True,
            "attention_bias": False, "mlp_bias": False, "eos_token_id": eos_id, "torch_dtype": "float32"}


def byte_level_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value (what a ByteLevel pre-tokenizer maps byte b to)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer_json() -> dict:
    """The byte tokenizer (data/tokenizer.py ByteTokenizer) as a Hugging Face tokenizer.json."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 256, "content": EOS_TEXT, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}],
            "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {c: i for i, c in enumerate(byte_level_chars())}, "merges": []}}


def _tokenizer_config(eos: str | None, max_length: int) -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": None,
            "model_max_length": max_length, "clean_up_tokenization_spaces": False}


def _write_scratch_tokenizer(state: dict, tmp: Path) -> int:
    """The run's tokenizer into tmp; returns the EOS id."""
    spec = state["tokenizer"]
    block = state["model"]["block_size"]
    if spec.get("type", "byte") == "byte":
        write_text(str(tmp / "tokenizer.json"), json.dumps(byte_tokenizer_json(), ensure_ascii=False))
        write_text(str(tmp / "tokenizer_config.json"), json.dumps(_tokenizer_config(EOS_TEXT, block), indent=1))
        return 256
    from ..data.tokenizer import EOS_TOKENS, load_tokenizer

    tok = load_tokenizer(spec)        # checks the file is the one the run trained with (sha256)
    shutil.copyfile(tok.path, tmp / "tokenizer.json")
    eos = next((t for t in EOS_TOKENS if tok._tok.token_to_id(t) == tok.eos_id), None)
    write_text(str(tmp / "tokenizer_config.json"), json.dumps(_tokenizer_config(eos, block), indent=1))
    return tok.eos_id


def source_dir(path: str, search: list[str]) -> str:
    """The fine-tuned model's source directory: as recorded, else relative to each of `search`."""
    candidates = [path] if os.path.isabs(path) else [os.path.join(base, path) for base in search]
    for c in candidates:
        if os.path.isfile(os.path.join(c, "config.json")):
            return c
    raise CheckpointError(f"the run fine-tuned {path}, which is not here (looked in {', '.join(candidates)}): its "
                          "config and tokenizer go into the export; run from the project directory that holds it")


def write_weights(weights: dict[str, mx.array], dest: Path, dtype=None) -> list[str]:
    """weights as model.safetensors, or as files of at most MAX_FILE_BYTES with model.safetensors.index.json
    (what mlx-lm's loader reads); each file's arrays are cast and written one file at a time."""
    files, current, size = [], {}, 0
    for name in sorted(weights):
        nbytes = weights[name].size * (dtype.size if dtype is not None else weights[name].dtype.size)
        if current and size + nbytes > MAX_FILE_BYTES:
            files.append(current)
            current, size = {}, 0
        current[name] = weights[name]
        size += nbytes
    files.append(current)
    names = (["model.safetensors"] if len(files) == 1 else
             [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))])
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for name, part in zip(names, files):
        cast = {k: (v.astype(dtype) if dtype is not None and mx.issubdtype(v.dtype, mx.floating) else v)
                for k, v in part.items()}
        mx.save_safetensors(str(dest / name), cast, metadata={"format": "mlx"})
        index["metadata"]["total_size"] += sum(v.nbytes for v in cast.values())
        index["weight_map"].update({k: name for k in part})
        del cast
    if len(files) > 1:
        write_text(str(dest / "model.safetensors.index.json"), json.dumps(index, indent=1))
    return names


def export_record(ckpt: Path, state: dict) -> dict:
    """What MARKER holds: the run (its directory's name, the run id under `clusterctl run`; None for a step
    directory outside a run), the source model as the run recorded its --model (None: trained from scratch)
    and the checkpoint's step."""
    run = ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else None
    return {"run": run, "model": state["config"].get("model") or None, "step": state["step"]}


def read_marker(directory: Path) -> dict | None:
    """An earlier export's MARKER in `directory` (None: none, or not one export writes)."""
    try:
        record = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "run" in record else None


def _is_or_holds(dest: str, path: str) -> bool:
    """Whether directory `dest` is `path` or one of its ancestors, as written and with links resolved; compared
    by device and inode, so a case-insensitive file system (a Mac's) or another spelling cannot hide it."""
    try:
        target = os.stat(dest)
    except OSError:
        return False                 # not there: it holds nothing
    for start in {os.path.abspath(path), os.path.realpath(path)}:
        p = start
        while True:
            try:
                s = os.stat(p)
                if (s.st_dev, s.st_ino) == (target.st_dev, target.st_ino):
                    return True
            except OSError:
                pass
            if os.path.dirname(p) == p:
                break
            p = os.path.dirname(p)
    return False


def check_destination(dest: str, keep: dict[str, str]) -> None:
    """Refuse, in one line, a `dest` export may not replace: a symbolic link or something not a directory; one of
    `keep` (description -> a path that must survive) or a directory holding it; a directory holding anything
    without an earlier export's MARKER. Nothing is touched."""
    fix = "export replaces the whole directory it writes: give a new one (or an earlier export's)"
    if os.path.islink(dest):
        raise DestinationRefused(f"{dest} is a symbolic link: {fix}")
    for what, path in keep.items():
        if _is_or_holds(dest, path):
            same = os.path.exists(path) and os.path.samefile(dest, path)
            raise DestinationRefused(f"{dest} {'is' if same else 'holds'} {what} ({path}): {fix}")
    if not os.path.exists(dest):
        return
    if not os.path.isdir(dest):
        raise DestinationRefused(f"{dest} exists and is not a directory: {fix}")
    if any(os.scandir(dest)) and read_marker(Path(dest)) is None:
        raise DestinationRefused(f"{dest} holds files no export wrote (it has no {MARKER}): {fix}")


def export(checkpoint_dir: str, dest: str, search: list[str] | None = None, dequantize: bool = False,
           source: str | None = None) -> Path:
    """Write the checkpoint (a step directory, a run directory or its checkpoints/) to `dest` as an mlx-lm model
    directory, replacing an earlier export there (check_destination). `search`: where a fine-tuned run's
    relative --model path may be; `source`: the model's directory, when the caller knows where it reads it from (a
    rank: its host's model store). An adapter run's adapters are fused into its base, as mlx_lm.fuse does: a
    quantized base's layers quantized again, or, with `dequantize`, the whole model in the base's float dtype."""
    from .adapters import ADAPTER_FILE

    ckpt = stepdirs.resolve(checkpoint_dir, None)
    state = stepdirs.read_state(ckpt)
    adapted = (ckpt / ADAPTER_FILE).is_file()
    if dequantize and not adapted:
        raise CheckpointError(f"--dequantize is for an adapter run (--adapter), whose base may be quantized: {ckpt} "
                              "holds every weight of its model, as trained")
    model_dir = state["config"].get("model")
    src = source or (source_dir(model_dir, search or [os.getcwd()]) if model_dir else None)
    keep = {"the current directory": os.getcwd(),
            "the run": str(ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt)}
    if src:
        keep["the model the run fine-tuned"] = src
    check_destination(dest, keep)
    final = Path(os.path.abspath(dest))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        if adapted:
            _write_fused(ckpt, src, tmp, dequantize)
        else:
            _write_trained(ckpt, state, src, tmp)
        write_text(str(tmp / MARKER), json.dumps(export_record(ckpt, state), indent=1) + "\n")
        replace_dir(str(tmp), str(final))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Path(dest)


def _copy_model_files(src: str, tmp: Path) -> None:
    """The source model directory's files but its weights (config, tokenizer, chat template, README)."""
    for item in sorted(os.listdir(src)):
        path = os.path.join(src, item)
        if (os.path.isfile(path) and item != MARKER
                and not any(fnmatch.fnmatch(item, p) for p in WEIGHT_FILES)):
            shutil.copyfile(path, tmp / item)


def _write_fused(ckpt: Path, src: str | None, tmp: Path, dequantize: bool) -> None:
    if src is None:
        raise CheckpointError(f"{ckpt} holds adapters, but the run recorded no --model they adapt")
    fuse_into(src, str(ckpt), tmp, dequantize)


def fuse_into(src: str, adapters: str, tmp: Path, dequantize: bool = False) -> None:
    """The model directory `src` with the adapters of directory `adapters` (mlx-lm's layout) fused in, written
    into `tmp` (which exists): mlx-lm's own loader, adapter loader and each layer's fuse(), as mlx_lm.fuse does.
    ValueError (mlx-lm's own words) when the adapters do not fit the model."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.tuner.utils import load_adapters
    from mlx_lm.utils import dequantize_model, load_model

    from .lm import weights_dtype

    model, _ = load_model(Path(src), lazy=True)
    load_adapters(model, adapters)
    fused = [(name, m.fuse(dequantize=dequantize)) for name, m in model.named_modules() if hasattr(m, "fuse")]
    model.update_modules(tree_unflatten(fused))
    _copy_model_files(src, tmp)
    if dequantize:
        model = dequantize_model(model)
        with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
            written = json.load(f)
        for key in ("quantization", "quantization_config"):
            written.pop(key, None)
        write_text(str(tmp / "config.json"), json.dumps(written, indent=1))
    write_weights(dict(tree_flatten(model.parameters())), tmp, getattr(mx, weights_dtype(src)))


def _write_trained(ckpt: Path, state: dict, src: str | None, tmp: Path) -> None:
    """Every weight as the checkpoint holds it: a fine-tune's in its source's dtype, a scratch model as a llama."""
    params = full_parameters(ckpt, state)
    if src:
        from .lm import weights_dtype

        _copy_model_files(src, tmp)
        write_weights(params, tmp, getattr(mx, weights_dtype(src)))
    else:
        eos = _write_scratch_tokenizer(state, tmp)
        config = llama_config(state["model"], eos)
        config["torch_dtype"] = str(next(iter(params.values())).dtype).removeprefix("mlx.core.")
        write_text(str(tmp / "config.json"), json.dumps(config, indent=1))
        write_weights({llama_name(k): v for k, v in params.items()}, tmp)
