"""`clusterctl run`'s command line: what is clusterctl's and what is the program's (cli/runwords.py)."""

import clirun
import pytest

from clusterctl.cli.launch import run_cmd
from clusterctl.cli.runwords import LAUNCH_ONLY, RunCommand, split_run_words
from clusterctl.errors import UsageError
from clusterctl.run.resolve import program_for


@pytest.fixture(scope="module")
def takes_value():
    """The option table RunCommand builds from run's own click options."""
    table = run_cmd.takes_value()
    assert table["--hosts"] is True and table["--dry-run"] is False and table["-m"] is True
    return table


def split(line, takes_value):
    w = split_run_words(line.split(), takes_value)
    return " ".join(w.options), w.script, w.module, " ".join(w.args), " ".join(w.trailing)


def test_everything_after_the_program_is_the_programs(takes_value):
    assert split("--hosts inv.yaml -m pkg train --out d --steps 20", takes_value) == \
        ("--hosts inv.yaml", None, "pkg", "train --out d --steps 20", "")
    # the program's own --data, --backend and --help are its own after the program
    assert split("--hosts i train.py --data x --backend ring --help", takes_value) == \
        ("--hosts i", "train.py", None, "--data x --backend ring --help", "")
    assert split("-mpkg.sub a", takes_value)[2:4] == ("pkg.sub", "a")
    assert split("--module=pkg a -m b", takes_value)[2:4] == ("pkg", "a -m b")


def test_double_dash_keeps_working(takes_value):
    assert split("-m pkg -- sub --x", takes_value) == ("", None, "pkg", "sub --x", "")
    assert split("--hosts i -- --steps 5", takes_value) == ("--hosts i", None, None, "--steps 5", "")
    assert split("train.py -- -- --x", takes_value)[3] == "-- --x"           # as python would
    # the older spelling: SCRIPT [clusterctl options] -- ARGS
    assert split("train.py --hosts i --backend mpi -- --lr 3", takes_value) == \
        ("--hosts i --backend mpi", "train.py", None, "--lr 3", "")
    # ... only when every word before -- is clusterctl's
    assert split("train.py sub --hosts i -- --lr 3", takes_value)[3] == "sub --hosts i -- --lr 3"


def test_a_trailing_block_of_launch_options_is_taken_and_reported(takes_value):
    """mlx.launch-style lines: the block must start with an option naming the launch and hold nothing
    but clusterctl options; otherwise the words stay the program's."""
    assert split("-m pkg train --out o --steps 20 --hosts inv.yaml --backend ring", takes_value) == \
        ("--hosts inv.yaml --backend ring", None, "pkg", "train --out o --steps 20", "--hosts inv.yaml --backend ring")
    assert split("train.py --data x", takes_value)[3] == "--data x"              # not a launch option: the program's
    assert split("train.py --hosts i extra", takes_value)[3] == "--hosts i extra"  # not at the very end
    assert split("train.py --backend ring --hosts i", takes_value)[4] == "--hosts i"
    assert "--data" not in LAUNCH_ONLY and "--backend" not in LAUNCH_ONLY and "--dry-run" not in LAUNCH_ONLY


def test_module_names_are_checked_before_anything_starts():
    assert program_for(None, ("a",), "pkg.sub_2").module == "pkg.sub_2"
    for bad, hint in (("pkg/train", "clusterctl run pkg/train"), ("a b", None), ("1pkg", None), ("pkg.", None)):
        with pytest.raises(UsageError, match="is not a module name") as info:
            program_for(None, (), bad)
        assert hint is None or hint in str(info.value)


def test_help_shows_both_forms_and_a_module_with_a_subcommand():
    r = clirun.clusterctl("run", "--help", timeout=60)
    assert r.returncode == 0
    assert r.stdout.startswith("Usage: clusterctl run [OPTIONS] [SCRIPT | -m MODULE] [ARGS]...")
    assert "clusterctl run [OPTIONS] -m MODULE [ARGS]..." in r.stdout and "-m mlx_lm lora --train" in r.stdout
    assert isinstance(run_cmd, RunCommand)


def test_which_of_the_trainers_inputs_run_copies_and_which_the_hosts_must_hold(tmp_path):
    """Issue 45: what the pre-flight looks for on the hosts before copying anything (run/resolve.py program_inputs,
    of the inputs the program's kind names): the bundled trainer's --data unless it is a relative path inside the
    project run copies. Its --model is not one of them: run puts it into the hosts' model stores (issue 41,
    run/resolve.py model_here: a directory here; a hub id resolved in the hub's cache here)."""
    from clusterctl.run.options import RunOptions
    from clusterctl.run.resolve import model_here, program_inputs

    project = tmp_path / "proj"
    (project / "models" / "m").mkdir(parents=True)
    (project / "out").symlink_to(tmp_path)              # a link that leads out of the project

    def inputs(args, **options):
        return program_inputs(program_for(None, tuple(args.split()), None), RunOptions(**options), str(project))

    assert inputs("--model models/m --data d") == [("--data", "d", True)]
    assert inputs(f"--model={tmp_path}/m --data ../d") == [("--data", "../d", False)]
    assert inputs("--data d", sync=False) == [("--data", "d", False)]        # --no-sync copies nothing
    assert inputs("--model /m --data d", data_dir="shards") == []          # run's --data is its own
    program = program_for(None, ("--model", "models/m"), None)
    assert model_here(program, str(project)) == (program, str(project / "models" / "m"))
    assert model_here(program_for(None, ("--model", "/nowhere/m"), None), str(project))[1] is None   # on the hosts
    assert model_here(program_for(None, ("--steps", "5"), None), str(project))[1] is None
    assert program_inputs(program_for("train.py", ("--model", "/m"), None), RunOptions(), str(project)) == []


def test_env_options_take_a_value_or_this_machines_and_refuse_in_one_line():
    from clusterctl.run.envflags import parse_env_options

    here = {"HF_TOKEN": "hf_x", "EMPTY": ""}
    assert parse_env_options(["FOO=bar", "HF_TOKEN", "EMPTY", "EQ=a=b", "FOO=baz", "BLANK="], here) == (
        ("FOO", "baz"), ("HF_TOKEN", "hf_x"), ("EMPTY", ""), ("EQ", "a=b"), ("BLANK", ""))
    with pytest.raises(UsageError, match=r"^--env MISSING: MISSING is not set on this machine; give its value "):
        parse_env_options(["MISSING"], here)
    for bad in ("1X=2", "A-B=c", "=v", "$(touch x)=1"):
        with pytest.raises(UsageError, match="is not a variable name"):
            parse_env_options([bad], here)


def test_env_options_go_the_inventorys_way_and_win_over_it(tmp_path):
    from clusterctl.inventory import load

    (tmp_path / "inv.yaml").write_text("defaults:\n  env:\n    FOO: inv\n    KEEP: k\nhosts:\n  - name: a\n"
                                       "  - name: b\n    env:\n      FOO: b-own\n")
    cluster = load(str(tmp_path / "inv.yaml")).with_env({"FOO": "cli", "HF_TOKEN": "hf_secret"})
    assert [h.env_dict for h in cluster.hosts] == [{"FOO": "cli", "KEEP": "k", "HF_TOKEN": "hf_secret"}] * 2
    assert cluster.secrets == ["hf_secret"]                     # redacted in records, as an inventory secret
    assert load(str(tmp_path / "inv.yaml")).with_env({}) == load(str(tmp_path / "inv.yaml"))
