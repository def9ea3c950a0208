"""Checkpoint directories on disk: which are whole, which one a `--resume` names, the newest step, a step's state.json.

Paths and JSON only (no MLX import): `clusterctl data`, `export`, adapters.publish and the trainer all find a
checkpoint here; checkpoint.py writes them and reads their arrays.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import CheckpointError
from ..trainer_contract import STEP_GLOB, checkpoint_step

FORMAT = 1      # state.json's "format": what checkpoint.save writes and read_state accepts


def steps_in(root) -> list[Path]:
    """The whole checkpoints in a checkpoints/ directory, oldest first."""
    root = Path(root)
    return sorted(p for p in root.iterdir() if checkpoint_step(p.name) is not None) if root.is_dir() else []


def resolve(resume: str, out_dir: str | None) -> Path:
    """'latest' (in out_dir), a run directory, its checkpoints/ directory, or a step directory."""
    if resume == "latest":
        if not out_dir:
            raise CheckpointError("--resume latest needs --out DIR (or $CLUSTERCTL_RUN_DIR)")
        path = Path(out_dir)
    else:
        path = Path(resume)
    if (path / "state.json").is_file():
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    pointer = root / "latest"
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if (named / "state.json").is_file():
            return named
    complete = sorted(p for p in root.glob(STEP_GLOB) if checkpoint_step(p.name) is not None and (p / "state.json").is_file())
    if not complete:
        raise CheckpointError(f"no checkpoint in {path}")
    return complete[-1]


def newest_step(out_dir: str) -> int:
    """The step of the newest complete checkpoint in out_dir/checkpoints (0: none)."""
    root = Path(out_dir) / "checkpoints"
    steps = [step for p in root.glob(STEP_GLOB)
             if (step := checkpoint_step(p.name)) is not None and (p / "state.json").is_file()] if root.is_dir() else []
    return max(steps, default=0)


def read_state(ckpt: Path) -> dict:
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: cannot read state.json ({e})") from None
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt}: checkpoint format {state.get('format')!r}, expected {FORMAT}")
    return state
