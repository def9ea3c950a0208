"""The indexes tell the truth: cli/__init__.py's list names every module of the CLI and every command app.MODULES
knows, app.MODULES knows every command the modules register, and CONTRIBUTING's layout names every module of
the trainer (issue 39: they had drifted, and a command missing from app.MODULES is never registered)."""
import importlib
import os
import re

import click

from clusterctl import cli
from clusterctl.cli import app

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PACKAGE = os.path.join(ROOT, "clusterctl")


def modules(folder: str) -> set[str]:
    return {name for name in os.listdir(os.path.join(PACKAGE, folder)) if name.endswith(".py")} - {"__init__.py"}


def test_the_cli_index_names_every_module_and_every_command():
    index = cli.__doc__
    assert {m for m in modules("cli") if m not in index} == set()
    assert {c for c in app.MODULES if not re.search(rf"(^|[ ,]){re.escape(c)}(,|$| )", index, re.M)} == set()


def test_every_registered_command_is_in_app_modules_under_its_own_module():
    for module in {m.removesuffix(".py") for m in modules("cli")}:
        importlib.import_module(f"clusterctl.cli.{module}")
    registered = {name: command.callback.__module__ for name, command in app.cli._commands.items()}
    assert {name: where.rsplit(".", 1)[1] for name, where in registered.items()} == app.MODULES
    assert all(isinstance(c, click.Command) for c in app.cli._commands.values())


def test_contributing_names_every_module_of_the_trainer():
    layout = open(os.path.join(ROOT, "CONTRIBUTING.md"), encoding="utf-8").read().split("## Layout", 1)[1]
    train = layout.split("  train/", 1)[1].split("\ndocs/", 1)[0]
    assert {m for m in modules("train") if m not in train} == set()
