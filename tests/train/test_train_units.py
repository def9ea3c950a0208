"""Unit tests of the trainer's parts in one process: model, config precedence, schedule, accumulation,
checkpoints, random state, metrics, generation. Real MLX throughout, tiny models."""
import json
import math
import os
import re
import sys
from types import SimpleNamespace

import clirun
import mlx.core as mx
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten

from clusterctl.cli import cli
from clusterctl.errors import UsageError
from clusterctl.train import checkpoint, presets, stepdirs, strategies
from clusterctl.train.randomstate import random_states, restore_random_state
from clusterctl.train.config import ConfigError, TrainConfig, build_parser, parse_args, resolve
from clusterctl.train.generate import generate_text, load, sample_tokens
from clusterctl.train.metrics import Reporter
from clusterctl.train.model import ModelArgs, Transformer, count_parameters
from clusterctl.train.step import lr_schedule, make_dp_step, make_optimizer
from clusterctl.train.trainer import main

TINY = dict(n_layers=2, dim=16, n_heads=2, mlp_dim=32, block_size=8)
VOCAB = 257


def tiny(**overrides) -> TrainConfig:
    return TrainConfig(**{**TINY, "steps": 20, "warmup": 2, "batch_size": 2, **overrides})


def group():
    # A world of one without MPI: init() would try the mpi backend, and MPI's singleton start sets two dozen
    # OMPI_* / PMIX_* variables in this process's C environment, which every later mpirun that pytest starts
    # inherits (tests/ssh/test_doctor.py's then fail when they run after this file).
    return mx.distributed.init(backend="ring")


def batch(step, config, rows=None):
    t = mx.random.randint(0, VOCAB, (config.accum, rows or config.batch_size, config.block_size + 1),
                          key=mx.random.key(step))
    return t[..., :-1], t[..., 1:]


def trained(config, steps=3):
    mx.random.seed(config.seed)
    model = Transformer(ModelArgs.from_config(config, VOCAB))
    optimizer = make_optimizer(config)
    step = make_dp_step(model, optimizer, config, group())
    for s in range(steps):
        mx.eval(step(*batch(s, config)), model.state, optimizer.state)
    return model, optimizer, step


def flat(tree):
    return dict(tree_flatten(tree))


# ---- model ------------------------------------------------------------------------------------

def test_model_shapes_and_tied_embedding():
    args = ModelArgs(vocab_size=VOCAB, **TINY)
    model = Transformer(args)
    logits = model(mx.zeros((3, 8), dtype=mx.int32))
    assert logits.shape == (3, 8, VOCAB)
    names = set(flat(model.parameters()))
    assert "embedding.weight" in names and not any("output" in n or "lm_head" in n for n in names)
    d, h, L = 16, 32, 2
    per_layer = 4 * d * d + 3 * d * h + 2 * d      # attention, SwiGLU, two RMSNorm weights
    assert count_parameters(model) == VOCAB * d + L * per_layer + d


def test_default_sizes_are_the_issues():
    c = TrainConfig()
    assert (c.n_layers, c.dim, c.n_heads, c.mlp_dim, c.block_size) == (4, 256, 4, 512, 256)


def test_kv_cache_matches_the_full_forward_pass():
    mx.random.seed(1)
    model = Transformer(ModelArgs(vocab_size=VOCAB, **TINY))
    tokens = mx.random.randint(0, VOCAB, (2, 7))
    full = model(tokens)
    cache = model.new_cache()
    first = model(tokens[:, :5], cache)
    rest = [model(tokens[:, i:i + 1], cache) for i in range(5, 7)]
    got = mx.concatenate([first] + rest, axis=1)
    assert mx.allclose(got, full, atol=1e-5).item()


# ---- config -----------------------------------------------------------------------------------

def test_every_field_is_a_flag_with_help():
    help_text = build_parser().format_help()
    for flag in ("--n-layers", "--dim", "--steps", "--batch-size", "--accum", "--lr", "--warmup", "--min-lr",
                 "--weight-decay", "--max-norm", "--strategy", "--data", "--source", "--tokenizer", "--seed",
                 "--eval-every", "--eval-batches", "--report-every", "--ckpt-every", "--out", "--resume",
                 "--config"):
        assert flag in help_text
    assert "sequences per micro-batch PER RANK" in help_text and "records per micro-batch, GLOBAL" in help_text


