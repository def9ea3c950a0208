"""docs/cli.md, the command reference, written from the commands' own click definitions: every command and
subcommand, its usage line and help, and every option with its value, default and choices; then the bundled
trainer's flags (`python -m clusterctl.train`, which `clusterctl run -- ARGS` passes on), one row per field of
train/config.py's TrainConfig with the flag, its value, its default and its help as the trainer's own argparse
parser has them, and the flags that are only mlx-lm's names; then the exit codes, from errors.py's EXIT_CODES.
Nothing in it is written by hand, so an option cannot exist undocumented: a test
(tests/unit/test_cli_reference.py) writes it again and compares.

    .venv/bin/python -m clusterctl.cli.reference            # rewrite docs/cli.md
    .venv/bin/python -m clusterctl.cli.reference --check    # exit 1, naming the difference, if it is stale
"""
from __future__ import annotations

import difflib
import inspect
import os
import sys

import click

from ..errors import EXIT_CODES

PATH = os.path.join("docs", "cli.md")
HEADER = """# Command reference

Every command and option, as `clusterctl --help` knows them: written from the commands' own definitions by
`python -m clusterctl.cli.reference` (do not edit by hand; a test checks it is current). Every command also takes
`-h` / `--help`. The guide pages tell
how to use them: [run](run.md), [serve](serve.md), [models](models.md), [doctor](doctor.md), [setup](setup.md),
[sync and data](sync-and-data.md), [bench](bench.md), [observe](observe.md), [fine-tuning](finetune.md). The
bundled trainer's own flags (what `clusterctl run -- ARGS` passes to it) are in
[the trainer's flags](#the-trainers-flags), written from its settings' definitions the same way.
"""
TRAINER_HEADER = """## The trainer's flags

`python -m clusterctl.train` (the bundled trainer; through `clusterctl run`, the words after `--`), one flag per
setting of `TrainConfig` (clusterctl/train/config.py), as its `--help` gives them. A setting may also be given by
the same name in a `--config FILE` (`-c`; `_` or `-`). Precedence: flags > `--config` > a resumed checkpoint's
settings > the preset (a fine-tune, `--model`: mlx-lm's defaults) > the defaults below. How to use them:
[the trainer](trainer.md), [fine-tuning](finetune.md), [mlx-lm's names](from-mlx-lm.md).
"""


def _text(help_text: str | None) -> str:
    """click's help text as Markdown: \\b paragraphs (kept as click prints them) become code blocks."""
    if not help_text:
        return ""
    out = []
    for para in inspect.cleandoc(help_text).split("\n\n"):
        if para.startswith("\b\n"):
            out.append("```\n" + para[2:] + "\n```")
        else:
            out.append(" ".join(para.split()))
    return "\n\n".join(out)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _metavar(param: click.Option, ctx: click.Context) -> str:
    try:
        return param.make_metavar(ctx)                      # click >= 8.2
    except TypeError:
        return param.make_metavar()                         # type: ignore[call-arg]


def _command(cmd: click.Command, path: list[str], parent: click.Context, out: list[str]) -> None:
    ctx = click.Context(cmd, info_name=path[-1], parent=parent)
    out.append(f"{'#' * min(len(path) + 1, 4)} {' '.join(path)}\n")
    out.append("```\n" + cmd.get_usage(ctx).split(":", 1)[1].strip() + "\n```\n")
    text = _text(cmd.help)
    if text:
        out.append(text + "\n")
    rows = []
    for param in cmd.get_params(ctx):
        # -h/--help is every command's (said once, in the header): click builds it from the context it first saw
        # and keeps it, so its row would depend on what ran before in this process
        if isinstance(param, click.Option) and not param.hidden and param is not cmd.get_help_option(ctx):
            names = ", ".join(f"`{n}`" for n in param.opts + param.secondary_opts)
            if param.is_flag and not param.count:
                value = ""
            elif isinstance(param.type, click.Choice):
                value = " \\| ".join(f"`{c}`" for c in param.type.choices)
            else:
                value = f"`{param.metavar or _metavar(param, ctx)}`"
            default = param.default
            unset = default is None or default == () or callable(default) or type(default).__name__ == "Sentinel"
            shown = "" if param.is_flag or unset else f"`{default}`"
            repeat = " (repeatable)" if param.multiple and "repeatable" not in (param.help or "").lower() else ""
            rows.append(f"| {names} | {value} | {shown} | {_cell((param.help or '') + repeat)} |")
    if rows:
        out.append("| option | value | default | what it does |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                _command(sub, path + [name], ctx, out)


def _trainer_flags(out: list[str]) -> None:
    """The trainer's section: a row per TrainConfig field (the flag and its mlx-lm alias, its value, its default, its
    help), read from the trainer's argparse parser, which is built from the fields; then the flags that are mlx-lm's
    names only (no field of their own)."""
    from dataclasses import fields

    from ..train.config import TrainConfig, build_parser

    actions = {a.dest: a for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    out.append(TRAINER_HEADER)
    rows = []
    for f in fields(TrainConfig):
        action = actions[f.name]
        help_text = f.metadata["help"]
        said = action.help[len(help_text):].strip()         # build_parser appends " (default: ...)"
        if not said.startswith("(default: "):            # --preset's help states its default itself
            said = help_text[help_text.rfind("(default: "):] if help_text.endswith(")") else ""
        default = said[len("(default: "):-1] if said.startswith("(default: ") else ""
        kind = str(f.type).replace(" | None", "")
        if action.choices:
            value = " \\| ".join(f"`{c}`" for c in action.choices)
        else:
            value = f"`{_cell(action.metavar or 'TEXT')}`" + (f" ({kind})" if kind in ("int", "float") else "")
        if action.nargs == "?":
            value += f"; alone: `{action.const}`"
        names = ", ".join(f"`{n}`" for n in action.option_strings)
        # argparse's help is a %-format: 10%% is printed 10%
        rows.append(f"| {names} | {value} | {_cell(default)} | {_cell(help_text.replace('%%', '%'))} |")
    out.append("| flag | value | default | what it does |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")
    own = {f.name for f in fields(TrainConfig)}
    rows = []
    for dest, action in actions.items():
        if dest not in own:
            value = " \\| ".join(f"`{c}`" for c in action.choices) if action.choices else f"`{_cell(action.metavar)}`"
            rows.append(f"| {', '.join(f'`{n}`' for n in action.option_strings)} | {value} | {_cell(action.help)} |")
    out.append("mlx-lm's names with no setting of their own ([from mlx-lm](from-mlx-lm.md)):\n")
    out.append("| flag | value | what it does |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")


def reference() -> str:
    """docs/cli.md's text (pure: the same commands give the same text)."""
    from .app import cli

    out = [HEADER]
    _command(cli, ["clusterctl"], None, out)
    _trainer_flags(out)
    out.append("## Exit codes\n")
    out.append("Every command exits with one of these (errors.py); errors are one line on stderr (`--debug`: the "
               "traceback).\n")
    out.append("| code | meaning |\n| --- | --- |\n" + "\n".join(f"| {code} | {_cell(meaning)} |"
                                                           for code, meaning in EXIT_CODES.items()) + "\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = reference()
    if "--check" in args:
        try:
            with open(PATH, encoding="utf-8") as f:
                current = f.read()
        except OSError:
            current = ""
        if current == text:
            return 0
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), PATH, "generated", lineterm="", n=1)
        print("\n".join(list(diff)[:60]), file=sys.stderr)
        print(f"{PATH} is not what the commands say: run `python -m clusterctl.cli.reference`", file=sys.stderr)
        return 1
    with open(PATH, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
