"""Every option that takes seconds (metavar S) takes app.Seconds: a finite number, at least its floor. click's
FloatRange let nan through (`run --restart-delay nan` then ended in an internal error at the restart) and inf too
(a 400-digit --host-wait), and a plain float let a negative timeout through."""
import click
import pytest
from click.testing import CliRunner

from clusterctl.cli.app import Seconds, cli


def options(group: click.Group, path=()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            yield from options(cmd, (*path, name))
            continue
        for param in cmd.params:
            if isinstance(param, click.Option) and param.metavar == "S":
                yield " ".join((*path, name)), param


def test_every_option_of_seconds_takes_seconds():
    found = list(options(cli))
    assert len(found) >= 25, found    # run's and serve's, each --connect-timeout and --timeout, top's, doctor's...
    assert [(where, p.opts[0]) for where, p in found if not isinstance(p.type, Seconds)] == []


@pytest.mark.parametrize("argv, said", [
    (["run", "--restart-delay", "nan", "x.py"], "'--restart-delay': nan: give a finite number of seconds"),
    (["run", "--host-wait", "9" * 400, "x.py"], f"'--host-wait': {'9' * 400}: give a finite number of seconds"),
    (["run", "--start-timeout", "-5", "x.py"], "'--start-timeout': -5: give at least 0 seconds"),
    (["run", "--data-plane-wait", "soon", "x.py"], "'--data-plane-wait': 'soon' is not a number of seconds"),
    (["exec", "--hosts", "inv.yaml", "--connect-timeout", "0", "true"], "'--connect-timeout': 0: give more than 0 seconds"),
    (["top", "--hosts", "inv.yaml", "--interval", "0.1"], "'--interval': 0.1: give at least 0.5 seconds"),
    (["serve", "m", "--hosts", "inv.yaml", "--stall-timeout", "inf"], "'--stall-timeout': inf: give a finite number"),
])
def test_a_value_that_is_not_a_number_of_seconds_is_refused_in_one_line_before_anything_runs(argv, said):
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 2 and said in r.output, r.output
    assert [line for line in r.output.splitlines() if line.startswith("Error:")] == \
        [line for line in r.output.splitlines() if said in line]


def test_seconds_are_floats_from_the_floor_up():
    assert Seconds().convert("0", None, None) == 0.0 and Seconds(0.5).convert("2.5", None, None) == 2.5
    assert Seconds(above=True).convert(1e-3, None, None) == 0.001