def test_precedence_flags_over_file_over_checkpoint_over_preset_over_defaults(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text("lr: 0.005\nsteps: 77\nbatch-size: 3\n")
    checkpoint_config = {"lr": 0.02, "steps": 11, "dim": 32, "warmup": 9, "out": "ignored"}
    c = parse_args(["--config", str(cfg), "--lr", "0.001"], checkpoint_config, device="cpu")
    assert c.lr == 0.001                 # flag
    assert (c.steps, c.batch_size) == (77, 3)   # file
    assert (c.dim, c.warmup) == (32, 9)  # checkpoint
    assert (c.preset, c.n_layers, c.block_size) == ("tiny", 2, 64)   # the preset (this checkpoint names none)
    assert c.weight_decay == 0.1 and c.out is None   # default; run options never come from a checkpoint


# ---- presets ----------------------------------------------------------------------------------

def test_a_preset_sits_below_the_config_file_and_the_flags(tmp_path):
    assert parse_args(["--preset", "small"]).steps == presets.PRESETS["small"].settings["steps"]
    cfg = tmp_path / "train.yaml"
    cfg.write_text("preset: small\nsteps: 77\nlr: 0.005\n")
    c = parse_args(["--config", str(cfg), "--lr", "0.001"], device="cpu")
    assert c.preset == "small" and (c.dim, c.block_size) == (128, 128)   # the file named the preset
    assert c.steps == 77 and c.lr == 0.001                               # file over preset, flag over file
    assert parse_args(["--config", str(cfg), "--preset", "base"]).dim == 256   # --preset over the file's


def test_without_a_preset_the_device_chooses_one():
    assert (presets.for_device("gpu"), presets.for_device("cpu")) == ("small", "tiny")
    gpu, how = resolve([], device="gpu")
    assert (gpu.preset, gpu.dim, gpu.steps, how) == ("small", 128, 1000, "chosen for gpu")
    cpu, how = resolve([], device="cpu")
    assert (cpu.preset, cpu.n_layers, cpu.dim, cpu.steps, how) == ("tiny", 2, 64, 400, "chosen for cpu")
    assert resolve(["--preset", "base"], device="cpu")[1] == "given"


def test_resuming_keeps_the_checkpoints_preset_on_another_device():
    trained_on_a_cpu = parse_args([], device="cpu")
    saved = json.loads(json.dumps(trained_on_a_cpu.training_dict()))      # as state.json holds it
    resumed, how = resolve(["--resume", "latest"], saved, device="gpu")
    assert resumed.training_dict() == trained_on_a_cpu.training_dict() and how == "from the checkpoint"
    assert resolve(["--resume", "latest", "--steps", "500"], saved, device="gpu")[0].steps == 500
    with pytest.raises(ConfigError, match="trained with preset tiny, not small"):
        resolve(["--resume", "latest", "--preset", "small"], saved, device="gpu")


def test_an_unknown_preset_is_a_one_line_error_naming_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"^unknown preset 'huge': choose tiny, small, base$"):
        parse_args(["--preset", "huge"])
    cfg = tmp_path / "train.yaml"
    cfg.write_text("preset: huge\n")
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        parse_args(["--config", str(cfg)])


def test_base_is_the_built_in_defaults_and_every_preset_is_a_valid_config():
    assert dict(presets.PRESETS["base"].settings) == {k: getattr(TrainConfig(), k) for k in presets.PRESET_FIELDS}
    for name, preset in presets.PRESETS.items():
        assert set(preset.settings) == set(presets.PRESET_FIELDS)
        TrainConfig(preset=name, **preset.settings)


def test_the_preset_line_names_the_preset_how_it_was_chosen_and_what_was_overridden():
    config = parse_args(["--steps", "50"], device="cpu")
    line = presets.describe(config.training_dict(), "chosen for cpu", 98_688)
    assert line == "preset tiny (chosen for cpu; overridden: --steps): 2 layers, dim 64, 0.10M parameters, 50 steps"
    help_text = build_parser().format_help()
    assert "--preset tiny|small|base" in help_text and "small on a GPU, tiny on a CPU" in help_text


