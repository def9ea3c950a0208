"""`clusterctl serve BASE --adapter RUN|DIR`: adapters a run trained (`--adapter`, mlx-lm's adapter layout) served
on their base across the hosts. mlx-lm's distributed server loads no adapters, so they are fused into the base
here first, as mlx_lm.fuse does (train/export.py fuse_into), into this machine's cache,

    ~/.cache/clusterctl/fused/<key>/<BASE's name>/     key: the base's files (name, size, time) and the
                                                       adapters' bytes

and that model directory is served like any: pushed to each host's store once, content-addressed, so a second
serve of the same base and adapters fuses nothing and moves no bytes. Adapters that do not fit the base are one
line before anything moves.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from typing import Callable

from ..atomic import replace_dir, write_text
from ..errors import ModelError, UsageError
from ..trainer_contract import ADAPTER_CONFIG, ADAPTER_FILE, STEP_GLOB, adapter_mismatch, checkpoint_step

DONE = ".clusterctl-fused"                       # in a fused directory that was written whole


def adapter_dir(ref: str, runs_dir: str) -> str:
    """The directory of adapters `ref` names: one holding adapter_config.json, a run directory (its adapters/, else
    its newest checkpoint), a run by id or a prefix of one in `runs_dir`, or `latest`: the newest run there that
    holds adapters. ModelError otherwise."""
    def holds(path: str) -> bool:
        return os.path.isfile(os.path.join(path, ADAPTER_CONFIG)) and os.path.isfile(os.path.join(path, ADAPTER_FILE))

    if holds(ref):
        return os.path.abspath(ref)
    if ref == "latest":            # the newest run that trained adapters (serves are runs too)
        from ..observe.runs import list_runs

        for info in list_runs(runs_dir):
            if holds(os.path.join(info.dir, "adapters")):
                return os.path.abspath(os.path.join(info.dir, "adapters"))
        raise ModelError(f"--adapter latest: no run in {runs_dir}/ holds adapters (runs/<id>/adapters, what a run "
                         "of the bundled trainer with --adapter writes)")
    run = ref
    if not os.path.isdir(ref):
        from ..observe.runs import resolve

        try:
            run = resolve(runs_dir, ref).dir
        except UsageError as e:    # no such run, several: its one line
            raise ModelError(f"--adapter {ref}: not a directory of adapters, nor a run in {runs_dir}/ ({e})") from None
    if holds(os.path.join(run, "adapters")):
        return os.path.abspath(os.path.join(run, "adapters"))
    steps = sorted((p for p in Path(run, "checkpoints").glob(STEP_GLOB) if checkpoint_step(p.name) is not None),
                   key=lambda p: checkpoint_step(p.name))
    if steps and holds(str(steps[-1])):      # a run stopped before its end: its newest checkpoint's
        return os.path.abspath(steps[-1])
    if holds(run):                           # a checkpoint directory itself
        return os.path.abspath(run)
    raise ModelError(f"--adapter {ref}: no adapters there ({ADAPTER_CONFIG} and {ADAPTER_FILE}: what a run of the "
                     "bundled trainer with --adapter writes in runs/<id>/adapters)")


def label(adapters: str) -> str:
    """How the served id names the adapters: the run's id for a run's adapters, else their directory's name."""
    path = Path(adapters)
    if path.name == "adapters" or path.parent.name == "checkpoints":
        run = path.parent if path.name == "adapters" else path.parent.parent
        return run.name
    return path.name


def _key(base: str, adapters: str) -> str:
    digest = hashlib.sha256()
    for name in sorted(os.listdir(base)):
        st = os.stat(os.path.join(base, name))
        digest.update(f"base {name} {st.st_size} {st.st_mtime_ns}\n".encode())
    for name in (ADAPTER_CONFIG, ADAPTER_FILE):
        with open(os.path.join(adapters, name), "rb") as f:
            digest.update(f"adapters {name} ".encode() + hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:20]


def check_fits(base: str, adapters: str) -> None:
    """The adapters were trained on a model of BASE's type and shape (their adapter_config.json's "base", which
    the bundled trainer records), else one line; mlx-lm's own shape check follows when they are fused."""
    import json

    try:
        with open(os.path.join(adapters, ADAPTER_CONFIG), encoding="utf-8") as f:
            trained = json.load(f)
        with open(os.path.join(base, "config.json"), encoding="utf-8") as f:
            model_config = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelError(f"--adapter {adapters}: {ADAPTER_CONFIG} or {base}/config.json unreadable ({e})") from None
    differ = adapter_mismatch(trained, model_config) if isinstance(trained, dict) and isinstance(model_config, dict) \
        else None
    if differ:
        was = trained.get("model")
        raise ModelError(f"--adapter {adapters} was trained on another model than {base} ({differ})"
                         + (f": serve it on {was}, the model its run adapted" if isinstance(was, str) else ""))


def fused_model(base: str, adapters: str, fuse: Callable[[str, str, Path], None]) -> tuple[str, bool]:
    """(the fused model directory, whether it was in the cache already). `fuse(base, adapters, into)`: the bundled
    trainer's (train/export.py fuse_into, which the CLI gives serve: serve does not import the trainer)."""
    from ..observe.record import cache_dir

    base = os.path.abspath(base)
    check_fits(base, adapters)
    dest = os.path.join(cache_dir(), "fused", _key(base, adapters), os.path.basename(base.rstrip("/")))
    if os.path.isfile(os.path.join(dest, DONE)):
        return dest, True
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        try:
            fuse(base, adapters, Path(tmp))
        except (ValueError, KeyError) as e:
            first = " ".join(str(e).split())[:300]
            raise ModelError(f"--adapter {adapters} does not fit {base}: {first} (the adapters were trained on "
                             "another model: give the --model their run adapted)") from None
        write_text(os.path.join(tmp, DONE), f"{base}\n{adapters}\n")
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, False
