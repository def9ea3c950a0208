"""What a program can do, as `run` asks it (clusterctl/program.py's Capabilities): any program of the user's, the
bundled trainer (trainer_program.py) and a served model (serve/service.py's Service), each known by its module
(run.program_for); and the one AttemptSettings a caller makes for every attempt (launch/attempts.py)."""
import pytest

from clusterctl.errors import BadInput, UsageError
from clusterctl.launch.attempts import AttemptSettings
from clusterctl.launch.restart import RestartPolicy
from clusterctl.launch.stall import StallPolicy
from clusterctl.launch.supervise import Settings
from clusterctl.program import ANY_PROGRAM, PlannedLaunch, Program
from clusterctl.run.options import RunOptions
from clusterctl.run.resolve import program_for
from clusterctl.serve.service import RANK_MODULE, Service
from clusterctl.train.memory import MemoryRefused
from clusterctl.train.prelaunch import check_before_launch
from clusterctl.train.strategies import shrink_refusal
from clusterctl.trainer_program import BundledTrainer

SERVED = Service("http://127.0.0.1:8080", "tiny", "/m/tiny", None, "pipeline")
# a model of ~100 MB per rank under dp (tests/unit/test_memory_plan.py's)
MODEL = ("--n-layers", "4", "--dim", "384", "--n-heads", "4", "--mlp-dim", "1536", "--block-size", "16",
         "--batch-size", "2")


def test_a_programs_kind_comes_from_the_module_it_runs():
    trainer = program_for(None, ("--steps", "5"), None)
    assert trainer == Program(None, "clusterctl.train", ("--steps", "5")) and isinstance(trainer.kind, BundledTrainer)
    assert isinstance(program_for(None, (), "clusterctl.train").kind, BundledTrainer)       # named, or by default
    for other in (program_for("train.py", (), None), program_for(None, ("lora",), "mlx_lm"),
                  program_for(None, (), RANK_MODULE)):             # a service is known only where serve says so
        assert other.kind is ANY_PROGRAM
    assert program_for(None, ("{}",), RANK_MODULE, (BundledTrainer(), SERVED)).kind is SERVED
    # the kinds a caller gives are the ones known: the CLI's trainer carries its checks before a launch
    checked = BundledTrainer(prelaunch=check_before_launch)
    assert program_for(None, (), None, (checked,)).kind is checked and RunOptions().kinds == (BundledTrainer(),)


def test_any_program_is_asked_nothing_and_given_its_arguments_as_they_are():
    kind = ANY_PROGRAM
    args = ("--model", "m", "--data", "d", "--resume", "latest", "--strategy", "fsdp")
    assert (kind.reads_stdin, kind.copies_project, kind.resumes_from_checkpoints, kind.pictures_loss,
            kind.checks_before_launch) == (True, True, False, False, False)
    assert kind.inputs(args, run_gives_data=False) == [] and kind.with_data(args, "/w/d") == list(args)
    assert not kind.asks_latest(args) and kind.resuming_from(args, "runs/x") == list(args)
    assert kind.shrink_refusal(args) is None and kind.service is None
    assert kind.describe(args) == {"kind": "program", "model": None, "strategy": None}
    kind.check(PlannedLaunch(args, 1, {}, {}, None, "/p", None))          # nothing to refuse
    assert Program("s.py", None, ("a",)).rank_args("/w/d") == ["a"] and not Program("s.py", None, ()).ships_clusterctl


def test_the_bundled_trainer_says_what_it_reads_how_it_resumes_and_what_cannot_shrink():
    kind = BundledTrainer()
    assert (kind.reads_stdin, kind.copies_project, kind.resumes_from_checkpoints, kind.pictures_loss) == \
        (False, True, True, True)
    args = ("--model", "models/m", "--data=d", "--steps", "5")
    assert kind.inputs(args, run_gives_data=False) == [("--data", "d")]     # --model goes to the hosts' stores
    assert kind.inputs(args, run_gives_data=True) == []                      # run's --data is its own
    assert kind.store_model(args) == "models/m" and kind.store_model(("--steps", "5")) is None
    assert kind.with_store_model(args, "/hf/snap") == ["--model", "/hf/snap", "--data=d", "--steps", "5"]
    assert kind.inputs(("--steps", "5"), run_gives_data=False) == []
    assert kind.with_data(("--steps", "5"), "/w/d") == ["--data", "/w/d", "--steps", "5"]   # a later one of the user's wins
    assert kind.asks_latest(("--resume", "latest")) and not kind.asks_latest(("--resume", "latest", "--out", "mine"))
    assert not kind.asks_latest(("--resume", "runs/x"))
    assert kind.resuming_from(("--resume", "latest", "--steps", "9"), "runs/a") == ["--resume", "runs/a", "--steps", "9"]
    assert kind.shrink_refusal(("--strategy", "fsdp")) is None     # the CLI gives it the trainer's registry
    kind = BundledTrainer(strategy_shrink=shrink_refusal)
    assert "FSDP's optimizer state is sharded" in kind.shrink_refusal(("--strategy", "fsdp"))
    assert kind.shrink_refusal(("--strategy", "fsdp", "--strategy=dp")) is None
    assert kind.shrink_refusal(("--strategy", "zero3")) is None and kind.shrink_refusal(("--steps", "5")) is None
    assert kind.describe(("--model", "m", "--strategy", "zero3")) == {"kind": "fine-tune", "model": "m", "strategy": "zero3"}
    program = program_for(None, ("--steps", "5"), None)
    assert program.rank_args("/w/d") == ["clusterctl.train", "--data", "/w/d", "--steps", "5"] and program.ships_clusterctl