def test_the_docs_preset_table_is_the_code_s():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "trainer.md"), encoding="utf-8").read()
    for name, preset in presets.PRESETS.items():
        [row] = [line for line in readme.splitlines() if line.strip().startswith(f"| `{name}` |")]
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        s = preset.settings
        expected = [s["n_layers"], s["dim"], s["n_heads"], s["mlp_dim"], s["block_size"], s["batch_size"],
                    s["steps"], s["lr"], s["warmup"]]
        assert [float(c) for c in cells[1:10]] == expected, row
        assert cells[11] == f"{s['report_every']} / {s['eval_every']} / {s['ckpt_every']}", row
        config = parse_args(["--preset", name])
        assert cells[10] == f"{count_parameters(Transformer(ModelArgs.from_config(config, VOCAB))) / 1e6:.2f}M"


@pytest.mark.parametrize("text, message", [
    ("nonsense_key: 1\n", "unknown setting 'nonsense_key'"),
    ("steps: many\n", "steps must be int"),
    ("- a list\n", "expected a mapping"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        parse_args(["--config", str(path)])


def test_inconsistent_sizes_are_refused():
    with pytest.raises(ConfigError, match="heads of even size"):
        parse_args(["--dim", "30", "--n-heads", "4"])
    with pytest.raises(ConfigError, match="--steps must be at least 1"):
        parse_args(["--steps", "0"])
    with pytest.raises(ConfigError, match="--block-size must be at most 1048576"):   # 400 digits overflowed packing
        parse_args(["--block-size", "9" * 400])
    for flags, message in ((["--steps", "9" * 400], r"^--steps must be at most 2147483647, not 999999999999\.\.\. \(400 digits\)$"),
                           (["--seed", "-5"], "^--seed must be from 0 to 2147483647, not -5$"),
                           (["--lr", "inf"], "^--lr must be a finite number, not inf$"),
                           (["--min-lr", "nan"], "^--min-lr must be a finite number, not nan$")):
        with pytest.raises(ConfigError, match=message):         # once an MLX traceback deep in the schedule
            parse_args(flags)


# ---- schedule and step ------------------------------------------------------------------------

def test_lr_warms_up_then_decays_to_min_lr_at_the_last_step():
    c = tiny(steps=100, warmup=10, lr=1e-3, min_lr=1e-4)
    lr = [lr_schedule(c)(mx.array(s)).item() for s in range(100)]
    assert lr[0] == pytest.approx(1e-4) and lr[9] == pytest.approx(1e-3)
    assert lr[10] == pytest.approx(1e-3) and lr[99] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))
    assert lr[55] == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 45 / 89)) * 9e-4, rel=1e-5)


def test_accumulating_two_half_batches_equals_one_whole_batch():
    whole, halves = tiny(batch_size=4, accum=1), tiny(batch_size=2, accum=2)
    models = []
    for config in (whole, halves):
        mx.random.seed(0)
        model = Transformer(ModelArgs.from_config(config, VOCAB))
        optimizer = make_optimizer(config)
        step = make_dp_step(model, optimizer, config, group())
        for s in range(4):
            x, y = batch(s, whole)     # the same 4 rows, split into 2 micro-batches for `halves`
            mx.eval(step(x.reshape(config.accum, config.batch_size, -1), y.reshape(config.accum, config.batch_size, -1)),
                    model.state, optimizer.state)
        models.append(flat(model.parameters()))
    assert max(mx.abs(models[0][k] - models[1][k]).max().item() for k in models[0]) < 1e-5


# ---- checkpoints ------------------------------------------------------------------------------

def save(tmp_path, model, optimizer, config, step, keep=0):
    state = {"config": config.training_dict(), "world_size": 1, "strategy": config.strategy,
             "rng": random_states(group()), "tokenizer": {"type": "byte"}, "vocab_size": VOCAB,
             "model": ModelArgs.from_config(config, VOCAB).__dict__}
    return checkpoint.save(str(tmp_path), step, model, optimizer, state, group(), strategies.get(config.strategy),
                           keep=keep)


