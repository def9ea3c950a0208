"""What `clusterctl run` and the bundled trainer (clusterctl.train) agree on, in one place: the trainer
writes by it (train/), run reads by it (launch/, run/, trainer_program.py). Standard library only, as the
ranks import it.

    checkpoints/step-000120/            step_dir_name(120); checkpoint_step("step-000120") == 120
    step  40/200 | loss 3.1830 | ...    report_line(...) prints it; reported_step(line) == 40
    --data DIR                          the flag run gives the trainer first (its shards, `data prepare`)
    --strategy fsdp                     read from the user's arguments: flag_value(args, STRATEGY)
    runs/                               RUNS_DIR: where a project's runs go, under run and without it
What else run knows of the trainer (what it reads, how it resumes, what it checks) is trainer_program.py's.
"""
from __future__ import annotations

import re

STEP_GLOB = "step-*"                   # every checkpoint directory (and nothing else) matches it
CHECKPOINTS = "checkpoints"            # in a run directory: the checkpoints, on every host that writes one
# a checkpoint being written (train/checkpoint.py save): what a writer killed mid-write leaves, which the trainer
# removes at its next start and run's sweep after a failed attempt (launch/launchers.py)
CHECKPOINT_TMP_GLOB = ".step-*.tmp-*"
_STEP_DIR = re.compile(r"step-(\d+)")
_REPORT = re.compile(r"^step +(\d+)/\d+ \|")

TRAINER_MODULE = "clusterctl.train"    # the bundled trainer, as run starts it (`python -m`)
# a project's runs, relative to it: run's and serve's runs/<id>/ here (--runs-dir), the ranks' run directories
# under a host's workdir, and the trainer's own --out when run gives none (runs/train-<time>)
RUNS_DIR = "runs"
TRAINER_SUMMARY = "trainer.json"       # in the run directory: what the trainer adds to summary.json ("trainer")
DATA = "--data"
MODEL = "--model"                      # an mlx-lm model directory (or hub id) the trainer fine-tunes
# where a rank reads --model from: its host's model-store copy, which run pushed there (run/ sets it per host)
MODEL_DIR_ENV = "CLUSTERCTL_MODEL_DIR"
STRATEGY = "--strategy"
DEFAULT_STRATEGY = "dp"                # --strategy left out (train/config.py's default)
ADAPTER = "--adapter"                  # lora or dora: adapters on --model, the base frozen (train/adapters.py)
# What a run of the bundled trainer is, by the flag that makes it so: the first of these its arguments give
# decides; none of them, "train" (from scratch).
TRAINER_KINDS = ((ADAPTER, "adapters"), (MODEL, "fine-tune"))
RESUME = "--resume"                    # `latest` under run: the newest run here with a checkpoint (run/)
OUT = "--out"
HOST_MEMORY = "CLUSTERCTL_HOST_MEMORY"  # a host's memory for the trainer's memory plan, in its env ("16G")
# in a model directory a run made (the trainer's <run>/model, `clusterctl export`): JSON {"run": its run id,
# "model": the source model's path as the run recorded it, or null for a from-scratch model, "step": N};
# `serve` names the model by it (serve/check.py served_name)
EXPORT_MARKER = ".clusterctl-export.json"


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoint_step(name: str | None) -> int | None:
    """12 from 'step-000012' (checkpoints/latest names the newest, with a newline), None for anything else."""
    m = _STEP_DIR.fullmatch((name or "").strip())
    return int(m.group(1)) if m else None


def report_line(step: int, total_steps: int, *, loss: float, lr: float, tokens_per_s: float, peak_mb: float,
                grad_norm: float) -> str:
    """Rank 0's line every --report-every steps (the step right-aligned to the width of the total)."""
    return (f"step {step:>{len(str(total_steps))}}/{total_steps} | loss {loss:.4f} | lr {lr:.2e} | "
            f"{tokens_per_s:,.0f} tok/s | peak mem {peak_mb:,.1f} MB | grad norm {grad_norm:.3f}")


def reported_step(line: str) -> int | None:
    """The step of a report line, None for any other line (held-out losses, checkpoints, tracebacks)."""
    m = _REPORT.match(line)
    return int(m.group(1)) if m else None


def last_step(lines: list[str]) -> int | None:
    """The last step a rank reported, from its report lines."""
    for line in reversed(lines):
        step = reported_step(line)
        if step is not None:
            return step
    return None


def flag_value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value `args` give `flag` (`--flag V` or `--flag=V`), None when they do not; the last one wins, as
    argparse takes it."""
    value = None
    for i, word in enumerate(args):
        if word == flag and i + 1 < len(args):
            value = args[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def replace_flag(args: list[str] | tuple[str, ...], flag: str, value: str) -> list[str]:
    """`args` with every value given to `flag` (`--flag V` or `--flag=V`) replaced by `value`."""
    out, follows = [], False
    for word in args:
        if follows:
            out.append(value)
            follows = False
        elif word == flag:
            out.append(word)
            follows = True
        elif word.startswith(flag + "="):
            out.append(f"{flag}={value}")
        else:
            out.append(word)
    return out


CONFIG_FLAGS = ("--config", "-c")      # the trainer's settings file: its own names or mlx-lm's lora_config.yaml


def setting(args: list[str] | tuple[str, ...], flag: str, key: str, read_file=None) -> str | None:
    """What the trainer will take for `flag`: the flag's value, else the settings file's `key` (by the trainer's name;
    `read_file(path)` -> that file's settings, which the caller gives: this module reads no YAML). None when neither
    gives it."""
    value = flag_value(args, flag)
    if value is not None or read_file is None:
        return value
    path = next((v for v in (flag_value(args, f) for f in CONFIG_FLAGS) if v), None)
    found = read_file(path).get(key) if path else None
    return None if found is None else str(found)


def add_run_flag(args: list[str], flag: str, value: str) -> list[str]:
    """`args` (the trainer's, after its module name) with run's own `flag value` first, so that a user's own
    later one still wins."""
    return [flag, value, *args]


# An adapter run's adapters (train/adapters.py), in mlx-lm's layout: in <run>/adapters and in each checkpoint.
# adapter_config.json also records, under "base", what the trained base was (mlx-lm ignores the key), which
# `serve --adapter` compares with the model it is given (serve/adapted.py)
ADAPTER_FILE = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_BASE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")


def adapter_mismatch(adapters_config: dict, model_config: dict) -> str | None:
    """How the base the adapters were trained on differs from `model_config` (a config.json), or None (pure; none
    told: mlx-lm's own adapters say nothing of their base)."""
    base = adapters_config.get("base")
    if not isinstance(base, dict):
        return None
    m = {**(model_config.get("text_config") or {}), **model_config}
    differ = [f"{k} {base[k]} there, {m.get(k)} here" for k in ADAPTER_BASE_KEYS if k in base and m.get(k) != base[k]]
    return "; ".join(differ) or None
