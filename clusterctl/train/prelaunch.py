"""What `clusterctl run` checks on the controller before any host starts a bundled-trainer run: the fine-tuning
inputs (`--model DIR`: an mlx-lm model directory mlx-lm can build; `--data DIR`: its jsonl records, every line)
and the memory plan (memory.py). Each failure is one line (exit 2); the ranks check again as they start.

No MLX import: the controller may plan a cluster of Macs from a machine without MLX's backend loaded."""
from __future__ import annotations

import functools
import os

from ..program import PlannedLaunch
from ..trainer_contract import HOST_MEMORY, flag_value
from . import memory


def check_before_launch(planned: PlannedLaunch) -> str | None:
    """Raises a one-line error for a --model or --data the ranks would refuse; then memory.check_before_launch
    (the strategy that fits, or None when it cannot tell), each host's memory overridden by the inventory's
    CLUSTERCTL_HOST_MEMORY. `run` calls it through trainer_program.BundledTrainer, which the CLI gives it."""
    args, project, world = list(planned.args), planned.project, planned.world
    model, adapter = flag_value(args, "--model"), flag_value(args, "--adapter")
    if adapter and not model and not flag_value(args, "--resume") and not flag_value(args, "--config"):
        from .config import ConfigError
        raise ConfigError(f"--adapter {adapter} adapts a model: give it with --model DIR (an mlx-lm model directory, "
                          "quantized or not; docs/finetune.md#lora-and-dora)")
    if model and not flag_value(args, "--resume"):
        check_finetune(_in(project, model), _in(project, flag_value(args, "--data")) if flag_value(args, "--data") else None,
                       world, adapter)
    overrides = {host: env[HOST_MEMORY] for host, env in planned.host_env.items() if env.get(HOST_MEMORY)}
    return memory.check_before_launch(args, world, dict(planned.memory), overrides, planned.first_os, project,
                                      planned.data_dir)


def _in(project: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(project, path)


def check_finetune(model_dir: str, data_dir: str | None, world: int, adapter: str | None = None) -> None:
    from ..data import records
    from .config import ConfigError
    from .lm import check_model_dir

    check_model_dir(model_dir, adapter)
    if not data_dir:
        raise ConfigError(f"--model {model_dir} needs --data DIR: a directory of train.jsonl (and valid.jsonl) records")
    prepared = records.read_prepared(data_dir)
    if prepared is not None:          # rows from `data prepare`: made for this world and this model's tokenizer?
        records.check_prepared(prepared, data_dir, world, model_dir)
        return
    if not records.is_records_dir(data_dir):
        raise ConfigError(f"--data {data_dir}: with --model, a directory holding train.jsonl (mlx-lm's layout) is needed")
    for name in (records.TRAIN, records.VALID):
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            st = os.stat(path)
            _records_ok(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _records_ok(path: str, mtime_ns: int, size: int) -> int:
    """Every line of a jsonl file parsed and checked once per version of the file (run checks twice)."""
    from ..data.records import read_records
    return len(read_records(path))