def test_checkpoint_round_trip_continues_identically(tmp_path):
    config = tiny()
    model, optimizer, step = trained(config)
    path = save(tmp_path, model, optimizer, config, 3)
    assert sorted(os.listdir(path)) == ["model.safetensors", "optimizer.safetensors", "state.json"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-000003\n"
    assert not [p for p in os.listdir(tmp_path / "checkpoints") if ".tmp-" in p]

    mx.random.seed(99)                 # different initial weights: loading must replace them all
    fresh = Transformer(ModelArgs.from_config(config, VOCAB))
    fresh_opt = make_optimizer(config)
    checkpoint.load_model(path, fresh)
    checkpoint.load_optimizer(path / "optimizer.safetensors", fresh_opt)
    for k, v in flat(model.parameters()).items():
        assert mx.array_equal(v, flat(fresh.parameters())[k]).item()
    assert fresh_opt.state["step"].item() == 3
    fresh_step = make_dp_step(fresh, fresh_opt, config, group())
    for s in (3, 4):
        a, b = step(*batch(s, config)), fresh_step(*batch(s, config))
        mx.eval(a, b, model.state, fresh.state, optimizer.state, fresh_opt.state)
        assert a[0].item() == b[0].item() and a[1].item() == b[1].item()


def test_a_checkpoint_is_on_disk_before_latest_names_it(tmp_path, monkeypatch):
    """Issue 25 item 9 (fsync decided per file: clusterctl/atomic.py): every file of the checkpoint and its
    directory are flushed before `latest` is replaced, and `latest` with its directory after."""
    config = tiny()
    model, optimizer, _ = trained(config, steps=1)
    flushed, real_fsync = [], os.fsync

    def recording(fd):
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    path = save(tmp_path, model, optimizer, config, 7)
    root = str(tmp_path / "checkpoints")
    tmp = [p for p in flushed if ".step-000007.tmp-" in p]
    names = {os.path.basename(p) for p in tmp}
    assert {"model.safetensors", "optimizer.safetensors", "state.json"} <= names      # the files, then the dir
    assert any(os.path.basename(p).startswith(".step-000007.tmp-") for p in tmp)
    latest = [i for i, p in enumerate(flushed) if p.startswith(os.path.join(root, ".latest.tmp-"))]
    assert latest and max(flushed.index(p) for p in tmp) < latest[0]       # the checkpoint first, then latest
    assert flushed[-1] == root and (tmp_path / "checkpoints" / "latest").read_text() == f"{path.name}\n"


def test_resolve_finds_the_latest_whole_checkpoint(tmp_path):
    config = tiny()
    model, optimizer, _ = trained(config, steps=1)
    for s in (1, 2, 3, 4):
        save(tmp_path, model, optimizer, config, s, keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p for p in os.listdir(root) if p.startswith("step-")) == ["step-000003", "step-000004"]
    (root / ".step-000005.tmp-abcdef").mkdir()            # a checkpoint killed half-written
    (root / "step-000009").mkdir()                         # no state.json: never complete
    for where in (str(tmp_path), str(root), str(root / "step-000004")):
        assert stepdirs.resolve(where, None).name == "step-000004"
    assert stepdirs.resolve("latest", str(tmp_path)).name == "step-000004"
    (root / "latest").write_text("step-000003\n")
    assert stepdirs.resolve(str(tmp_path), None).name == "step-000003"
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint in"):
        stepdirs.resolve(str(tmp_path / "nothing"), None)


def test_fsdp_checkpoint_refuses_another_world_size():
    from clusterctl.train.strategies import check_resume

    state = {"strategy": "fsdp", "world_size": 2}
    with pytest.raises(checkpoint.CheckpointError, match=r"sharded over the ranks that wrote it \(2 ranks\), so it "
                                                         "cannot resume on 1"):
        check_resume(state, "fsdp", 1, "ckpt")
    with pytest.raises(checkpoint.CheckpointError, match="--strategy fsdp"):
        check_resume(state, "dp", 2, "ckpt")
    check_resume({"strategy": "dp", "world_size": 2}, "dp", 1, "ckpt")         # DP may change size
    check_resume({"strategy": "zero3", "world_size": 2}, "zero3", 3, "ckpt")   # zero3 re-shards on load


def test_random_state_restores_exactly():
    mx.random.seed(5)
    mx.random.uniform(shape=(3,))
    key = random_states(group())[0]
    expected = mx.random.uniform(shape=(4,))
    mx.random.seed(123)
    restore_random_state(key)
    assert mx.array_equal(mx.random.uniform(shape=(4,)), expected).item()


# ---- metrics ----------------------------------------------------------------------------------

def test_reporter_writes_the_fields_and_forgets_lines_past_a_resumed_checkpoint(tmp_path, capsys, monkeypatch):
    now = [100.0]        # the reporter's clock, so that its throughput is an exact figure
    monkeypatch.setattr(sys.modules[Reporter.__module__], "time", SimpleNamespace(perf_counter=lambda: now[0]))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 8)))
    reporter = Reporter(str(tmp_path), group(), tokens_per_step=100, start_step=5)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4, 5]
    for loss in (2.0, 4.0):
        reporter.add(mx.array(loss), mx.array(0.5))
    now[0] = 102.5
    record = reporter.report(7, 10, 1e-3)
    assert record["loss"] == 3.0 and record["grad_norm"] == 0.5 and record["peak_mem_mb"] > 0
    assert record["tokens_per_s"] == 80.0       # steps 6 and 7 since the resumed step 5: 2 x 100 tokens in 2.5 s
    assert json.loads(metrics.read_text().splitlines()[-1]) == record
    assert "step  7/10 | loss 3.0000 | lr 1.00e-03 |" in capsys.readouterr().out


