"""Is MODEL something the hosts can serve? Told on this machine, before anything is copied or started.

    summary = check_model("models/tiny", world=2, pipeline=False)    # ServeError, one line, when not

Without mlx-lm here, the files alone are checked (config.json with a model_type, safetensors weights, a
tokenizer); with it (`pip install mlx-lm`), mlx-lm builds the model lazily (no weights are read)
and loads the weights' names and shapes, so an architecture it lacks, weights that do not fit the config, and
a model it cannot shard across `world` hosts the way asked are refused here rather than by every rank.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
from dataclasses import dataclass

from ..errors import ModelError
from ..trainer_contract import EXPORT_MARKER
from ..transfer.localmodel import check_model_dir, model_name

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")     # what a run id may be, in a served name


@dataclass(frozen=True)
class ModelSummary:
    name: str                # the id it is served under (served_name; ORG/NAME for a Hugging Face snapshot)
    kind: str                # config.json's model_type
    size: int                # bytes of weights
    deep: bool               # mlx-lm built it here (not only the files were checked)
    layers: int | None       # the transformer blocks mlx-lm's pipeline splits (None: not known)


def check_model(path: str, world: int, pipeline: bool = False) -> ModelSummary:
    shown = path
    check_model_dir(path)      # a directory with config.json and safetensors weights (what the store takes)
    config_path = os.path.join(path, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as e:
        raise ModelError(f"{config_path}: not JSON ({e})") from None
    kind = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(kind, str) or not kind:
        raise ModelError(f"{config_path}: no model_type (not an mlx-lm model's config)")
    weights = glob.glob(os.path.join(glob.escape(path), "*.safetensors"))
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ModelError(f"{shown}: no tokenizer (tokenizer.json, tokenizer.model or tokenizer_config.json)")
    deep = importlib.util.find_spec("mlx_lm") is not None
    layers = _build(path, kind, world, pipeline) if deep else config.get("num_hidden_layers")
    return ModelSummary(served_name(path), kind, sum(os.path.getsize(w) for w in weights),
                        deep, layers if isinstance(layers, int) and layers > 0 else None)


def served_name(path: str) -> str:
    """The id a model directory is served under: for a run's result (its EXPORT_MARKER, when present and valid)
    `<the source model's name>-ft-<run id>`, or `clusterctl-<run id>` for a model the run built from scratch; for any
    other directory, its name (ORG/NAME for a Hugging Face snapshot: localmodel.model_name). A marker that cannot
    be read, or holds anything else, is ignored."""
    own = model_name(path)
    try:
        with open(os.path.join(path, EXPORT_MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return own
    run = marker.get("run") if isinstance(marker, dict) else None
    source = marker.get("model") if isinstance(marker, dict) else None
    if not isinstance(run, str) or not RUN_ID.fullmatch(run):
        return own
    if source is None:
        return f"clusterctl-{run}"
    base = os.path.basename(os.path.normpath(source)) if isinstance(source, str) and source.strip() else ""
    return f"{base}-ft-{run}" if base not in ("", ".", "..", os.sep) else own


def _build(path: str, kind: str, world: int, pipeline: bool) -> int | None:
    """mlx-lm builds the model lazily and checks the weights' names and shapes against it; then, for several
    hosts, whether it has the parallelism asked for (the rank's sharded_load asks the same). The number of
    transformer blocks (what a pipeline splits), when it has them."""
    from pathlib import Path

    from mlx_lm.utils import load_model

    try:
        model, _ = load_model(Path(path), lazy=True, strict=True)
    except (ValueError, KeyError, TypeError, ImportError, OSError) as e:
        raise ModelError(f"{path}: mlx-lm cannot load this {kind} model: {_first_line(e)}") from None
    blocks = getattr(getattr(model, "model", None), "layers", None)
    layers = len(blocks) if isinstance(blocks, list) else None
    if world <= 1:
        return layers
    has_pipeline = hasattr(model, "model") and hasattr(model.model, "pipeline")
    if pipeline and not has_pipeline:
        raise ModelError(f"{path}: mlx-lm has no pipeline parallelism for {kind}: leave out --pipeline"
                        + (" (it has tensor parallelism)" if hasattr(model, "shard") else ""))
    if not pipeline and not hasattr(model, "shard"):
        hint = "; try --pipeline" if has_pipeline else "; serve it on one host"
        raise ModelError(f"{path}: mlx-lm cannot split {kind} across {world} hosts by tensor parallelism{hint}")
    if pipeline and not os.path.isfile(os.path.join(path, "model.safetensors.index.json")):
        raise ModelError(f"{path}: --pipeline needs model.safetensors.index.json (mlx-lm reads which weights each "
                        "stage needs from it; mlx_lm.convert writes it)")
    if pipeline and layers is not None and layers < world:
        raise ModelError(f"{path}: {layers} blocks cannot be split into {world} pipeline stages: serve it on at most "
                         f"{layers} hosts")
    return layers


def stage_files(path: str, world: int, layers: int) -> list[list[str]]:
    """Rank by rank, the weight files of `path` that rank reads under mlx-lm's pipeline parallelism (pure but for
    reading the index): the files holding a block of its stage, and those holding weights of no block (the
    embedding, the final norm, the head), as mlx-lm's sharded_load picks them. The stages split the blocks
    evenly, the low ranks taking one more when they do not divide, rank 0 the last blocks
    (docs/facts/mlx-lm.md#distributed-serving)."""
    with open(os.path.join(path, "model.safetensors.index.json"), encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    base, extra = divmod(layers, world)
    split = [base + (1 if r < extra else 0) for r in range(world)]
    out = []
    for rank in range(world):
        start = sum(split[rank + 1:])
        end = start + split[rank]
        files = set()
        for key, name in weight_map.items():
            block = re.search(r"(?:^|\.)layers\.(\d+)\.", key)
            if block is None or start <= int(block.group(1)) < end:
                files.add(name)
        out.append(sorted(files))
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return re.sub(r"\s+", " ", text.splitlines()[0])[:300]
