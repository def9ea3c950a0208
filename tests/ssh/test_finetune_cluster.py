"""Fine-tuning an mlx-lm model on two test hosts, launched as users launch it: the model directory and the jsonl
records sit in the project, `clusterctl run --hosts inventory.yaml -- --model models/M --data data/D` syncs them
with the code, 30 steps lower the loss, and the model directory the run writes comes home with the run
(runs/<id>/model) and generates in mlx-lm. Inputs the ranks would refuse are refused on the controller first, and a
--model outside the project that some hosts lack by the pre-flight, before anything is copied."""
import json
import os
import re
import shutil
import signal
import time
from functools import partial

import clirun
import pytest

pytest.importorskip("mlx_lm")

import lmfixture  # noqa: E402
from sshcluster import requires_private_roots  # noqa: E402
from test_run import assert_nothing_left, wait_for_lines  # noqa: E402

pytestmark = pytest.mark.ssh
clusterctl = partial(clirun.clusterctl, timeout=300, own_cache=True)
TOKEN = clirun.TOKEN
STEPS = ["--steps", "30", "--batch-size", "4", "--max-seq-length", "64", "--lr", "3e-3", "--warmup", "3",
         "--report-every", "1", "--eval-every", "0", "--ckpt-every", "0"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return lmfixture.make_inputs(tmp_path_factory.mktemp("made"))


def project(tmp_path, made, model, data):
    shutil.copytree(made[model], tmp_path / "models" / model)
    shutil.copytree(made[data], tmp_path / "data" / data)


@pytest.mark.parametrize("backend, strategy, model, data", [("ring", "dp", "llama", "chat"),
                                                             ("ring", "zero3", "qwen3", "text"),
                                                             ("mpi", "zero3", "llama", "chat"),
                                                             ("mpi", "dp", "qwen3", "text")])
def test_thirty_steps_on_two_hosts_lower_the_loss_and_the_model_comes_home(make_cluster, made, tmp_path, backend,
                                                                          strategy, model, data):
    from mlx_lm import generate, load

    cluster = make_cluster(2)
    project(tmp_path, made, model, data)
    r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", backend, "--plain", "--",
                   "--model", f"models/{model}", "--data", f"data/{data}", "--strategy", strategy, *STEPS, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{strategy} on 2 rank(s): {120 if data == 'chat' else 114} records" in r.stdout
    run_dir = tmp_path / "runs" / TOKEN.search(r.stderr).group(1)
    assert f"the trained model is {run_dir / 'model'} (mlx_lm.generate --model" in r.stderr
    curve = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [c["loss"] for c in curve if "loss" in c]
    assert len(curve) == 30 and curve[-1] < 0.6 * curve[0], curve
    loaded, tokenizer = load(str(run_dir / "model"))
    assert tokenizer.encode(generate(loaded, tokenizer, "Tom found", max_tokens=8))
    listed = json.loads(clusterctl("runs", "--json", cwd=tmp_path).stdout)
    assert [{k: r[k] for k in ("kind", "model", "strategy", "world", "status")} for r in listed] == \
        [{"kind": "fine-tune", "model": f"models/{model}", "strategy": strategy, "world": 2, "status": "ok"}]


def test_the_model_goes_to_each_hosts_store_once_and_the_ranks_read_it_there(make_cluster, made, tmp_path):
    """Issue 41: `run -- --model models/M` puts M into every host's model store (verified, once) instead of the
    project copy, even from a git-ignored folder; the ranks read their host's store copy (rank 0's line names its
    path) and the workdirs hold no second copy; the same run again moves no model bytes. A Hugging Face id, the hub
    offline, is the cache's snapshot: the same files, the same store entry."""
    cluster = make_cluster(2)
    project(tmp_path, made, "llama", "chat")
    (tmp_path / ".gitignore").write_text("models/\n")         # the store takes it all the same
    lmfixture.hub_snapshot(made["llama"], tmp_path / "hf", "tiny-org/llama")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}

    def train(model):
        r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "mpi", "--plain", "--", "--model", model,
                       "--data", "data/chat", *STEPS[2:], "--steps", "2", cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r

    first = train("models/llama")
    stored = {}
    for h in ("h1", "h2"):
        line = re.search(rf"^model: {h}: (.*) sent, verified, in its store \((.*)\)$", first.stderr, re.M)
        assert line, first.stderr
        stored[h] = line.group(2)
    assert f"model: models/llama, read from {stored['h1']} (this host's model store)" in first.stdout
    for i in (1, 2):
        assert cluster.ssh(i, f"test -f {stored[f'h{i}']}/model.safetensors").returncode == 0
        assert cluster.ssh(i, f"test -e {cluster.workdir}/models").returncode == 1        # not copied twice
        assert cluster.ssh(i, f"test -d {cluster.workdir}/data/chat").returncode == 0
    # again, by its hub id: the same files, an entry of that name made of links to the files already there
    by_id = train("tiny-org/llama")
    digest = stored["h1"].rsplit("-", 1)[1]
    for h in ("h1", "h2"):
        assert re.search(rf"^model: {h} has it already in its store \(.*/tiny-org-llama-{digest}\): no model bytes "
                         "moved$", by_id.stderr, re.M), by_id.stderr
    assert re.search(rf"read from .*/tiny-org-llama-{digest} \(this host's model store\)", by_id.stdout), by_id.stdout