def test_the_shares_go_into_metrics_jsonl_and_each_ranks_live_line(tmp_path, capsys, monkeypatch):
    """Balancing on: metrics.jsonl's "shares" (rows per rank), and under `clusterctl run` the rank's own line
    for the live panel gives its share and its part of the global tokens/s."""
    now = [100.0]
    monkeypatch.setattr(sys.modules[Reporter.__module__], "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setenv("CLUSTERCTL_RUN_ID", "20260101-000000-abcdef")
    reporter = Reporter(str(tmp_path), group(), tokens_per_step=100, start_step=0)
    reporter.shares = [12, 4]                    # as if this were rank 0 of 2 holding 12 of the 16 rows
    reporter.add(mx.array(2.0), mx.array(0.5))
    now[0] = 101.0
    record = reporter.report(1, 10, 1e-3)
    assert record["shares"] == [12, 4] and record["tokens_per_s"] == 100.0
    live = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("clusterctl:metrics ")]
    assert live[-1]["share"] == 0.75 and live[-1]["tokens_per_s"] == 75.0


# ---- generation -------------------------------------------------------------------------------

@pytest.fixture
def saved_run(tmp_path):
    config = tiny()
    model, optimizer, _ = trained(config, steps=2)
    save(tmp_path, model, optimizer, config, 2)
    return tmp_path


def test_sampling_is_seeded_and_runs_past_the_block_size(saved_run):
    model, tokenizer, state = load(str(saved_run))
    assert state["step"] == 2 and tokenizer.vocab_size == VOCAB
    long = list(sample_tokens(model, [256, 65], max_tokens=3 * 8, temperature=1.0, seed=3))
    assert len(long) == 24 and all(0 <= t < VOCAB for t in long)
    assert long == list(sample_tokens(model, [256, 65], max_tokens=24, temperature=1.0, seed=3))
    assert long != list(sample_tokens(model, [256, 65], max_tokens=24, temperature=1.0, seed=4))
    greedy = list(sample_tokens(model, [256, 65], max_tokens=5, temperature=0, seed=0))
    logits = model(mx.array([[256, 65]]))[0, -1]
    assert greedy[0] == mx.argmax(logits).item()
    text = "".join(generate_text(str(saved_run), "ab", max_tokens=10, temperature=0))
    assert len(text.encode()) <= 10


