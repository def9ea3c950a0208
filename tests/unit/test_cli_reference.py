"""docs/cli.md is what the commands say (cli/reference.py writes it from their click definitions), and the exit
codes the pages give are errors.py's."""
import re
from pathlib import Path

import click

from clusterctl import errors
from clusterctl.cli.app import cli
from clusterctl.cli.reference import main, reference

REPO = Path(__file__).resolve().parents[2]


def test_the_reference_is_what_the_commands_say():
    assert (REPO / "docs" / "cli.md").read_text(encoding="utf-8") == reference(), \
        "docs/cli.md is stale: run `.venv/bin/python -m clusterctl.cli.reference`"


def every_option(group, path=("clusterctl",)):
    ctx = click.Context(group, info_name=path[-1])
    for param in group.get_params(ctx):
        if isinstance(param, click.Option) and not param.hidden and param is not group.get_help_option(ctx):
            yield path, param.opts[0]
    if isinstance(group, click.Group):
        for name in group.list_commands(ctx):
            yield from every_option(group.get_command(ctx, name), path + (name,))


def test_every_command_and_option_has_its_row_under_its_heading():
    text = reference()
    sections = dict(re.findall(r"^#+ (clusterctl[\w -]*)\n(.*?)(?=^#+ clusterctl|^## Exit codes)", text, re.M | re.S))
    found = list(every_option(cli))
    assert len(found) > 150
    for path, option in found:
        assert f"| `{option}`" in sections[" ".join(path)], (path, option)


def test_check_says_when_the_page_is_stale(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cli.md").write_text("old\n")
    assert main(["--check"]) == 1 and "is not what the commands say" in capsys.readouterr().err
    assert main([]) == 0 and main(["--check"]) == 0


def test_every_exit_code_is_in_the_table_and_the_readme_gives_the_same_codes():
    constants = {getattr(errors, n) for n in dir(errors) if n.startswith("EXIT_") and isinstance(getattr(errors, n), int)}
    assert constants == set(errors.EXIT_CODES)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Exit codes", 1)[1].split("\n\n", 2)[1]
    codes = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert codes == set(errors.EXIT_CODES), codes


def test_a_copy_that_could_not_reach_its_hosts_exits_as_the_preflight_does():
    """A host not reached is exit 3 whichever of run's steps finds it (the pre-flight, or the project's copy when
    the launch does not wait for it); a copy that failed otherwise is 1."""
    import pytest

    from clusterctl.errors import EXIT_CONNECT, EXIT_FAILED, ConnectError, StageError, SyncError
    from clusterctl.hosts.fanout import GroupResult, HostOutcome
    from clusterctl.inventory import parse
    from clusterctl.transfer.stage import _check

    a, b = parse("hosts: [{name: a}, {name: b}]\n", "i.yaml").hosts
    refused = ConnectError("b", "connection refused")
    for outcomes, code in (([HostOutcome(a, value=1), HostOutcome(b, error=refused)], EXIT_CONNECT),
                           ([HostOutcome(a, error=SyncError("a: disk full")), HostOutcome(b, error=refused)], EXIT_FAILED)):
        with pytest.raises(StageError) as caught:
            _check(GroupResult(outcomes), "the project")
        assert caught.value.exit_code == code and str(caught.value).startswith("could not copy the project: ")


def test_every_trainer_flag_has_its_row_in_the_trainer_s_section():
    """docs/cli.md lists the bundled trainer's flags: one row per TrainConfig field (with its mlx-lm alias), its
    default as the trainer's --help gives it, and the flags that are only mlx-lm's names."""
    from dataclasses import fields

    from clusterctl.train.config import ALIASES, TrainConfig, build_parser, flag

    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    section = page.split("\n## The trainer's flags\n", 1)[1].split("\n## Exit codes\n", 1)[0]
    rows = {line.split(" | ", 1)[0]: line for line in section.splitlines() if line.startswith("| `-")}
    assert len(fields(TrainConfig)) > 50
    for f in fields(TrainConfig):
        names = ", ".join(f"`{n}`" for n in [f"--{flag(f.name)}"] + ALIASES.get(f.name, []))
        row = rows.get(f"| {names}")
        assert row is not None, f"--{flag(f.name)} has no row in docs/cli.md's trainer section"
        first_words = " ".join(f.metadata["help"].replace("%%", "%").split())[:40].replace("|", "\\|")
        assert first_words in row, (f.name, row)
    parser_flags = {n for a in build_parser()._actions for n in a.option_strings} - {"-h", "--help"}
    listed = {n for key in rows for n in key[2:].replace("`", "").split(", ")}
    assert parser_flags == listed, parser_flags ^ listed
    assert "| `--steps` | `N` (int) | the preset's: tiny 400," in section