@pytest.mark.parametrize("backend, strategy, model, data", [("mpi", "dp", "llama", "chat"),
                                                             ("ring", "zero3", "qwen3", "text")])
def test_lora_on_a_4bit_model_on_two_hosts_brings_the_adapters_home(make_cluster, made, tmp_path, backend, strategy,
                                                                    model, data):
    """QLoRA as users run it: a 4-bit model in the project, `run -- --model models/M --adapter lora`, 30 steps lower
    the loss; the adapters (mlx-lm's layout) come home in runs/<id>/adapters and load in mlx-lm on the base; `runs`
    lists an adapter run. Under zero3 each host keeps half of the frozen base."""
    import mlx.core as mx
    from mlx_lm import load

    cluster = make_cluster(2)
    base = f"models/{model}-4bit"
    lmfixture.quantize(made[model], tmp_path / base, bits=4, group_size=32)
    shutil.copytree(made[data], tmp_path / "data" / data)
    r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", backend, "--plain", "--",
                   "--model", base, "--adapter", "lora", "--data", f"data/{data}", "--strategy", strategy,
                   *STEPS, "--lr", "1e-2", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "runs" / TOKEN.search(r.stderr).group(1)
    adapters = run_dir / "adapters"
    assert (f"the trained adapters are {adapters} (mlx_lm.generate --model {base} --adapter-path "
            f"{adapters};") in r.stderr
    curve = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(curve) == 30 and curve[-1] < 0.8 * curve[0], curve
    adapted, tokenizer = load(str(tmp_path / base), adapter_path=str(adapters))
    plain, _ = load(str(tmp_path / base))
    ids = mx.array([tokenizer.encode("What is the capital")])
    assert mx.abs(adapted(ids) - plain(ids)).max().item() > 1e-3         # the trained adapters, on the base
    listed = json.loads(clusterctl("runs", "--json", cwd=tmp_path).stdout)
    assert [(x["kind"], x["model"], x["strategy"], x["status"]) for x in listed] == [("adapters", base, strategy, "ok")]