def test_generate_command(saved_run):
    r = CliRunner().invoke(cli, ["generate", "--checkpoint", str(saved_run), "--prompt", "Once", "--max-tokens",
                                 "5", "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Once")
    empty = saved_run / "empty"
    empty.mkdir()
    r = clirun.clusterctl("generate", "--checkpoint", str(empty), "--prompt", "x", timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: no checkpoint in {empty}\n")


# ---- the trainer's refusals (in process, one rank) --------------------------------------------

def test_trainer_refuses_to_overwrite_a_run_or_resume_past_its_end(tmp_path, capsys, monkeypatch):
    # a world of one without MPI in pytest's own process (see group() above): as under `clusterctl run --backend ring`
    monkeypatch.setenv("CLUSTERCTL_BACKEND", "ring")
    flags = ["--n-layers", "1", "--dim", "16", "--n-heads", "2", "--mlp-dim", "16", "--block-size", "16",
             "--batch-size", "2", "--steps", "2", "--eval-batches", "1", "--out", str(tmp_path)]
    assert main(flags) == 0
    assert (tmp_path / "checkpoints" / "step-000002" / "state.json").is_file()
    capsys.readouterr()
    assert main(flags) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path} already holds checkpoints: continue it with --resume "
                                       f"latest --out {tmp_path}, or train into another --out\n")
    assert main(flags + ["--resume", "latest"]) == 2
    assert "is at step 2 and --steps is 2: nothing to train" in capsys.readouterr().err
    assert main(flags + ["--resume", "latest", "--steps", "3"]) == 0
    assert [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl") if '"loss"' in line] == [1, 2, 3]
    assert main(["--resume", "latest"]) == 2
    assert capsys.readouterr().err.endswith("error: --resume latest needs --out DIR (the run to continue)\n")


def test_data_too_short_for_a_block_and_a_negative_max_tokens_are_bad_input(tmp_path, capsys, monkeypatch):
    """Bad input is exit 2, one line with the fix; both were a bare ClusterctlError (exit 1, as a crash is)."""
    monkeypatch.setenv("CLUSTERCTL_BACKEND", "ring")
    (tmp_path / "tiny.txt").write_text("Once upon a time.\n")
    flags = ["--source", str(tmp_path / "tiny.txt"), "--n-layers", "1", "--dim", "16", "--n-heads", "2", "--mlp-dim",
             "16", "--block-size", "32", "--steps", "1", "--out", str(tmp_path / "out")]
    assert main(flags) == 2
    assert re.fullmatch(r"error: rank 0: only \d+ training tokens, fewer than --block-size 32 \+ 1: give more data, or "
                        r"a smaller --block-size\n", capsys.readouterr().err)
    with pytest.raises(UsageError, match=r"^--max-tokens -1: give 0 or more tokens to generate$") as info:
        generate_text(str(tmp_path), "", max_tokens=-1)
    assert info.value.exit_code == 2


def test_the_clock_and_the_stop_are_decided_from_what_every_rank_agrees_on():
    """stopping.py on a world of one (agree is then what this rank saw) with a clock of its own: the interval
    counts from the last checkpoint, 0 turns it off; polls come after every step that takes POLL_S or more, after
    about POLL_S of shorter ones (nothing asked of the others between them); the bound offered to run grows with
    the longest step and checkpoint, offered again only once it grew by a tenth."""
    from clusterctl.train.stopping import POLL_S, STOP_FLOOR_S, Stopping, agree, checkpoint_due, poll_gap, stop_bound

    group = mx.distributed.init(backend="ring")       # a world of one without MPI (tests/conftest.py)
    assert agree(0, 1500, 3, group) == (0, 1500, 3) and agree(15, -3, 0, group) == (15, 0, 1)
    assert agree(2, 2**40, 7, group)[1] == 2**31 - 1
    assert checkpoint_due(600_000, 600) and not checkpoint_due(599_999, 600) and not checkpoint_due(10**9, 0)
    assert stop_bound(0, 0) == STOP_FLOOR_S and stop_bound(2.5, 10) == STOP_FLOOR_S + 25
    assert poll_gap(13.0, 1) == 1 and poll_gap(POLL_S, 10) == 10 and poll_gap(0.0, 5) == 1
    now = [100.0]
    stopping = Stopping(60, group, clock=lambda: now[0])

    def step(seconds):
        stopping.step_begins()
        now[0] += seconds
        return stopping.poll()

    assert step(59) == (0, False) and stopping.offer() == STOP_FLOOR_S + 2 * 59
    assert step(1) == (0, True) and stopping.offer() is None       # the same bound: not offered again
    stopping.checkpointed(now[0] - 30)                              # a 30 s checkpoint: the clock starts again
    assert step(1) == (0, False) and stopping.offer() == STOP_FLOOR_S + 2 * (59 + 30)
    stopping.request.signum = 2
    assert step(1) == (2, False)
    stopping.request.signum = 0
    assert step(POLL_S / 8) == (0, False) and stopping.next_in == 8      # short steps: eight of them to the next poll
    stopping.request.signum = 15
    assert [step(POLL_S / 8) for _ in range(8)] == [(0, False)] * 7 + [(15, False)]
