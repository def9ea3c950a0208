"""Adapters (`--adapter lora|dora` with `--model DIR`) on quantized and float bases, in real runs on this machine:
small llama and qwen3 models made with mlx-lm's classes and quantized to 4 bits by mlx-lm's own convert
(tests/lmfixture.py), chat / text records. The base stays frozen; the adapters train, checkpoint, resume and
come out in mlx-lm's adapter layout, which mlx-lm loads; export fuses them as mlx_lm.fuse does.

Tolerances as tests/train/test_finetune_train.py's: 2 ranks against 1 rank with --accum 2 is the same mean
gradient summed in another order."""
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

pytest.importorskip("mlx_lm")

import lmfixture  # noqa: E402
from test_train_multiprocess import ENV, losses, mpirun, ring, run  # noqa: E402

STEPS = ["--batch-size", "4", "--max-seq-length", "64", "--lr", "1e-2", "--warmup", "3", "--report-every", "1",
         "--eval-every", "0", "--ckpt-every", "0"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    llama = lmfixture.make_model(root / "llama", "llama")
    qwen3 = lmfixture.make_model(root / "qwen3", "qwen3", tied=True)
    chat = lmfixture.make_data(root / "chat", "chat")
    # a test set, scored at the end as mlx_lm lora --test scores it: 13 records, an odd number of rows
    test = lmfixture.make_data(root / "chat-test", "chat", records=130, valid=True, seed=7)
    (chat / "test.jsonl").write_text((test / "valid.jsonl").read_text())
    return {"llama": llama, "llama-4bit": lmfixture.quantize(llama, root / "llama-4bit", bits=4, group_size=32),
            "qwen3-4bit": lmfixture.quantize(qwen3, root / "qwen3-4bit", bits=4, group_size=32),
            "chat": chat, "text": lmfixture.make_data(root / "text", "text", valid=False)}


def adapt(inputs, model, data, *args):
    return [sys.executable, "-m", "clusterctl.train", "--model", str(inputs[model]), "--data", str(inputs[data]),
            *STEPS, *args]


def adapter_weights(path):
    return dict(mx.load(str(path / "adapters.safetensors")))


def max_diff(a, b):
    assert set(a) == set(b)
    return max(mx.abs(a[k] - b[k]).max().item() for k in a)


def digest(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def test_thirty_lora_steps_on_a_4bit_qwen3_lower_the_loss_and_mlx_lm_takes_the_adapters(inputs, tmp_path):
    from mlx_lm import generate, load

    base = digest(inputs["qwen3-4bit"])
    out = tmp_path / "run"
    r = run(adapt(inputs, "qwen3-4bit", "text", "--adapter", "lora", "--steps", "30", "--out", str(out)))
    curve = losses(out)
    assert curve[30][0] < 0.7 * curve[1][0], curve
    assert "lora adapters of rank 8" in r.stdout and "the base frozen (4-bit affine, groups of 32)" in r.stdout
    adapters = out / "adapters"
    assert f"adapters: {adapters} (mlx-lm's adapter layout" in r.stdout
    assert sorted(p.name for p in adapters.iterdir()) == ["adapter_config.json", "adapters.safetensors"]
    config = json.loads((adapters / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "lora" and config["num_layers"] == 2
    assert config["lora_parameters"] == {"rank": 8, "scale": 20.0, "dropout": 0.0}
    # only the adapters were trained and written: the checkpoint holds no base, the base directory is as it was
    weights = adapter_weights(adapters)
    assert weights and all(k.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for k in weights)
    step = out / "checkpoints" / "step-000030"
    assert not (step / "model.safetensors").exists() and (step / "adapters.safetensors").is_file()
    assert digest(inputs["qwen3-4bit"]) == base
    model, tokenizer = load(str(inputs["qwen3-4bit"]), adapter_path=str(adapters))
    plain, _ = load(str(inputs["qwen3-4bit"]))
    ids = mx.array([tokenizer.encode("Tom found a red")])
    assert mx.abs(model(ids) - plain(ids)).max().item() > 1e-3       # the adapters change what the model says
    assert len(tokenizer.encode(generate(model, tokenizer, "Tom found", max_tokens=8))) >= 2


@pytest.fixture(scope="module")
def one_rank_accum_2(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    run(adapt(inputs, "llama-4bit", "chat", "--adapter", "lora", "--steps", "8", "--accum", "2", "--out", str(out)))
    return out


# each strategy on one launcher (each on both would cost the suite half a minute more)
@pytest.mark.parametrize("strategy, launcher", [("dp", "mpi"), ("fsdp", "ring"), ("zero3", "ring")])
def test_two_ranks_train_the_adapters_one_rank_with_accum_2_does(inputs, one_rank_accum_2, strategy, launcher,
                                                                   tmp_path):
    out = tmp_path / "run"
    # the global batch of 8 records, 4 a rank: what one rank takes in its two micro-batches of 4
    program = adapt(inputs, "llama-4bit", "chat", "--adapter", "lora", "--steps", "8", "--strategy", strategy,
                    "--batch-size", "8", "--out", str(out))
    run(mpirun(2) + program if launcher == "mpi" else ring(program, tmp_path), world=2)
    assert max_diff(adapter_weights(out / "adapters"), adapter_weights(one_rank_accum_2 / "adapters")) < 5e-5
    ref, got = losses(one_rank_accum_2), losses(out)
    assert ref.keys() == got.keys()
    for step in ref:
        assert got[step][0] == pytest.approx(ref[step][0], rel=1e-5), step


def test_zero3_gathers_a_frozen_unit_as_one_vector_of_bytes_and_steps_the_adapters_as_dp(inputs):
    """One process: an adapter run's frozen 4-bit base under zero3 is stored as one vector of bytes per unit (the
    layers' uint32 packed weights, their float scales and biases and the norms together: one all_gather moves a
    unit), or per span of units (at most an eighth of the base by default: a unit each, on a base this small);
    either way 3 steps with dropout give dp's losses and adapters, and the spans change nothing but the gathers
    (the same losses to the bit as a gather per unit)."""
    from mlx.utils import tree_flatten

    from clusterctl.train import adapters, lm, memory, strategies
    from clusterctl.train.config import TrainConfig
    from clusterctl.train.step import make_optimizer
    from clusterctl.train.zero3 import ShardedModel

    config = TrainConfig(model=str(inputs["llama-4bit"]), adapter="lora", lora_layers=-1, lr=1e-2, warmup=0,
                         lora_dropout=0.1)
    tokens = mx.random.randint(0, 200, (3, 2, 17), key=mx.random.key(1))
    group = mx.distributed.init(backend="ring")       # a world of one without MPI (tests/conftest.py)

    def train(strategy, **wrap):
        model, _, _ = lm.load(config.model, mx.float32, "lora")
        mx.random.seed(0)
        adapters.apply(model, config)
        model.train()                                 # the adapters' dropout on, as fit turns it on
        if strategy == "zero3":
            model = ShardedModel(model, group, dropout=True, **wrap)
        step = strategies.get(strategy).make_step(model, make_optimizer(config), config, group)
        mx.random.seed(5)
        curve = [step(t[None, :, :-1], t[None, :, 1:])[0].item() for t in tokens]
        trained = strategies.get(strategy).trained(model).trainable_parameters()
        return curve, dict(tree_flatten(trained)), model

    dp, dp_adapters, whole = train("dp")
    unit, unit_adapters, per_unit = train("zero3", span=0)
    # the banner's count is the whole model's under zero3 too (mlx-lm's: packed weights as the values they hold)
    packed = sum(math.prod(shape) for shape in per_unit.shapes.values())
    assert per_unit.num_parameters() == lm.total_parameters(whole) > 2 * packed
    spans, _, spanned = train("zero3", span=memory.ZERO3_SPAN)
    _, _, default = train("zero3")
    units = [u for u in per_unit.units if any(k in per_unit.group_of for k in u.keys)]
    assert [g.name for g in per_unit.groups] == [u.name for u in units]          # a group, so a gather, a unit
    kinds = {str(k) for g in per_unit.groups for k in g.kinds}
    assert all(g.dtype == mx.uint8 for g in per_unit.groups) and {"mlx.core.uint32", "mlx.core.float32"} <= kinds
    assert len(spanned.groups) < len(per_unit.groups)                            # the small base: spans of units
    # by default a span holds at most an eighth of the base: on a base this small, a unit
    assert len(default.groups) == len(per_unit.groups)
    assert spans == unit
    assert unit == pytest.approx(dp, rel=1e-5)
    assert max_diff(unit_adapters, dp_adapters) < 1e-5


def test_a_test_set_is_scored_once_at_the_end_whatever_the_number_of_ranks(inputs, one_rank_accum_2, tmp_path):
    """test.jsonl beside the data: the mean loss over its trained targets and the perplexity, in the output,
    metrics.jsonl and trainer.json; two ranks (each scoring its share, one all_sum) give what one rank gives for
    the same adapters. A full fine-tune under zero3 scores it too (every rank the same number of gathers)."""
    import math

    from clusterctl.observe.runs import run_info

    ref = json.loads((one_rank_accum_2 / "trainer.json").read_text())["test"]
    assert ref["records"] == 13 and ref["targets"] > 0 and ref["perplexity"] == pytest.approx(math.exp(ref["loss"]))
    out = tmp_path / "run"
    r = run(mpirun(2) + adapt(inputs, "llama-4bit", "chat", "--adapter", "lora", "--steps", "8", "--batch-size", "8",
                              "--out", str(out)), world=2)
    got = json.loads((out / "trainer.json").read_text())["test"]
    assert f"test: loss {got['loss']:.4f}, perplexity {got['perplexity']:.3f} over 13 records of test.jsonl" in r.stdout
    assert (got["records"], got["targets"]) == (ref["records"], ref["targets"])
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-4)
    info = run_info(str(out))
    assert (info.test_loss, info.test_perplexity) == (got["loss"], got["perplexity"])
    zero3 = tmp_path / "zero3"
    r = run(ring(adapt(inputs, "llama", "chat", "--steps", "2", "--strategy", "zero3", "--out", str(zero3)), tmp_path),
            world=2)
    assert "test: loss " in r.stdout and json.loads((zero3 / "trainer.json").read_text())["test"]["records"] == 13


def test_a_killed_rank_restarts_and_the_adapters_resume_exactly_and_on_another_world_size(inputs, tmp_path):
    """DoRA with dropout on a 4-bit qwen3 under zero3, 2 ranks over ring through `clusterctl run --max-restarts 1`:
    one rank is killed with kill -9 after a checkpoint; run restarts the job, which resumes from its newest
    checkpoint (the adapters, their AdamW state, the data position, every rank's random state: the dropout masks),
    and the curve is the uninterrupted run's to the bit. The finished run then continues on 1 rank (the frozen
    base re-sharded as it loads, the adapters whole)."""
    import glob
    import os
    import signal
    import time

    from test_train_multiprocess import rank_processes

    steps = 30
    common = ["--adapter", "dora", "--lora-dropout", "0.1", "--accum", "2", "--strategy", "zero3", "--ckpt-every", "5"]
    program = adapt(inputs, "qwen3-4bit", "text", *common, "--steps", str(steps))
    whole = tmp_path / "whole"
    run(ring(program + ["--out", str(whole)], tmp_path), world=2)

    launcher = ring(program, tmp_path)
    launcher[launcher.index("--"):launcher.index("--")] = ["--max-restarts", "1", "--restart-delay", "0"]
    before = set(glob.glob(str(tmp_path / "runs" / "*")))        # the whole run's logs
    job = subprocess.Popen(launcher, env={**ENV, "CLUSTERCTL_WORLD_SIZE": "2"}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    deadline, killed = time.monotonic() + 120, None
    try:
        while killed is None:
            assert job.poll() is None, "the run ended before a rank could be killed: " + job.stdout.read()
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            found = [d for d in glob.glob(str(tmp_path / "runs" / "*")) if d not in before]
            out = found[0] if found else None
            latest = os.path.join(out, "checkpoints", "latest") if out else None
            if latest and os.path.exists(latest) and os.path.exists(os.path.join(out, "metrics.jsonl")):
                at = int(open(latest).read().strip().split("-")[1])
                if max(losses(out), default=0) >= at + 2:
                    killed = rank_processes(job.pid)[-1]
                    os.kill(killed, signal.SIGKILL)
            time.sleep(0.02)
        output, _ = job.communicate(timeout=150)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, output[-3000:]
    assert "restart" in output.lower(), output[-3000:]
    want, got = losses(whole), losses(out)
    assert sorted(got) == list(range(1, steps + 1)) and got == want
    assert max_diff(adapter_weights(Path(out) / "adapters"), adapter_weights(whole / "adapters")) == 0.0

    more = tmp_path / "more"
    r = run(adapt(inputs, "qwen3-4bit", "text", *common, "--steps", str(steps + 5), "--out", str(more),
                  "--resume", str(whole)))
    assert f"steps {steps + 1}..{steps + 5}" in r.stdout and "written by 2 rank(s), this run has 1" in r.stdout
    assert sorted(losses(more)) == list(range(steps + 1, steps + 6))


def test_export_fuses_the_adapters_into_the_base_quantized_again_or_dequantized(inputs, one_rank_accum_2, tmp_path):
    from mlx_lm import load

    def export(*args):
        return subprocess.run([sys.executable, "-m", "clusterctl", "export", str(one_rank_accum_2), *args],
                              capture_output=True, text=True, env=ENV, timeout=120, cwd=tmp_path)

    r = export("-o", str(tmp_path / "fused"))
    assert r.returncode == 0, r.stderr
    r = export("-o", str(tmp_path / "float"), "--dequantize")
    assert r.returncode == 0, r.stderr
    fused, _ = load(str(tmp_path / "fused"))
    dense, tokenizer = load(str(tmp_path / "float"))
    adapted, _ = load(str(inputs["llama-4bit"]), adapter_path=str(one_rank_accum_2 / "adapters"))
    assert "quantization" in json.loads((tmp_path / "fused" / "config.json").read_text())
    assert "quantization" not in json.loads((tmp_path / "float" / "config.json").read_text())
    ids = mx.array([tokenizer.encode("What is the capital")])
    want = adapted(ids)
    assert mx.abs(dense(ids) - want).max().item() < 1e-3              # fused exactly, in float
    assert mx.abs(fused(ids) - want).max().item() < 0.5 * mx.abs(want).max().item()   # and quantized again
    r = subprocess.run([sys.executable, "-m", "clusterctl", "export", str(tmp_path / "nothing"), "--dequantize"],
                       capture_output=True, text=True, env=ENV, timeout=60, cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, says", [
    (["--adapter", "lora"], "--adapter lora adapts a model: give it with --model DIR"),
    (["--model", "{llama-4bit}"], "the weights are quantized (4-bit affine, groups of 32), and full fine-tuning "
                                  "updates every weight: train adapters on it with --adapter lora"),
    (["--model", "{llama}", "--adapter", "lora", "--lora-keys", "self_attn.q_proj,attn.qkv"],
     "--lora-keys: the model's blocks have no attn.qkv; their linear layers are "),
    (["--model", "{llama}", "--adapter", "lora", "--lora-layers", "5"], "--lora-layers 5: the model has 2 blocks"),
    (["--model", "{llama}", "--adapter", "lora", "--lora-rank", "9" * 400], "--lora-rank must be from 1 to 65536, not "),
    (["--model", "{llama}", "--adapter", "lora", "--lora-scale", "9" * 400], "--lora-scale must be a finite number"),
])
def test_what_cannot_be_adapted_is_one_line_exit_2_before_training(inputs, tmp_path, args, says):
    args = [a.format(**{k: str(v) for k, v in inputs.items()}) for a in args]
    r = subprocess.run([sys.executable, "-m", "clusterctl.train", "--data", str(inputs["chat"]), "--steps", "2",
                        "--out", str(tmp_path / "out"), *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()
