"""A fine-tune as good as mlx-lm's: the quality check, on a base that knows something.

The base is a small llama trained here on plain stories (tests/lmfixture.py `pretrain`; its held-out story loss is
low), quantized to 4 bits by mlx-lm's own convert for LoRA. The task is one it has never seen: a question about a
story's opening, a short chat answer (`story_tasks`). Every result, ours and `mlx_lm.lora`'s, is scored by mlx-lm's
own evaluate (tests/mlxlmscore.py), without its extra padding target (docs/from-mlx-lm.md#scores):

- answers-only loss: the chat test set with the prompt masked: what was learned;
- plain-text loss: held-out stories no run trained on: what the base knew, and a fine-tune must keep.

With our defaults, LoRA and a full fine-tune must keep the plain-text loss within 15% of the base's and reach an
answers-only loss no worse than mlx_lm.lora with its defaults at the same steps; with mlx-lm's own config file given
as -c, ours and mlx_lm.lora must end within 2% of each other (whole records and answers). The larger measurement,
with the numbers, is benchmarks/bench_lora_quality.py.
"""
import json
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mlx_lm")
pytestmark = pytest.mark.slow          # handed out first (tests/conftest.py): minutes each under the suite's load

import lmfixture  # noqa: E402
from mlxlmscore import score_many_in_process  # noqa: E402

STEPS = 40


@pytest.fixture
def lab(tmp_path, pretrained):
    """The pretrained base (4-bit and float) and the story tasks, each test its own: nothing is shared between the
    tests but the session's `pretrained`, so they run side by side on several workers (no xdist group)."""
    root = tmp_path / "quality"
    for name in ("base", "base-4bit"):
        shutil.copytree(pretrained / name, root / name)
    lmfixture.story_tasks(root)
    return root


SETS = {"answers": ("chat", True), "records": ("chat", False), "text": ("text", False)}


def scores(lab, *jobs, of=("answers", "records", "text")) -> list[dict]:
    """For each (model, adapters or None) of `jobs`, the losses named in `of` (SETS): the answers-only and
    whole-record losses on the chat test set, and the loss on held-out plain stories (mlx-lm's evaluate without its
    padding target, all the jobs in one process of their own as `mlx_lm.lora --test` runs: its evaluate initialises
    MLX's distributed group, and an MPI singleton's identity left in this worker's C environment would make every
    mpirun a later test starts here exit 1 without a word)."""
    got = score_many_in_process([(lab / model, adapter) for model, adapter in jobs],
                                [(lab / SETS[k][0], SETS[k][1]) for k in of], losses=("no_pad",))
    return [{k: s["no_pad"] for k, s in zip(of, job)} for job in got]


def mlx_lm_lora(lab, model, out, *extra):
    # its own validation cut to one batch: it runs at the first and the last iteration and trains nothing
    r = subprocess.run([sys.executable, "-m", "mlx_lm", "lora", "--model", str(lab / model), "--train", "--data",
                        str(lab / "chat"), "--adapter-path", str(out), "--val-batches", "1", *extra],
                       capture_output=True, text=True, timeout=600, cwd=lab)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


