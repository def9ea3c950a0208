"""What `clusterctl run` checks on the controller before any host starts a bundled-trainer run: the fine-tuning
inputs (`--model DIR`: an mlx-lm model directory mlx-lm can build; `--data DIR`: its jsonl records, every line)
and the memory plan (plan_before_launch: strategies.choose on memory.py's shapes). Each failure is one line
(exit 2); the ranks check again as they start.

No MLX import: the controller may plan a cluster of Macs from a machine without MLX's backend loaded."""
from __future__ import annotations

import functools
import os

from ..program import PlannedLaunch
from ..trainer_contract import CONFIG_FLAGS, HOST_MEMORY, flag_value, setting
from . import strategies
from .memory import EXCHANGED, Shape, in_exchanged_units, parse_size


def check_before_launch(planned: PlannedLaunch) -> str | None:
    """Raises a one-line error for a --model or --data the ranks would refuse; then plan_before_launch
    (the strategy that fits, or None when it cannot tell), each host's memory overridden by the inventory's
    CLUSTERCTL_HOST_MEMORY. `run` calls it through trainer_program.BundledTrainer, which the CLI gives it."""
    from .config import file_settings

    args, project, world = list(planned.args), planned.project, planned.world
    config_file = next((v for v in (flag_value(args, f) for f in CONFIG_FLAGS) if v), None)
    read = (lambda path: file_settings(_in(project, path))) if config_file else None
    model, adapter = setting(args, "--model", "model", read), setting(args, "--adapter", "adapter", read)
    data = setting(args, "--data", "data", read)
    if flag_value(args, "--fine-tune-type") in ("lora", "dora"):          # mlx-lm's name for --adapter
        adapter = flag_value(args, "--fine-tune-type")
    if adapter and not model and not flag_value(args, "--resume"):
        from .config import ConfigError
        raise ConfigError(f"--adapter {adapter} adapts a model: give it with --model DIR (an mlx-lm model directory, "
                          "quantized or not, or a Hugging Face id; docs/finetune.md#lora-and-dora)")
    if model and not flag_value(args, "--resume"):
        scored_only = "--test" in args and "--train" not in args           # mlx-lm's rule: --test alone scores
        check_finetune(_in(project, model), _in(project, data) if data else None, world, adapter, scored_only)
        if not config_file:
            _check_shares(args, world, planned.first_os)
    overrides = {host: env[HOST_MEMORY] for host, env in planned.host_env.items() if env.get(HOST_MEMORY)}
    return plan_before_launch(args, world, dict(planned.memory), overrides, planned.first_os, project,
                                      planned.data_dir)


def _check_shares(args: list[str], world: int, first_os: str | None) -> None:
    """A fine-tune's --batch-size is the global batch (mlx-lm's): the ranks refuse one `world` does not divide, so
    refused here first, in their words (train/finetune.py, data/records.py)."""
    from .config import ConfigError, resolve

    try:
        config, _ = resolve(list(args), device="gpu" if first_os == "Darwin" else "cpu")
    except (ConfigError, SystemExit):
        return          # the ranks say what is wrong with the arguments, as they would without this check
    if config.batch_size % world:
        raise ConfigError(f"--batch-size {config.batch_size} is the global batch (records a step, as mlx-lm's), "
                          f"which {world} ranks cannot share equally: give a multiple of {world}")


def _in(project: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(project, path)


def check_finetune(model_dir: str, data_dir: str | None, world: int, adapter: str | None = None,
                   scored_only: bool = False) -> None:
    from ..data import records
    from .config import ConfigError
    from .lm import check_model_dir

    check_model_dir(model_dir, adapter, scored_only)
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


def plan_before_launch(args: list[str], world: int, memory: dict[str, int], overrides: dict[str, str],
                       first_os: str | None, project: str, data_dir: str | None = None) -> str | None:
    """`clusterctl run`'s early refusal, on the controller before any rank starts: the bundled trainer's
    `args` resolved as rank 0 will resolve them (its preset by rank 0's host: a Mac's GPU or a CPU), against
    the smallest host's memory as the pre-flight probed it (`memory`, host -> bytes) or as the inventory's
    env overrides it (`overrides`, host -> CLUSTERCTL_HOST_MEMORY). Raises MemoryRefused; returns the
    strategy that fits, or None when it cannot tell (resuming: the checkpoint holds the settings; a flag
    the trainer will refuse itself; an unknown vocabulary or host). The ranks check again as they start."""
    from ..trainer_contract import flag_value
    from .config import ConfigError, resolve

    if flag_value(args, "--resume") or any(flag_value(args, f) for f in CONFIG_FLAGS):
        return None
    try:
        config, _ = resolve(list(args), device="gpu" if first_os == "Darwin" else "cpu")
    except (ConfigError, SystemExit):
        return None
    if config.memory_check == "off":
        return None
    sizes = dict(memory)
    for host, text in overrides.items():
        try:
            sizes[host] = parse_size(text)
        except ValueError:
            return None
    if config.model:             # an mlx-lm model's own shape (prelaunch.py has checked the directory)
        from .lm import read_config, vocab_size

        model_dir = _in(project, config.model)
        model_config = read_config(model_dir)
        width = _widest_row(model_dir, _in(project, config.data), config) if config.data else None
        if width is None:
            return None
        shape = Shape.of(config, vocab_size(model_config), model_config, (max(config.batch_size // world, 1), width))
    else:
        vocab = _vocab(config, project, data_dir)
        shape = Shape.of(config, vocab) if vocab is not None else None
    if not sizes or shape is None:
        return None
    smallest = in_exchanged_units(min(sizes.values())) * EXCHANGED      # as the ranks will see it
    return strategies.choose(shape, config.strategy, world, smallest)


def _widest_row(model_dir: str, data_dir: str, config) -> int | None:
    """The widest row a micro-batch of the run can need: its longest record (tokenized here with the model's
    tokenizer, as the ranks will), rounded up as rows are; prepared records: their --max-seq-length. None when it
    cannot tell."""
    from ..data import records
    from ..errors import ClusterctlError

    try:
        prepared = records.read_prepared(data_dir)
        if prepared is not None:
            longest = prepared["max_seq_length"]
        else:
            paths = [os.path.join(data_dir, n) for n in (records.TRAIN, records.VALID, records.TEST)]
            stamps = tuple((p, os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in paths if os.path.isfile(p))
            longest = min(_longest_record(model_dir, stamps, config.mask_prompt == "on"), config.max_seq_length)
    except (ClusterctlError, OSError, ValueError, KeyError):
        return None
    return records.round_up(longest)


@functools.lru_cache(maxsize=4)
def _longest_record(model_dir: str, files: tuple, mask: bool) -> int:
    from ..data import records
    from .lm import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    return max(len(records.tokenize(r, tokenizer, mask)[0]) for path, _, _ in files for r in records.read_records(path))


def _vocab(config, project: str, data_dir: str | None) -> int | None:
    from ..data.shards import read_manifest
    from ..data.tokenizer import load_tokenizer
    from ..errors import ClusterctlError

    try:
        if data_dir or config.data:
            path = data_dir or os.path.join(project, config.data)
            return read_manifest(path).vocab_size
        spec = config.tokenizer
        if spec and spec != "byte" and not os.path.isabs(spec):
            spec = os.path.join(project, spec)
        return load_tokenizer(spec).vocab_size
    except (ClusterctlError, OSError, ValueError):
        return None
