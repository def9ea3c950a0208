"""The bundled trainer's contract with `run` (clusterctl/trainer_contract.py): what the trainer writes,
run reads back, through the same functions."""
import subprocess
import sys

from clusterctl.trainer_contract import (DATA, RESUME, STRATEGY, add_run_flag, checkpoint_step, flag_value, last_step,
                                         replace_flag, report_line, reported_step, step_dir_name)


def test_the_trainers_lines_and_checkpoint_names():
    lines = ["dp on 2 rank(s): ...", "step  9/150 | loss 4.1 | lr 1e-3", "step 10 | checkpoint runs/x/step-000010",
             "step 12/150 | loss 3.9 | lr 1e-3", "Traceback (most recent call last):"]
    assert last_step(lines) == 12 and last_step(["nothing"]) is None
    assert checkpoint_step("step-000020\n") == 20 and checkpoint_step("") is None and checkpoint_step(None) is None
    assert flag_value(["--steps", "5", "--strategy", "fsdp"], STRATEGY) == "fsdp"
    assert flag_value(["--strategy=dp", "--strategy", "fsdp", "--strategy=dp"], STRATEGY) == "dp"
    assert flag_value(["--steps", "5"], STRATEGY) is None


def test_what_the_trainer_writes_run_reads_back():
    line = report_line(40, 200, loss=3.183, lr=2.92e-3, tokens_per_s=3073.2, peak_mb=14.0, grad_norm=0.5371)
    assert line == "step  40/200 | loss 3.1830 | lr 2.92e-03 | 3,073 tok/s | peak mem 14.0 MB | grad norm 0.537"
    assert reported_step(line) == 40 and reported_step("step 40 | held-out loss 3.2") is None
    assert step_dir_name(120) == "step-000120" and checkpoint_step(step_dir_name(120)) == 120
    assert checkpoint_step("step-12x") is None and checkpoint_step(".step-000001.tmp-00ab12") is None


def test_runs_own_flag_comes_first():
    args = add_run_flag(["--steps", "5", "--data", "mine"], DATA, "/w/data")
    assert args == ["--data", "/w/data", "--steps", "5", "--data", "mine"]      # the user's, last, still wins


def test_every_value_of_a_flag_is_replaced_and_nothing_else():
    args = ["--resume", "latest", "--steps", "5", "--resume=latest", "--resumed", "latest", "latest"]
    assert replace_flag(args, RESUME, "runs/x") == ["--resume", "runs/x", "--steps", "5", "--resume=runs/x",
                                                    "--resumed", "latest", "latest"]
    assert replace_flag(["--steps", "5", "--resume"], RESUME, "runs/x") == ["--steps", "5", "--resume"]
    assert flag_value(replace_flag(args, RESUME, "runs/x"), RESUME) == "runs/x"


def test_the_contract_imports_nothing_but_the_standard_library():
    code = ("import sys; import clusterctl.trainer_contract; "
            "print(sorted(m for m in ('mlx', 'click', 'rich', 'yaml') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout == "[]\n"