def ours(lab, out, *args):
    r = subprocess.run([sys.executable, "-m", "clusterctl.train", *args, "--out", str(out)], capture_output=True,
                       text=True, timeout=600, cwd=lab)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_lora_with_our_defaults_learns_the_answers_and_keeps_what_the_base_knew(lab):
    printed = ours(lab, lab / "ours-lora", "--model", "base-4bit", "--data", "chat", "--adapter", "lora", "--steps",
                   str(STEPS), "--test", "off")
    # every setting, and where it came from, in one block before the first step
    block = printed[printed.index("settings (each: its value, and where it came from):"):printed.index("model base-4bit")]
    assert "  lr                     1e-05  (fine-tune default)" in block
    assert "  optimizer              adam  (fine-tune default)" in block
    assert f"  steps                  {STEPS}  (flag)" in block and "  mask-prompt            on  (fine-tune default)" in block
    # mlx-lm's defaults, on a model of 2 blocks (its default of 16 layers refuses one with fewer: -1 is all of them)
    mlx_lm_lora(lab, "base-4bit", lab / "mlx-lm-lora", "--iters", str(STEPS), "--num-layers", "-1")
    # the base scored in the same process as the two results (what the comparisons need: answers and plain text)
    base, got, theirs = scores(lab, ("base-4bit", None), ("base-4bit", lab / "ours-lora" / "adapters"),
                               ("base-4bit", lab / "mlx-lm-lora"), of=("answers", "text"))
    print(json.dumps({"base": base, "ours": got, "mlx_lm": theirs}))
    assert got["text"] <= 1.15 * base["text"], (got, base)
    assert got["answers"] <= theirs["answers"], (got, theirs)
    assert got["answers"] < 0.8 * base["answers"]          # and it learned the task
    # mlx-lm's --test alone, given to ours: mlx-lm's adapters scored, nothing trained, the number mlx-lm's evaluate
    # gives them without its padding target
    printed = ours(lab, lab / "ours-scores-theirs", "--model", "base-4bit", "--data", "chat", "--test",
                   "--mask-prompt", "--adapter-path", str(lab / "mlx-lm-lora"))
    said = float(printed.split("test: loss ", 1)[1].split(",")[0])
    assert said == pytest.approx(theirs["answers"], abs=1e-3) and "step " not in printed


def test_a_full_fine_tune_with_our_defaults_learns_the_answers_and_keeps_what_the_base_knew(lab):
    ours(lab, lab / "ours-full", "--model", "base", "--data", "chat", "--steps", str(STEPS), "--test", "off")
    mlx_lm_lora(lab, "base", lab / "mlx-lm-full", "--fine-tune-type", "full", "--iters", str(STEPS), "--num-layers",
                "-1")
    base, got, theirs = scores(lab, ("base", None), ("ours-full/model", None), ("base", lab / "mlx-lm-full"),
                               of=("answers", "text"))
    print(json.dumps({"base": base, "ours": got, "mlx_lm": theirs}))
    assert got["text"] <= 1.15 * base["text"], (got, base)
    assert got["answers"] <= theirs["answers"], (got, theirs)


def test_mlx_lm_s_own_config_file_gives_what_mlx_lm_gives(lab):
    """lora_config.yaml as mlx-lm's docs write one, given unchanged to both: what it leaves out takes mlx-lm's
    defaults on both sides (mask_prompt off among them), so the two runs differ only in the order of the records."""
    config = lab / "lora_config.yaml"
    config.write_text(f"""# mlx_lm.lora's own config keys
model: "{lab / 'base-4bit'}"
train: true
fine_tune_type: lora
data: "{lab / 'chat'}"
seed: 0
num_layers: -1
batch_size: 4
iters: {STEPS}
learning_rate: 5e-5
steps_per_report: 20
steps_per_eval: 1000
val_batches: 1
lora_parameters:
  rank: 8
  scale: 20.0
  dropout: 0.0
""")
    theirs_dir = lab / "mlx-lm-config"
    r = subprocess.run([sys.executable, "-m", "mlx_lm", "lora", "-c", str(config), "--adapter-path", str(theirs_dir)],
                       capture_output=True, text=True, timeout=600, cwd=lab)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = ours(lab, lab / "ours-config", "-c", str(config))
    assert "  mask-prompt            off  (mlx-lm's default (the settings use mlx-lm's names))" in printed
    assert f"  steps                  {STEPS}  (config {config})" in printed
    got, theirs = scores(lab, ("base-4bit", lab / "ours-config" / "adapters"), ("base-4bit", theirs_dir),
                         of=("records", "answers"))
    print(json.dumps({"ours": got, "mlx_lm": theirs}))
    for key in ("records", "answers"):
        assert got[key] == pytest.approx(theirs[key], rel=0.02), (key, got, theirs)
