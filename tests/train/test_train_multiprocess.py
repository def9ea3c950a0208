"""The trainer in real multi-process runs on this machine: mpirun -np 2 (mpi backend) and `clusterctl run`
(2 ranks, ring backend, clusterctl's rank starter). Tiny models; each test takes seconds.

Tolerances:
* DP equivalence: 2 ranks x batch b against 1 rank x batch 2b after 10 AdamW steps (lr 1e-2, clipping
  active): the gradient is the same mean, summed in another order (each rank's mean, then all_sum / 2),
  so float32 rounding differs in the last bits and AdamW carries it along: measured <= 3.2e-6 absolute
  on weights of order 1. 5e-5 catches any real error (a rank training on its own gradients alone is off
  by ~1e-2). Losses and grad norms must agree to 1e-5 relative, which also catches a missing 1/N (with
  AdamW and clipping the parameters alone would not show a gradient scaled by N).
* Resume after kill -9: exact equality of every later step's loss and grad norm (CPU, same world size,
  same operations in the same order).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import mlx.core as mx
import pytest
from sshcluster import descendants, requires_private_roots


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ENV = {**os.environ, "PYTHONPATH": REPO}
ENV.pop("CLUSTERCTL_WORLD_SIZE", None)
ENV.pop("CLUSTERCTL_RUN_DIR", None)
TINY = ["--n-layers", "2", "--dim", "32", "--n-heads", "2", "--mlp-dim", "64", "--block-size", "32",
        "--batch-size", "4", "--warmup", "5"]


def mpirun(n: int, forward=("PYTHONPATH", "CLUSTERCTL_WORLD_SIZE")) -> list[str]:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (tests/run.sh installs openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "--oversubscribe", "-np", str(n)] + [a for name in forward for a in ("-x", name)]


def ring(program: list[str], tmp_path) -> list[str]:
    """`program` ([python, SCRIPT, ARGS...] or the trainer's `[python, -m, clusterctl.train, FLAGS...]`) on
    2 ranks over the ring backend, started as users start it: `clusterctl run` on this machine, whose rank
    starter gives each rank MLX_RANK and MLX_HOSTFILE (docs/facts/launchers.md#our-rank-starter)."""
    base = [sys.executable, "-m", "clusterctl", "run", "--no-sync", "--no-preflight", "--runs-dir", str(tmp_path / "runs")]
    if program[1:3] == ["-m", "clusterctl.train"]:
        return base + ["--", *program[3:]]
    return base + program[1:]


def run(argv, world=1, timeout=180) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       env={**ENV, "CLUSTERCTL_WORLD_SIZE": str(world)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def train_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "clusterctl.train", *TINY, *args]


def losses(run_dir) -> dict[int, tuple[float, float]]:
    """step -> (loss, grad norm) from metrics.jsonl (one curve: a resumed run drops what it repeats)."""
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == sorted(set(steps)), steps
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if "loss" in r}


# ---- DP equivalence ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_rank_reference(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dp1") / "params.safetensors")
    run([sys.executable, os.path.join(HERE, "dp_worker.py"), out])
    return out


@pytest.mark.parametrize("launcher", ["mpi", "ring"])
def test_two_ranks_match_one_rank_with_the_double_batch(launcher, one_rank_reference, tmp_path):
    out = str(tmp_path / "params.safetensors")
    program = [sys.executable, os.path.join(HERE, "dp_worker.py"), out]
    run(mpirun(2) + program if launcher == "mpi" else ring(program, tmp_path), world=2)
    ref, got = mx.load(one_rank_reference), mx.load(out)
    assert set(ref) == set(got) and len(ref) == 2 * 9 + 2
    diff = max(mx.abs(ref[k] - got[k]).max().item() for k in ref)
    assert diff <= 5e-5, diff
    ref_log, got_log = json.load(open(one_rank_reference + ".json")), json.load(open(out + ".json"))
    assert (ref_log["world"], got_log["world"]) == (1, 2)
    assert got_log["losses"] == pytest.approx(ref_log["losses"], rel=1e-5)
    assert got_log["norms"] == pytest.approx(ref_log["norms"], rel=1e-5)
    assert max(ref_log["norms"]) > 0.3      # above --max-norm 0.3: clipping took part


@pytest.mark.parametrize("world, shares", [(2, "3,1"), (3, "1,2,3")])
def test_balanced_shares_match_one_rank_with_the_whole_batch(world, shares, one_rank_reference, tmp_path):
    """--balance: uneven shares of the same global batch (a rank taking rows of another's shard, micro-batches of
    two sizes on 3 ranks: 11 rows as 6 + 5) update the model as one rank with the whole batch does; tolerance as above."""
    out = str(tmp_path / "params.safetensors")
    run(mpirun(world) + [sys.executable, os.path.join(HERE, "balanced_worker.py"), out, shares], world=world)
    ref, got = mx.load(one_rank_reference), mx.load(out)
    diff = max(mx.abs(ref[k] - got[k]).max().item() for k in ref)
    assert diff <= 5e-5, diff
    ref_log, got_log = json.load(open(one_rank_reference + ".json")), json.load(open(out + ".json"))
    assert got_log["world"] == world and got_log["rows"] == {2: [18, 6], 3: [5, 8, 11]}[world]
    assert got_log["losses"] == pytest.approx(ref_log["losses"], rel=1e-5)
    assert got_log["norms"] == pytest.approx(ref_log["norms"], rel=1e-5)


# ---- resume after kill -9 ---------------------------------------------------------------------

def kill_9_after_a_checkpoint(argv: list[str], out, steps: int, world: int = 2) -> int:
    """Start `argv` (a trainer run of `world` ranks writing into `out`) and kill -9 every rank once a checkpoint
    exists and training has gone 2 steps past it; returns the step of the checkpoint it will resume from (a later
    one may have landed between the check and the kill)."""
    launcher = subprocess.Popen(argv, env={**ENV, "CLUSTERCTL_WORLD_SIZE": str(world)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    latest, metrics = out / "checkpoints" / "latest", out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    try:
        while True:
            assert launcher.poll() is None, "the run finished before it could be killed: " + launcher.stdout.read()
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            if latest.exists() and metrics.exists():
                ckpt_step = int(latest.read_text().strip().split("-")[1])
                if max(losses(out), default=0) >= ckpt_step + 2:
                    break
            time.sleep(0.02)
        ranks = rank_processes(launcher.pid)
        assert len(ranks) == world, ranks
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:      # gone since the listing: the run's end below says whether it was a rank
                pass
        launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0
    assert max(losses(out)) < steps
    return int(latest.read_text().strip().split("-")[1])


def rank_processes(launcher_pid: int) -> list[int]:
    """The trainer's rank processes under a launcher: python running clusterctl.train (mpirun's children;
    under clusterctl run, the bootstraps its rank starter started, below their watchdog shells)."""
    ranks = {}
    for pid in descendants(launcher_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"python" in os.path.basename(argv[0]) and b"clusterctl.train" in argv:
            ranks[pid] = parent
    # a rank's child between its fork and its exec carries the rank's command line (a clean-clone run listed one and
    # found it gone at the kill): a rank is one whose parent is not a rank
    return [pid for pid, parent in ranks.items() if parent not in ranks]


# each strategy on one backend (the suite's time: each of these takes 30-40 s): a checkpoint does not depend on the
# backend but for zero3's slices passed over the collectives to a rank on another disk, which the separate-disks
# test below checks under mpi exactly as this one does; tests/train/test_adapters.py kills an adapter run's rank
@pytest.mark.parametrize("strategy, backend", [("dp", "mpi"), ("fsdp", "ring"), ("zero3", "ring")])
def test_resume_after_kill_9_reproduces_the_uninterrupted_curve(strategy, backend, tmp_path):
    # the kill comes at step 12 or so (the first checkpoint at 10, then 2 steps past it, polled every 20 ms): 48 steps to
    # spare on a faster machine (or launcher); 120 cost twice the training in the whole and the resumed runs
    STEPS = 60
    args = ["--strategy", strategy, "--steps", str(STEPS), "--report-every", "1", "--eval-every", "0",
            "--ckpt-every", "10", "--dropout", "0.1", "--accum", "2",
            "--balance", "off" if strategy == "zero3" else "3,1"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"

    def on_two(program):
        return mpirun(2) + program if backend == "mpi" else ring(program, tmp_path)

    run(on_two(train_cmd(*args, "--out", str(whole))), world=2)

    ckpt_step = kill_9_after_a_checkpoint(on_two(train_cmd(*args, "--out", str(killed))), killed, STEPS)
    r = run(on_two(train_cmd("--resume", "latest", "--out", str(killed))), world=2)
    assert f"steps {ckpt_step + 1}..{STEPS}" in r.stdout and "resumed from" in r.stdout
    expected, got = losses(whole), losses(killed)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert {s: got[s] for s in range(ckpt_step + 1, STEPS + 1)} == {s: expected[s] for s in range(ckpt_step + 1, STEPS + 1)}
    if strategy == "fsdp":
        step_dir = killed / "checkpoints" / f"step-{STEPS:06d}"
        assert {"optimizer-rank-0.safetensors", "optimizer-rank-1.safetensors"} <= set(os.listdir(step_dir))
        r = subprocess.run(train_cmd("--resume", "latest", "--out", str(killed), "--steps", str(STEPS + 10)),
                           capture_output=True, text=True, env=ENV, timeout=120)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert "sharded over the ranks that wrote it (2 ranks), so it cannot resume on 1" in r.stderr


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_ranks_on_separate_disks_each_keep_a_checkpoint_they_can_resume_from(strategy, tmp_path):
    """Rank 1 runs in its own mount namespace where --out is another directory (a host without a shared
    disk): it must write its own full copy (fsdp: the model, its optimizer shard, state.json, latest; zero3:
    every rank's shard file, the second sent to it through the collectives), and the run must resume from
    the two copies exactly."""
    requires_private_roots(why="to give one rank its own disk (a bind mount, as root)")
    out, other_disk, whole = tmp_path / "out", tmp_path / "host1", tmp_path / "whole"
    out.mkdir()
    other_disk.mkdir()
    args = ["--strategy", strategy, "--ckpt-every", "2", "--eval-every", "0", "--report-every", "1", "--balance", "off"]
    bind = f'mount --bind {other_disk} {out} && exec "$0" "$@"'

    def separate(*more):
        mpi = mpirun(1)
        return (mpi + train_cmd(*args, *more, "--out", str(out)) + [":", "-np", "1", "unshare", "-m", "--propagation",
                "private", "sh", "-c", bind] + train_cmd(*args, *more, "--out", str(out)))

    run(separate("--steps", "4"), world=2)
    for disk, rank in ((out, 0), (other_disk, 1)):
        assert sorted(os.listdir(disk / "checkpoints" / "step-000004")) == (
            ["model.safetensors", f"optimizer-rank-{rank}.safetensors", "state.json"] if strategy == "fsdp" else
            ["state.json", "zero3-rank-0.safetensors", "zero3-rank-1.safetensors", "zero3.json"])
        assert (disk / "checkpoints" / "latest").read_text() == "step-000004\n"
    if strategy == "zero3":      # the copy sent over the collectives is the file its rank wrote, byte for byte
        for k in (0, 1):
            name = f"checkpoints/step-000004/zero3-rank-{k}.safetensors"
            assert (out / name).read_bytes() == (other_disk / name).read_bytes()
    assert not (other_disk / "metrics.jsonl").exists()       # only rank 0 reports
    run(separate("--steps", "6", "--resume", "latest"), world=2)
    run(mpirun(2) + train_cmd(*args, "--steps", "6", "--out", str(whole)), world=2)
    assert losses(out) == losses(whole)


def test_training_from_prepared_shards_reads_each_ranks_own_shard(tmp_path):
    from clusterctl.data.shards import prepare

    manifest = prepare("embedded:300", 2, str(tmp_path / "shards"))
    r = run(mpirun(2) + train_cmd("--data", str(tmp_path / "shards"), "--steps", "3", "--eval-every", "0",
                                  "--out", str(tmp_path / "run")), world=2)
    assert f"{manifest.tokens_per_shard:,} training tokens on rank 0" in r.stdout
    assert sorted(losses(tmp_path / "run")) == [1, 3]
    state = json.load(open(tmp_path / "run" / "checkpoints" / "step-000003" / "state.json"))
    assert state["tokenizer"] == {"type": "byte"} and state["world_size"] == 2
    r = subprocess.run(train_cmd("--data", str(tmp_path / "shards"), "--steps", "3", "--out", str(tmp_path / "one")),
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and "prepared for world size 2, this run has 1" in r.stderr, r.stderr


# ---- learning on the embedded corpus, world size check ----------------------------------------

def test_loss_falls_30_percent_on_the_embedded_corpus_over_ring(tmp_path):
    run(ring(train_cmd("--steps", "60", "--lr", "3e-3", "--report-every", "1", "--eval-every", "30",
                       "--ckpt-every", "0", "--out", str(tmp_path)), tmp_path), world=2)
    curve = losses(tmp_path)
    first, last = curve[1][0], sum(curve[s][0] for s in range(56, 61)) / 5
    assert last <= 0.7 * first, (first, last)
    held_out = [json.loads(line)["val_loss"] for line in open(tmp_path / "metrics.jsonl") if "val_loss" in line]
    assert len(held_out) == 2 and held_out[-1] <= 0.7 * first


@pytest.mark.parametrize("world_from", ["CLUSTERCTL_WORLD_SIZE", "mpirun"])
def test_ranks_that_cannot_join_the_world_fail_loudly(world_from, tmp_path):
    """MLX cannot load libmpi here (a wrong MLX_MPI_LIBNAME): every rank must stop with one line, not train
    alone as a world of one (docs/facts/mlx-distributed.md#world-of-one-fallback)."""
    forward = ["PYTHONPATH", "MLX_MPI_LIBNAME"] + (["CLUSTERCTL_WORLD_SIZE"] if world_from != "mpirun" else [])
    argv = mpirun(2, forward) + train_cmd("--steps", "1", "--out", str(tmp_path))
    env = {**ENV, "MLX_MPI_LIBNAME": "libmpi-not-here.so"}    # ENV has no CLUSTERCTL_WORLD_SIZE
    if world_from != "mpirun":
        env["CLUSTERCTL_WORLD_SIZE"] = "2"
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
    output = r.stdout + r.stderr
    said = output.count("could not form the world of 2 the launcher started")
    # mpirun aborts the job once one rank exits non-zero: the other may be killed before it says so itself
    assert said == 2 or (said == 1 and "the job has been aborted" in output), output
    assert "Traceback" not in output and not os.path.exists(tmp_path / "metrics.jsonl")


# ---- replicas proven in sync (--check-sync) ----------------------------------------------------

def test_a_replica_perturbed_on_one_rank_stops_the_run_naming_that_rank(tmp_path):
    """The test aid CLUSTERCTL_TRAIN_PERTURB=1@7 moves one parameter of rank 1 after step 7; --check-sync 5
    compares the 3 ranks' digests after step 10: the run stops there, rank 1 named (in the error and in
    trainer.json, which `clusterctl run` puts into summary.json), and nothing is named while they agree."""
    out = tmp_path / "out"
    argv = mpirun(3, forward=("PYTHONPATH", "CLUSTERCTL_WORLD_SIZE", "CLUSTERCTL_TRAIN_PERTURB")) + train_cmd(
        "--steps", "30", "--check-sync", "5", "--report-every", "1", "--eval-every", "0", "--ckpt-every", "0",
        "--out", str(out))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                       env={**ENV, "CLUSTERCTL_WORLD_SIZE": "3", "CLUSTERCTL_TRAIN_PERTURB": "1@7"})
    assert r.returncode != 0, r.stdout[-2000:]
    assert ("error: replicas out of sync after step 10: rank 1's parameters differ from the other 2 rank(s)'"
            in r.stderr), r.stderr[-3000:]
    assert max(losses(out)) == 10                     # stopped at the first check after the perturbation
    doc = json.loads((out / "trainer.json").read_text())
    assert doc["check_sync"]["out_of_sync"]["step"] == 10 and doc["check_sync"]["out_of_sync"]["ranks"] == [1]
    assert doc["check_sync"]["last_checked_step"] == 5
    quiet = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                           env={**ENV, "CLUSTERCTL_WORLD_SIZE": "3"})
    assert quiet.returncode == 0 and "out of sync" not in quiet.stderr, quiet.stderr[-2000:]


# ---- zero3 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_zero3_trains_the_same_parameters_as_data_parallel(backend, tmp_path):
    """zero3 (each rank holds 1/2 of every parameter) against dp from the same seed, with clipping (it
    clips: norms above 0.3), AdamW weight decay and 2 micro-batches per step. Tolerance: the gradient is
    the same sum in another order (per-unit reduce-scatter of per-micro-batch gradients against DP's mean
    of summed micro-batches) and the clip norm's squares are summed per slice first: measured 6e-7 on
    parameters after 10 steps (1e-5 catches a wrong slice or a missing 1/N, off by 1e-3 or more), losses
    within 1e-5 relative, grad norms 1.0e-5 (1e-4 allowed)."""
    args = ["--steps", "10", "--lr", "1e-2", "--max-norm", "0.3", "--accum", "2", "--report-every", "1",
            "--eval-every", "0", "--ckpt-every", "0", "--balance", "off"]

    def on_two(program):
        return mpirun(2) + program if backend == "mpi" else ring(program, tmp_path)

    for strategy in ("dp", "zero3"):
        run(on_two(train_cmd(*args, "--strategy", strategy, "--out", str(tmp_path / strategy))), world=2)
    dp, z3 = losses(tmp_path / "dp"), losses(tmp_path / "zero3")
    assert sorted(z3) == list(range(1, 11))
    for step in dp:
        assert z3[step][0] == pytest.approx(dp[step][0], rel=1e-5), step
        assert z3[step][1] == pytest.approx(dp[step][1], rel=1e-4), step
    assert max(norm for _, norm in dp.values()) > 0.3
    from clusterctl.train import zero3_checkpoint
    ref = mx.load(str(tmp_path / "dp" / "checkpoints" / "step-000010" / "model.safetensors"))
    got = zero3_checkpoint.full_parameters(tmp_path / "zero3" / "checkpoints" / "step-000010")
    assert set(ref) == set(got)
    diff = max(mx.abs(ref[k] - got[k]).max().item() for k in ref)
    print("zero3 against dp, max abs parameter difference:", diff)
    assert diff <= 1e-5, diff


def test_a_zero3_checkpoint_from_four_ranks_resumes_on_two_and_generates(tmp_path):
    """Re-sharding on load: 4 ranks write 4 slice files, 2 ranks read them (each rank's new slice spans two
    old files), train on from the same parameters and optimizer state, and one process assembles the full
    model for `clusterctl generate`."""
    args = ["--strategy", "zero3", "--eval-every", "0", "--report-every", "1", "--balance", "off"]
    out = tmp_path / "run"
    run(mpirun(4) + train_cmd(*args, "--steps", "4", "--out", str(out)), world=4)
    step4 = out / "checkpoints" / "step-000004"
    assert json.loads((step4 / "zero3.json").read_text())["world"] == 4
    from clusterctl.train import zero3_checkpoint
    before = zero3_checkpoint.full_parameters(step4)
    r = run(mpirun(2) + train_cmd(*args, "--steps", "6", "--resume", "latest", "--out", str(out)), world=2)
    assert "written by 4 rank(s), this run has 2" in r.stdout and "steps 5..6" in r.stdout
    step6 = out / "checkpoints" / "step-000006"
    assert json.loads((step6 / "zero3.json").read_text())["world"] == 2
    after = zero3_checkpoint.full_parameters(step6)
    assert set(before) == set(after) and all(after[k].shape == before[k].shape for k in before)
    moved = max(mx.abs(after[k] - before[k]).max().item() for k in before)
    assert 0 < moved < 0.1          # two more small steps from the same parameters, not a fresh start
    g = subprocess.run([sys.executable, "-m", "clusterctl", "generate", "--checkpoint", str(out), "--prompt",
                        "Once", "--max-tokens", "12", "--seed", "1"], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert g.returncode == 0, g.stderr
    assert g.stdout.startswith("Once") and len(g.stdout.strip()) > len("Once")


# ---- memory planning --------------------------------------------------------------------------

ISSUE_MODEL = ["--n-layers", "4", "--dim", "384", "--n-heads", "4", "--mlp-dim", "1536", "--block-size", "16",
               "--batch-size", "2"]


def test_a_run_that_does_not_fit_is_refused_before_training_and_auto_picks_what_fits(tmp_path):
    """Hosts of 200 MB (the test aid CLUSTERCTL_HOST_MEMORY, 150 MB usable): dp of the 9.5M-parameter model
    (about 250 MB a rank) is refused in one line naming zero3, before any step; --strategy auto trains
    with zero3 and its measured peak stays under the estimate's budget."""
    env = {**ENV, "CLUSTERCTL_WORLD_SIZE": "2", "CLUSTERCTL_HOST_MEMORY": "200M"}
    mpi = mpirun(2, forward=("PYTHONPATH", "CLUSTERCTL_WORLD_SIZE", "CLUSTERCTL_HOST_MEMORY"))
    flags = [*ISSUE_MODEL, "--steps", "2", "--report-every", "1", "--eval-every", "0", "--balance", "off"]
    r = subprocess.run(mpi + [sys.executable, "-m", "clusterctl.train", *flags, "--out", str(tmp_path / "dp")],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "per rank under dp at world 2; the smallest host has 200 MB (150 MB usable: 75%)" in errors[0]
    assert "zero3 at world 2 needs" in errors[0] and "pass --strategy zero3" in errors[0]
    assert not (tmp_path / "dp" / "metrics.jsonl").exists()
    r = subprocess.run(mpi + [sys.executable, "-m", "clusterctl.train", *flags, "--strategy", "auto", "--out",
                              str(tmp_path / "auto")], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "under zero3 (chosen by --strategy auto) at world 2" in r.stdout
    state = json.loads((tmp_path / "auto" / "checkpoints" / "step-000002" / "state.json").read_text())
    assert state["strategy"] == "zero3"
    peak = max(json.loads(line).get("peak_mem_mb", 0) for line in open(tmp_path / "auto" / "metrics.jsonl"))
    assert 0 < peak < 150


@pytest.mark.parametrize("strategy", ["dp", "fsdp", "zero3"])
def test_the_memory_estimate_is_within_20_percent_of_the_measured_peak(strategy, tmp_path):
    """strategies.estimate against the largest mx.get_peak_memory() of any rank (metrics.jsonl), at worlds 1 and 4,
    for the issue's parameter-dominated model: the whole model on one rank, and a quarter of it a rank (world 2
    divides by the same formula; benchmarks/bench_zero3.py measures it there)."""
    from clusterctl.train.memory import Shape
    from clusterctl.train.strategies import estimate
    shape = Shape(vocab=257, n_layers=4, dim=384, n_heads=4, mlp_dim=1536, block_size=16, batch_size=2)
    ratios = {}
    for world in (1, 4):
        out = tmp_path / f"w{world}"
        run((mpirun(world) if world > 1 else []) + train_cmd(*ISSUE_MODEL, "--strategy", strategy, "--steps", "2", "--report-every", "1",
                                      "--eval-every", "0", "--ckpt-every", "0", "--balance", "off", "--check-sync", "0",
                                      "--out", str(out)), world=world)
        peak = max(json.loads(line).get("peak_mem_mb", 0) for line in open(out / "metrics.jsonl")) * 2 ** 20
        ratios[world] = estimate(shape, strategy, world).total / peak
    print(strategy, "estimate / measured peak:", ratios)
    assert all(0.8 <= r <= 1.2 for r in ratios.values()), ratios
