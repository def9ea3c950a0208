"""mlx-lm's vocabulary for the trainer's settings (train/vocabulary.py, train/config.py): its config file and flag
names taken as they are, what they leave out given mlx-lm's defaults, every key of its CONFIG_DEFAULTS either
accepted or refused by name, and docs/from-mlx-lm.md naming each one."""
import os

import pytest

from clusterctl.errors import ConfigError
from clusterctl.train import presets, vocabulary
from clusterctl.train.config import resolve_settings

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "from-mlx-lm.md")


def test_every_key_of_mlx_lm_s_config_defaults_is_known_here_and_named_in_the_docs():
    mlx_lm_lora = pytest.importorskip("mlx_lm.lora")
    assert set(mlx_lm_lora.CONFIG_DEFAULTS) == set(vocabulary.MLX_LM_KEYS)      # a new mlx-lm key fails here
    doc = open(DOC, encoding="utf-8").read()
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    for key in vocabulary.MLX_LM_KEYS:
        assert vocabulary.is_mlx_lm_key(key), key
        assert any(line.startswith(f"| `{key}`") for line in rows), f"docs/from-mlx-lm.md has no row for {key}"
    for key in vocabulary.UNSUPPORTED:
        [row] = [line for line in rows if line.startswith(f"| `{key}`")]
        assert "| refused |" in row


def test_mlx_lm_s_config_defaults_file_as_it_is_is_read_and_what_it_asks_is_what_mlx_lm_does(tmp_path):
    """CONFIG_DEFAULTS itself, written as a file: every key accepted (report_to and project_name are null there)."""
    mlx_lm_lora = pytest.importorskip("mlx_lm.lora")
    import yaml

    values = dict(mlx_lm_lora.CONFIG_DEFAULTS, model=str(tmp_path / "m"), data=str(tmp_path / "d"), train=True)
    path = tmp_path / "lora_config.yaml"
    path.write_text(yaml.safe_dump(values))
    r = resolve_settings(["-c", str(path)])
    c = r.config
    assert (c.steps, c.lr, c.batch_size, c.eval_batches, c.accum, c.max_seq_length) == (1000, 1e-5, 4, 25, 1, 2048)
    assert (c.adapter, c.lora_layers, c.lora_rank, c.lora_scale, c.optimizer, c.mask_prompt) == (
        "lora", 16, 8, 20.0, "adam", "off")
    assert (c.eval_every, c.report_every, c.ckpt_every, c.adapter_path, c.lr_schedule) == (
        200, 10, 100, "adapters", "constant")
    assert r.sources["steps"] == f"config {path}"
    assert r.sources["mask_prompt"] == f"config {path}"


def test_iterations_are_micro_batches_there_and_optimizer_steps_here():
    r = resolve_settings(["--model", "/m", "--iters", "600", "--grad-accumulation-steps", "4", "--save-every", "100"])
    assert (r.config.steps, r.config.accum, r.config.ckpt_every) == (150, 4, 25)
    assert r.sources["steps"] == "flag, iterations / --accum 4"
    assert resolve_settings(["--model", "/m", "--steps", "600", "--accum", "4"]).config.steps == 600


def test_a_fine_tune_takes_mlx_lm_s_defaults_and_ours_differ_only_in_mask_prompt():
    assert {k: v for k, v in presets.FINETUNE.items() if presets.MLX_LM_DEFAULTS[k] != v} == {"mask_prompt": "on"}
    ours = resolve_settings(["--model", "/m"])
    assert (ours.config.lr, ours.config.optimizer, ours.config.bias_correction, ours.config.max_norm) == (
        1e-5, "adam", None, 0.0)
    assert ours.config.preset is None and ours.sources["lr"] == "fine-tune default"
    theirs = resolve_settings(["--model", "/m", "--learning-rate", "2e-5"])
    assert theirs.config.mask_prompt == "off" and theirs.config.lr == 2e-5
    bundled = resolve_settings([])
    assert bundled.config.preset == "tiny" and bundled.config.lr == 3e-3 and bundled.sources["lr"] == "preset tiny"


@pytest.mark.parametrize("argv, says", [
    (["--model", "/m", "--block-size", "64"], "--block-size is the bundled model's: a fine-tune (--model) packs whole "
                                              "records into rows, and --max-seq-length cuts a longer record"),
    (["--model", "/m", "--preset", "small"], "--preset small sizes the bundled model"),
    (["--model", "/m", "--report-to", "wandb"], "--report-to: clusterctl keeps every metric in the run directory"),
    (["--model", "/m", "--optimizer", "adam", "--weight-decay", "0.1"], "--weight-decay 0.1: MLX's Adam has no weight"),
    (["--model", "/m", "--lr-schedule", "{name: cosine_decay}"], "--lr-schedule as a mapping needs name"),
    (["--model", "/m", "--optimizer-config", "{adam: 3}"], "--optimizer-config must map optimizer names"),
])
def test_what_a_fine_tune_cannot_take_is_one_line(argv, says):
    with pytest.raises(ConfigError, match="^" + says.replace("(", r"\(").replace(")", r"\)")):
        resolve_settings(argv)


def test_a_config_file_s_unsupported_or_unknown_key_is_refused_by_name(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: m\nreport_to: wandb\n")
    with pytest.raises(ConfigError, match=f"^{path}: report_to: clusterctl keeps every metric"):
        resolve_settings(["-c", str(path)])
    path.write_text("model: m\nlora_parameters:\n  alpha: 16\n")
    with pytest.raises(ConfigError, match=r"lora_parameters.alpha is not one of rank, scale, dropout, keys \(mlx-lm"):
        resolve_settings(["-c", str(path)])
    path.write_text("model: m\nwarmup_steps: 3\n")
    with pytest.raises(ConfigError, match="unknown setting 'warmup_steps'"):
        resolve_settings(["-c", str(path)])
    path.write_text("model: m\nreport_to: null\nlearning_rate: 1e-4\nlr_schedule:\n  name: cosine_decay\n"
                    "  warmup: 10\n  arguments: [1e-4, 100]\n")
    c = resolve_settings(["-c", str(path)]).config
    assert c.lr == 1e-4 and c.lr_schedule == {"name": "cosine_decay", "warmup": 10, "arguments": [1e-4, 100]}


def test_mlx_lm_s_bare_switches_and_the_optimizer_s_arguments():
    c = resolve_settings(["--model", "/m", "--mask-prompt", "--grad-checkpoint", "--optimizer", "adamw",
                          "--optimizer-config", "{adamw: {weight_decay: 0.05, betas: [0.8, 0.9]}}", "--beta2",
                          "0.99"]).config
    assert (c.mask_prompt, c.grad_checkpoint) == ("on", "on")
    mx = pytest.importorskip("mlx.core")
    from clusterctl.train.step import make_optimizer, optimizer_arguments

    assert optimizer_arguments(c) == {"weight_decay": 0.05, "betas": [0.8, 0.99]}       # the flag wins
    opt = make_optimizer(c)
    assert type(opt).__name__ == "AdamW" and opt.weight_decay == 0.05 and opt.betas == [0.8, 0.99]
    adam = make_optimizer(resolve_settings(["--model", "/m"]).config)
    assert type(adam).__name__ == "Adam" and adam.bias_correction is False and adam.learning_rate.item() == pytest.approx(1e-5)
    assert mx is not None