def test_the_trainers_checks_before_a_launch_see_the_planned_launch_and_the_inventorys_memory(tmp_path):
    """The CLI hands the trainer's own checks (train/prelaunch.py) to its kind; run gives them the launch as planned,
    the inventory's CLUSTERCTL_HOST_MEMORY among each host's env."""
    assert not BundledTrainer().checks_before_launch
    BundledTrainer().check(PlannedLaunch(MODEL, 2, {"h1": 1}, {}, "Linux", str(tmp_path), None))    # none given
    kind = BundledTrainer(prelaunch=check_before_launch)
    big = 16 * 2 ** 30
    planned = PlannedLaunch(MODEL, 2, {"h1": big, "h2": big}, {"h1": {}, "h2": {"OTHER": "x"}}, "Linux", str(tmp_path), None)
    assert kind.checks_before_launch
    kind.check(planned)
    small = PlannedLaunch(MODEL, 2, {"h1": big, "h2": big}, {"h1": {}, "h2": {"CLUSTERCTL_HOST_MEMORY": "200M"}},
                          "Linux", str(tmp_path), None)
    with pytest.raises(MemoryRefused, match="the smallest host has 200 MB") as info:
        kind.check(small)
    assert isinstance(info.value, BadInput) and info.value.exit_code == 2
    with pytest.raises(BadInput, match=f"^--model {tmp_path}/m: "):      # a fine-tune's inputs, read in the project
        kind.check(PlannedLaunch(("--model", "m"), 1, {}, {}, "Linux", str(tmp_path), None))
    with pytest.raises(BadInput, match="^--adapter lora adapts a model: give it with --model DIR"):   # nothing starts
        kind.check(PlannedLaunch(("--adapter", "lora", "--data", "d"), 1, {}, {}, "Linux", str(tmp_path), None))


def test_a_fine_tunes_global_batch_that_the_world_does_not_divide_is_refused_before_a_launch(tmp_path):
    """mlx-lm's --batch-size is the global batch: 4 records a step cannot go to 3 ranks; refused here in the ranks'
    words (a detached run would otherwise hand its supervisor a job every rank refuses)."""
    lmfixture = pytest.importorskip("lmfixture")
    pytest.importorskip("mlx_lm")
    made = lmfixture.make_inputs(tmp_path / "made")
    kind = BundledTrainer(prelaunch=check_before_launch)
    args = ("--model", str(made["llama"]), "--adapter", "lora", "--data", str(made["chat"]), "--batch-size", "4")
    with pytest.raises(BadInput, match="^--batch-size 4 is the global batch .* which 3 ranks cannot share equally: "
                                       "give a multiple of 3$"):
        kind.check(PlannedLaunch(args, 3, {}, {}, "Linux", str(tmp_path), None))
    kind.check(PlannedLaunch(args, 2, {}, {}, "Linux", str(tmp_path), None))          # 2 ranks share 4


def test_a_service_copies_no_project_reads_no_stdin_and_is_recorded_as_what_it_serves():
    assert (SERVED.reads_stdin, SERVED.copies_project, SERVED.resumes_from_checkpoints, SERVED.pictures_loss) == \
        (False, False, False, False)
    assert SERVED.describe(("{}", "--port", "1")) == {"kind": "serve", "model": "tiny", "strategy": "pipeline"}
    assert SERVED.service == {"url": "http://127.0.0.1:8080", "model": "tiny", "model_dir": "/m/tiny", "listen": None,
                              "strategy": "pipeline"}
    assert Program(None, RANK_MODULE, (), SERVED).ships_clusterctl


def test_one_settings_object_for_every_attempt_and_a_services_progress_added_to_it():
    given = AttemptSettings(runs_dir="r", launch_from="here", restart=RestartPolicy(2, 1.0),
                            watch=Settings(rank0_only=True, hang_timeout=9.0, stall=StallPolicy.parse(30)))

    def health():
        return None

    watched = given.with_progress(health)
    assert watched.watch.stall.health is health and watched.watch.stall.fixed == 30.0
    assert (watched.runs_dir, watched.restart, watched.watch.rank0_only, watched.watch.hang_timeout) == \
        ("r", RestartPolicy(2, 1.0), True, 9.0)
    off = AttemptSettings(watch=Settings(stall=StallPolicy.parse(0)))
    assert off.with_progress(health) is off and off.watch.stall.health is None      # the watchdog off: as it was
    assert AttemptSettings().with_progress(health).watch.stall == StallPolicy()     # adaptive, from the first answer
    with pytest.raises(UsageError, match="--stall-timeout -1"):
        StallPolicy.parse(-1)
