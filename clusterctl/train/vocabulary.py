"""mlx-lm's vocabulary for the trainer's settings: the keys of `mlx_lm.lora`'s config file (its CONFIG_DEFAULTS) and
its flag names, translated into TrainConfig's fields, so an mlx-lm user brings `-c lora_config.yaml` and their flags
unchanged (docs/from-mlx-lm.md maps each one, and says what differs).

    ours, counted = translate({"iters": 600, "learning_rate": 1e-5, "lora_parameters": {"rank": 8}}, "cfg.yaml")
    # ours == {"steps": 600, "lr": 1e-5, "lora_rank": 8}; counted == {"steps"}: given in iterations

mlx-lm counts `iters`, `steps_per_report`, `steps_per_eval` and `save_every` in iterations, which are micro-batches:
with `grad_accumulation_steps` 4 it takes one optimizer step every 4 of them. Ours count optimizer steps, so a value
given under one of those names is divided by --accum once the settings are merged (`counted` names them).

A key mlx-lm has and the trainer does not support is refused by name, with why (UNSUPPORTED); a key neither knows is
refused as unknown by config.from_mapping. Standard library only.
"""
from __future__ import annotations

from ..errors import ConfigError

# mlx-lm's name -> our field, for the keys whose value means the same thing
SAME = {
    "model": "model", "data": "data", "seed": "seed", "optimizer": "optimizer", "optimizer_config": "optimizer_config",
    "num_layers": "lora_layers", "batch_size": "batch_size", "val_batches": "eval_batches",
    "learning_rate": "lr", "resume_adapter_file": "resume_adapter_file", "adapter_path": "adapter_path",
    "test_batches": "test_batches", "max_seq_length": "max_seq_length", "grad_accumulation_steps": "accum",
    "clear_cache_threshold": "clear_cache_threshold", "lr_schedule": "lr_schedule",
}
# counted in iterations (micro-batches) by mlx-lm, in optimizer steps by us
ITERATIONS = {"iters": "steps", "steps_per_report": "report_every", "steps_per_eval": "eval_every",
              "save_every": "ckpt_every"}
# true/false there, on/off here
SWITCHES = {"train": "train", "test": "test", "grad_checkpoint": "grad_checkpoint", "mask_prompt": "mask_prompt",
            "trust_remote_code": "trust_remote_code"}
LORA_PARAMETERS = {"rank": "lora_rank", "scale": "lora_scale", "dropout": "lora_dropout", "keys": "lora_keys"}
FINE_TUNE_TYPES = {"lora": "lora", "dora": "dora", "full": None}
# mlx-lm's keys the trainer refuses when they ask for something (a null or false value is accepted: it asks nothing)
UNSUPPORTED = {
    "report_to": "clusterctl keeps every metric in the run directory (runs, logs, plot, dashboard); it does not "
                 "send them to wandb or swanlab",
    "project_name": "it names a wandb or swanlab project, which clusterctl does not report to",
}
# every key of mlx_lm.lora's CONFIG_DEFAULTS (mlx-lm 0.32.2), which docs/from-mlx-lm.md must each name
MLX_LM_KEYS = ("model", "train", "fine_tune_type", "optimizer", "optimizer_config", "data", "seed", "num_layers",
               "batch_size", "iters", "val_batches", "learning_rate", "steps_per_report", "steps_per_eval",
               "resume_adapter_file", "adapter_path", "save_every", "test", "test_batches", "max_seq_length", "config",
               "grad_checkpoint", "grad_accumulation_steps", "clear_cache_threshold", "lr_schedule", "lora_parameters",
               "mask_prompt", "report_to", "project_name", "trust_remote_code")


def speaks_mlx_lm(values: dict) -> bool:
    """Whether settings use a name that is mlx-lm's and not ours (iters, learning_rate, lora_parameters, ...):
    such settings get mlx-lm's defaults for what they leave out (presets.MLX_LM_DEFAULTS)."""
    return any(k in ITERATIONS or k in ("fine_tune_type", "lora_parameters") or k in SAME and SAME[k] != k
               for k, v in values.items() if v is not None)


def is_mlx_lm_key(key: str) -> bool:
    return key in SAME or key in ITERATIONS or key in SWITCHES or key in UNSUPPORTED or key in (
        "fine_tune_type", "lora_parameters", "config")


def _switch(value, key: str, where: str) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):        # ours: on, off (and --test's auto), checked with the field's choices
        return value
    raise ConfigError(f"{where}: {key} must be true or false, not {value!r}")


def translate(values: dict, where: str) -> tuple[dict, set[str]]:
    """mlx-lm's keys in `values` as our fields (ours pass through as they are): (the mapping, the fields given in
    iterations). `where` names the file (or "the flags") in the one-line refusals."""
    out, counted = {}, set()
    for key, value in values.items():
        if key == "config":           # the file itself, or the flag that named it: nothing to set
            continue
        if value is None and is_mlx_lm_key(key):      # mlx-lm's null: "not set", its default applies
            continue
        if key in SAME:
            out[SAME[key]] = value
        elif key in ITERATIONS:
            out[ITERATIONS[key]] = value
            if value is not None:
                counted.add(ITERATIONS[key])
        elif key in SWITCHES:
            if value is not None:
                out[SWITCHES[key]] = _switch(value, key, where)
        elif key == "fine_tune_type":
            if value not in FINE_TUNE_TYPES:
                raise ConfigError(f"{where}: fine_tune_type must be lora, dora or full, not {value!r}")
            out["adapter"] = FINE_TUNE_TYPES[value]
        elif key == "lora_parameters":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: lora_parameters must be a mapping of rank, scale, dropout and keys")
            for name, v in value.items():
                if name not in LORA_PARAMETERS:
                    raise ConfigError(f"{where}: lora_parameters.{name} is not one of rank, scale, dropout, keys"
                                      + (" (mlx-lm's LoRA takes scale, not alpha)" if name == "alpha" else ""))
                if name == "keys" and isinstance(v, list):
                    v = ",".join(str(k) for k in v)
                out[LORA_PARAMETERS[name]] = v
        elif key in UNSUPPORTED:
            if value not in (None, False, "", "none"):
                raise ConfigError(f"{where}: {key}: {UNSUPPORTED[key]} (docs/from-mlx-lm.md)")
        else:
            out[key] = value
    return out, counted
