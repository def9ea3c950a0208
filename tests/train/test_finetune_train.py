"""Fine-tuning an mlx-lm model (`--model DIR`) in real multi-process runs on this machine: the models are small
llama and qwen3 models made with mlx-lm's own classes (tests/lmfixture.py), the data chat / text jsonl.

Tolerances: as tests/train/test_train_multiprocess.py's DP equivalence (the same mean gradient summed in
another order: measured <= 2e-7 here after 10 AdamW steps); 5e-5 catches a rank training on its own rows."""
import json
import sys

import mlx.core as mx
import pytest

pytest.importorskip("mlx_lm")

import lmfixture  # noqa: E402
from test_train_multiprocess import losses, mpirun, ring, run  # noqa: E402

STEPS = ["--batch-size", "4", "--max-seq-length", "64", "--lr", "3e-3", "--warmup", "3", "--report-every", "1",
         "--eval-every", "0", "--ckpt-every", "0"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return lmfixture.make_inputs(tmp_path_factory.mktemp("ft"))


def finetune(inputs, model, data, *args):
    return [sys.executable, "-m", "clusterctl.train", "--model", str(inputs[model]), "--data", str(inputs[data]),
            *STEPS, *args]


def params(run_dir):
    from clusterctl.train.export import full_parameters
    from clusterctl.train.stepdirs import read_state, resolve
    ckpt = resolve(str(run_dir), None)
    return full_parameters(ckpt, read_state(ckpt))         # in the format of the strategy that wrote it


def max_diff(a, b):
    assert set(a) == set(b)
    return max(mx.abs(a[k] - b[k]).max().item() for k in a)


@pytest.fixture(scope="module")
def one_rank_accum_2(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    run(finetune(inputs, "llama", "chat", "--steps", "10", "--accum", "2", "--out", str(out)))
    return out


@pytest.mark.parametrize("strategy, launcher", [("dp", "mpi"), ("zero3", "ring")])
def test_two_ranks_train_what_one_rank_with_accum_2_does(inputs, one_rank_accum_2, strategy, launcher, tmp_path):
    out = tmp_path / "run"
    # the global batch of 8 records, 4 a rank: what one rank takes in its two micro-batches of 4
    program = finetune(inputs, "llama", "chat", "--steps", "10", "--strategy", strategy, "--batch-size", "8", "--out",
                       str(out))
    run(mpirun(2) + program if launcher == "mpi" else ring(program, tmp_path), world=2)
    assert max_diff(params(out), params(one_rank_accum_2)) < 5e-5
    ref, got = losses(one_rank_accum_2), losses(out)
    assert ref.keys() == got.keys()
    for step in ref:
        assert got[step][0] == pytest.approx(ref[step][0], rel=1e-5), step


def test_thirty_steps_lower_the_loss_and_the_result_generates_in_mlx_lm(inputs, tmp_path):
    from mlx_lm import generate, load

    out = tmp_path / "run"
    r = run(finetune(inputs, "qwen3", "text", "--steps", "30", "--out", str(out)))
    curve = losses(out)
    assert curve[30][0] < 0.6 * curve[1][0], curve
    assert "held out: 6 records (every 20th record of train.jsonl)" in r.stdout
    model_dir = out / "model"
    assert f"model: {model_dir} (an mlx-lm model directory" in r.stdout
    # and the marker that lets a later export (or fine-tune) to the same place replace what this one wrote
    assert sorted(p.name for p in model_dir.iterdir()) == [".clusterctl-export.json", "config.json",
                                                          "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    model, tokenizer = load(str(model_dir))
    text = generate(model, tokenizer, "Tom found", max_tokens=12)
    assert len(tokenizer.encode(text)) >= 4, text
    from clusterctl.train.lm import weights_dtype
    assert weights_dtype(str(model_dir)) == "float32" and weights_dtype(str(inputs["llama"])) == "bfloat16"


def test_a_bfloat16_model_is_trained_in_float32_and_written_back_in_bfloat16(inputs, one_rank_accum_2):
    from clusterctl.train.lm import weights_dtype

    assert weights_dtype(str(one_rank_accum_2 / "model")) == "bfloat16"
    trained = params(one_rank_accum_2)
    assert {v.dtype for v in trained.values()} == {mx.float32}
    exported = mx.load(str(one_rank_accum_2 / "model" / "model.safetensors"))
    assert max_diff({k: v.astype(mx.float32) for k, v in exported.items()}, trained) < 2e-2


def test_zero3_resumes_exactly_and_on_another_world_size(inputs, tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    args = ["--strategy", "zero3", "--ckpt-every", "3"]
    run(mpirun(2) + finetune(inputs, "qwen3", "chat", "--steps", "6", *args, "--out", str(whole)), world=2)
    run(mpirun(2) + finetune(inputs, "qwen3", "chat", "--steps", "3", *args, "--out", str(part)), world=2)
    run(mpirun(2) + finetune(inputs, "qwen3", "chat", "--steps", "6", *args, "--resume", "latest", "--out", str(part)),
        world=2)
    assert losses(part) == losses(whole)
    assert max_diff(params(part), params(whole)) == 0.0
    state = json.loads((part / "checkpoints" / "step-000006" / "state.json").read_text())
    assert state["model"] == {"mlx_lm": str(inputs["qwen3"])} and state["tokenizer"]["type"] == "mlx-lm"
    # the 2-rank checkpoint continues on one rank: the same records (the order does not depend on the world), 2
    # in each of its two micro-batches, as each rank had 2 of the global 4
    run(finetune(inputs, "qwen3", "chat", "--steps", "8", *args, "--batch-size", "2", "--accum", "2", "--resume",
                 "latest", "--out", str(part)))
    assert sorted(losses(part)) == list(range(1, 9))


def test_a_bad_record_or_a_missing_data_dir_is_one_line_before_training(inputs, tmp_path):
    import subprocess

    from test_train_multiprocess import ENV

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"text": "fine"}\n{"text": fine}\n')

    def trainer(*args):
        return subprocess.run([sys.executable, "-m", "clusterctl.train", "--model", str(inputs["llama"]), "--steps",
                               "2", "--out", str(tmp_path / "out"), *args], capture_output=True, text=True, env=ENV,
                              timeout=120)

    r = trainer("--data", str(bad))
    assert r.returncode == 2 and r.stderr.strip() == f"error: {bad}/train.jsonl:2: not JSON (Expecting value at column 10)"
    r = trainer()
    assert r.returncode == 2 and r.stderr.strip().startswith(f"error: --model {inputs['llama']} needs --data DIR")
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_export_writes_a_fine_tuned_run_again_and_generate_points_to_mlx_lm(inputs, one_rank_accum_2, tmp_path):
    import subprocess

    from test_train_multiprocess import ENV

    def clusterctl(*args):
        return subprocess.run([sys.executable, "-m", "clusterctl", *args], capture_output=True, text=True, env=ENV,
                              timeout=120, cwd=tmp_path)

    r = clusterctl("generate", "--checkpoint", str(one_rank_accum_2), "--prompt", "Tom")
    assert r.returncode == 2 and r.stderr.strip().endswith(
        f"fine-tuned the mlx-lm model {inputs['llama']}: generate with mlx-lm, mlx_lm.generate --model "
        f"{one_rank_accum_2 / 'model'} (`clusterctl export {one_rank_accum_2}` writes it if absent)"), r.stderr
    r = clusterctl("export", str(one_rank_accum_2 / "checkpoints" / "step-000010"), "-o", "again")
    assert r.returncode == 0 and r.stdout.startswith("wrote again: mlx_lm.generate --model again"), r.stderr
    again = {p.name: p.read_bytes() for p in (tmp_path / "again").iterdir()}
    first = {p.name: p.read_bytes() for p in (one_rank_accum_2 / "model").iterdir()}
    assert again == first          # the same bytes as the export at the end of the run


def test_export_replaces_only_an_earlier_export_never_the_source_the_run_or_the_current_directory(
        inputs, one_rank_accum_2, tmp_path):
    from clirun import clusterctl

    source, run_dir = inputs["llama"], one_rank_accum_2
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "config.json").write_text("{}")
    (victim / "important.py").write_text("code")
    kept = {d: {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} for d in (source, run_dir, work, victim)}
    refused = "export replaces the whole directory it writes: give a new one (or an earlier export's)"
    for dest, says in [(victim, f"{victim} holds files no export wrote (it has no .clusterctl-export.json)"),
                       (source, f"{source} is the model the run fine-tuned ({source})"),
                       (source.parent, f"{source.parent} holds the model the run fine-tuned ({source})"),
                       (run_dir, f"{run_dir} is the run ({run_dir})"),
                       (".", f". is the current directory ({work})"),
                       ("..", f".. holds the current directory ({work})")]:
        r = clusterctl("export", str(run_dir), "-o", str(dest), cwd=work)
        assert r.returncode == 2 and r.stderr.splitlines() == [f"error: {says}: {refused}"], (dest, r.stderr)
    assert {d: {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} for d in kept} == kept    # nothing touched
    marker = {"run": "run", "model": str(source), "step": 10}
    assert json.loads((run_dir / "model" / ".clusterctl-export.json").read_text()) == marker    # the trainer's own
    r = clusterctl("export", str(run_dir), "-o", "mine", cwd=work)
    assert r.returncode == 0, r.stderr
    (work / "mine" / "stale").write_text("from before")
    r = clusterctl("export", str(run_dir), "-o", "mine", cwd=work)      # over an earlier export: replaced whole
    assert r.returncode == 0, r.stderr
    assert json.loads((work / "mine" / ".clusterctl-export.json").read_text()) == marker
    assert not (work / "mine" / "stale").exists() and (work / "notes.txt").read_text() == "mine"


def test_bfloat16_weights_keep_float32_moments_and_resume_exactly(inputs, tmp_path):
    whole, part, f32 = tmp_path / "whole", tmp_path / "part", tmp_path / "f32"
    args = ["--precision", "bfloat16", "--ckpt-every", "3"]
    run(finetune(inputs, "qwen3", "chat", "--steps", "6", *args, "--out", str(whole)))
    run(finetune(inputs, "qwen3", "chat", "--steps", "3", *args, "--out", str(part)))
    run(finetune(inputs, "qwen3", "chat", "--steps", "6", *args, "--resume", "latest", "--out", str(part)))
    run(finetune(inputs, "qwen3", "chat", "--steps", "6", "--out", str(f32)))
    assert losses(part) == losses(whole)
    step = whole / "checkpoints" / "step-000006"
    assert {v.dtype for v in mx.load(str(step / "model.safetensors")).values()} == {mx.bfloat16}
    moments = mx.load(str(step / "optimizer.safetensors"))
    assert {v.dtype for k, v in moments.items() if k.endswith((".m", ".v"))} == {mx.float32}
    assert losses(whole)[6][0] == pytest.approx(losses(f32)[6][0], rel=0.02)    # bf16 rounding, not a new run


def test_records_prepared_once_train_each_rank_on_its_own_shard(inputs, tmp_path):
    import subprocess

    from test_train_multiprocess import ENV

    prep = tmp_path / "prep"
    r = subprocess.run([sys.executable, "-m", "clusterctl", "data", "prepare", str(inputs["chat"]), "--world", "2",
                        "--out", str(prep), "--tokenizer", str(inputs["qwen3"]), "--max-seq-length", "64"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0 and "120 records" in r.stdout and "in 2 shards of 60, 60 records" in r.stdout, r.stderr
    out = tmp_path / "run"
    program = [sys.executable, "-m", "clusterctl.train", "--model", str(inputs["qwen3"]), "--data", str(prep), *STEPS,
               "--steps", "30", "--strategy", "zero3", "--out", str(out)]
    r = run(mpirun(2) + program, world=2)
    assert "prepared records: 60 on rank 0 (its shard), 120 in all" in r.stdout
    curve = losses(out)
    assert curve[30][0] < 0.6 * curve[1][0]
    r = subprocess.run(program[:-2] + ["--out", str(tmp_path / "one")], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 2 and "records prepared for world size 2, this run has 1 (prepare again with --world 1)" in r.stderr