def test_a_4bit_base_too_big_for_dp_is_refused_naming_zero3_and_adapted_under_zero3_at_world_4(make_cluster, made,
                                                                                              tmp_path):
    """The hosts' memory (CLUSTERCTL_HOST_MEMORY in the inventory) set between what LoRA on a 4-bit base needs per rank
    under dp and under zero3 at world 4 (2 hosts, 2 ranks each): dp is refused on the controller in one line naming
    zero3, before any host starts; zero3, each rank holding a quarter of the frozen base, trains and brings the
    adapters home."""
    from clusterctl.data import records
    from clusterctl.train import memory, strategies
    from clusterctl.train.config import TrainConfig

    cluster = make_cluster(2)
    # a base that outweighs the activations and the adapters (8 blocks of width 256, one record of at most 16 tokens
    # a rank: a row of 16, rank-2 adapters on two projections), as a big model's does
    base = lmfixture.make_model(tmp_path / "made" / "base", "llama", layers=8, dim=256, mlp=1024)
    lmfixture.quantize(base, tmp_path / "models" / "llama-4bit", bits=4, group_size=64)
    shutil.copytree(made["chat"], tmp_path / "data" / "chat")
    model_config = json.loads((tmp_path / "models" / "llama-4bit" / "config.json").read_text())
    small = {"lora_rank": 2, "lora_keys": "self_attn.q_proj,self_attn.v_proj"}      # small adapters, as QLoRA's are
    shape = memory.Shape.of(TrainConfig(model="m", adapter="lora", batch_size=4, max_seq_length=16, **small),
                            model_config["vocab_size"], model_config, rows=(1, records.round_up(16)))
    dp, zero3 = (strategies.estimate(shape, s, 4).total for s in ("dp", "zero3"))
    assert zero3 < 0.6 * dp, (dp, zero3)
    host = int((dp * zero3) ** 0.5 / memory.BUDGET)
    inventory = cluster.write_inventory(env={"CLUSTERCTL_HOST_MEMORY": str(host)})
    inventory.write_text(inventory.read_text().replace("defaults:\n", "defaults:\n  slots: 2\n", 1))
    lora = ["--model", "models/llama-4bit", "--adapter", "lora", "--data", "data/chat", *STEPS[2:], "--steps", "3",
            "--batch-size", "4", "--max-seq-length", "16", "--lora-rank", "2", "--lora-keys", small["lora_keys"]]
    r = clusterctl("run", "--hosts", str(inventory), "--backend", "ring", "--plain", "--", *lora, "--strategy", "dp",
                   cwd=tmp_path)
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert "under dp at world 4" in errors[0] and "pass --strategy zero3" in errors[0]
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*/rank-0.log"))
    r = clusterctl("run", "--hosts", str(inventory), "--backend", "ring", "--plain", "--", *lora, "--strategy", "zero3",
                   cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "zero3 on 4 rank(s)" in r.stdout
    run_dir = tmp_path / "runs" / TOKEN.search(r.stderr).group(1)
    assert (run_dir / "adapters" / "adapters.safetensors").is_file()


def test_what_the_ranks_would_refuse_is_refused_before_any_host_starts(make_cluster, made, tmp_path):
    cluster = make_cluster(2)
    project(tmp_path, made, "llama", "chat")
    (tmp_path / "data" / "chat" / "valid.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n'
                                                            '{"messages": "hi"}\n')
    (tmp_path / "models" / "odd").mkdir()
    (tmp_path / "models" / "odd" / "config.json").write_text('{"model_type": "no_such_arch"}')
    shutil.copy(made["llama"] / "model.safetensors", tmp_path / "models" / "odd")
    shutil.copy(made["llama"] / "tokenizer.json", tmp_path / "models" / "odd")
    for model, says in [("models/llama", "data/chat/valid.jsonl:2: \"messages\" must be a non-empty list"),
                        ("models/none", "models/none: no such directory"),
                        ("data/chat", "data/chat: not an mlx-lm model directory (no config.json)"),
                        ("models/odd", "has no architecture 'no_such_arch'"),
                        ("/nowhere/llama", "--model /nowhere/llama: no such directory")]:     # nor pushed
        r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--",
                       "--model", model, "--data", "data/chat", *STEPS, cwd=tmp_path)
        errors = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(errors) == 1 and says in errors[0], r.stderr
        assert not TOKEN.search(r.stderr) and not (tmp_path / "runs").exists()     # no run started
    (tmp_path / "data" / "chat" / "valid.jsonl").unlink()
    # issue 45, then 41: a --model by an absolute path that only this machine has, outside the project, used to be
    # refused by the pre-flight (the hosts lacked it); the hosts' model stores get it now, as any --model
    requires_private_roots(cluster, "to give this machine a directory the hosts lack")
    here = cluster.host_root / "models" / "llama"          # the hosts see their own empty root at that path
    shutil.copytree(made["llama"], here)
    r = clusterctl("run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain", "--",
                   "--model", str(here), "--data", "data/chat", *STEPS[2:], "--steps", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^model: h2: .* sent, verified, in its store", r.stderr, re.M), r.stderr
    assert cluster.ssh(2, f"test -e {here}").returncode == 1            # read from the store, not from that path


def test_ctrl_c_keeps_the_work_export_and_resume_latest_take_it_up_and_kill_keeps_it_too(make_cluster, made, tmp_path):
    """Issue 45: a fine-tune far from its last step is stopped with Ctrl-C (ring, launched here) after a checkpoint
    the clock asked for (--ckpt-minutes 0.05: every 3 s, at a step both ranks agreed on) and a few steps more:
    exit 130 within 60 s, the stop's own checkpoint here, `export latest` writes it as a model mlx-lm loads;
    `--resume latest` (mpi, launched from the first host) continues from that very step, and `clusterctl kill` of
    that run keeps a checkpoint as well. Nothing of either run is left on the hosts."""
    from mlx_lm import generate, load

    cluster = make_cluster(2)
    project(tmp_path, made, "llama", "chat")
    inventory = str(cluster.inventory)
    args = ["--model", "models/llama", "--data", "data/chat", *STEPS[2:-6], "--steps", "100000", "--report-every", "1",
            "--eval-every", "0", "--ckpt-every", "0"]
    step_line = re.compile(r"^\[rank 0 h1\] step +(\d+)/100000 \|")

    proc = clirun.start("run", "--hosts", inventory, "--backend", "ring", "--plain", "--", *args, "--ckpt-minutes", "0.05",
                        cwd=tmp_path, own_cache=True)
    seen = wait_for_lines(proc, lambda line: "| checkpoint " in line, 1, limit=240)
    seen += wait_for_lines(proc, lambda line: bool(step_line.match(line)), 3)
    asked = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out = "".join(seen) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 130 and time.monotonic() - asked < 60, out[-3000:]
    stop = int(re.search(r"stopped: interrupted \(Ctrl-C\): every rank wrote a checkpoint at step (\d+) and stopped",
                         out).group(1))
    run_id = TOKEN.search(out).group(1)
    kept = sorted(p.name for p in (tmp_path / "runs" / run_id / "checkpoints").glob("step-*"))
    assert len(kept) >= 2 and kept[-1] == f"step-{stop:06d}", kept     # the clock's, then the stop's, brought home
    assert_nothing_left(cluster, run_id)

    r = clirun.clusterctl("export", "latest", cwd=tmp_path, own_cache=True)
    assert r.returncode == 0, r.stderr
    model_dir = tmp_path / "runs" / run_id / "model"
    assert json.loads((model_dir / ".clusterctl-export.json").read_text()) == {"run": run_id, "model": "models/llama",
                                                                               "step": stop}
    loaded, tokenizer = load(str(model_dir))
    assert tokenizer.encode(generate(loaded, tokenizer, "Tom found", max_tokens=4))

    proc = clirun.start("run", "--hosts", inventory, "--backend", "mpi", "--launch-from", "first-host", "--plain", "--",
                        *args, "--resume", "latest", cwd=tmp_path, own_cache=True)
    seen = wait_for_lines(proc, lambda line: bool(step_line.match(line)), 3, limit=240)
    text = "".join(seen)
    assert f"note: --resume latest: run {run_id}, from its step-{stop:06d}" in text, text
    assert [int(step_line.match(line).group(1)) for line in seen if step_line.match(line)][0] == stop + 1
    resumed = next(m.group(1) for m in TOKEN.finditer(text) if m.group(1) != run_id)
    r = clirun.clusterctl("kill", resumed, "--hosts", inventory, cwd=tmp_path, own_cache=True)    # through its run
    assert r.returncode == 0 and f"kill: run {resumed}: no process left on 2 host(s)" in r.stderr, r.stderr
    out = text + proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out[-3000:]
    later = int(re.search(r"stopped: SIGTERM received: every rank wrote a checkpoint at step (\d+) and stopped", out).group(1))
    assert later > stop and (tmp_path / "runs" / resumed / "checkpoints" / f"step-{later:06d}" / "state.json").is_file()
    assert_nothing_left(cluster, resumed)


def test_mlx_lm_s_config_file_on_two_hosts_gives_what_mlx_lm_gives_there(make_cluster, tmp_path, pretrained):
    """Issue 52: mlx-lm's own lora_config.yaml, its paths relative to the project, given unchanged as -c to
    mlx_lm.lora and to the bundled trainer, each on 2 hosts through `clusterctl run` (ring): the model named only by
    the file goes into every host's store, the records named by it travel with the project, the ranks split each
    global batch of 4; both results, scored by mlx-lm's own evaluate, end within 2% of each other (whole records
    and answers), on a base trained here on plain stories (tests/lmfixture.py `pretrain`)."""
    from mlxlmscore import score_many_in_process

    cluster = make_cluster(2)
    shutil.copytree(pretrained / "base-4bit", tmp_path / "models" / "base-4bit")
    lmfixture.story_tasks(tmp_path / "data")
    (tmp_path / "lora_config.yaml").write_text(
        "model: models/base-4bit\ntrain: true\nfine_tune_type: lora\ndata: data/chat\nnum_layers: -1\n"
        "batch_size: 4\niters: 40\nlearning_rate: 5e-5\nsteps_per_report: 10\nsteps_per_eval: 1000\n"
        "val_batches: -1\nlora_parameters:\n  rank: 8\n  scale: 20.0\n  dropout: 0.0\n")
    launch = ["run", "--hosts", str(cluster.inventory), "--backend", "ring", "--plain"]
    r = clusterctl(*launch, "--fetch", "theirs", "-m", "mlx_lm", "lora", "-c", "lora_config.yaml", "--adapter-path",
                   "theirs", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = clusterctl(*launch, "--", "-c", "lora_config.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "dp on 2 rank(s): 400 records" in r.stdout and "4 records per step" in r.stdout
    assert "  mask-prompt            off  (mlx-lm's default (the settings use mlx-lm's names))" in r.stdout
    run_dir = tmp_path / "runs" / TOKEN.search(r.stderr).group(1)
    sets = [(tmp_path / "data" / "chat", False), (tmp_path / "data" / "chat", True)]
    ours, theirs = score_many_in_process([(tmp_path / "models" / "base-4bit", run_dir / "adapters"),
                                          (tmp_path / "models" / "base-4bit", tmp_path / "theirs")], sets,
                                         losses=("no_pad",))
    for got, want in zip(ours, theirs):
        assert got["no_pad"] == pytest.approx(want["no_pad"], rel=0.02), (ours, theirs)
