"""`clusterctl run`'s command line split: clusterctl's own words, the program (SCRIPT, `-m MODULE` or the bundled
trainer) and the program's arguments (split_run_words, which RunCommand, run's click parser, applies before click
parses clusterctl's options alone), and the words a detached run's supervisor is started with (supervisor_argv).
All pure."""
from __future__ import annotations

from dataclasses import dataclass

import click


# Options that name the launch itself, never a program's: a block of clusterctl options written after the
# program's arguments (mlx.launch style) is taken as clusterctl's only when it starts with one of these.
LAUNCH_ONLY = ("--hosts", "--fetch", "--fetch-all-ranks", "--launcher", "--launch-from", "--no-sync", "--no-fetch",
               "--no-preflight", "--rank0-only", "--plain", "--start-timeout", "--hang-timeout", "--stall-timeout",
               "--runs-dir", "--no-stdin", "--direct", "--env",
               "--max-restarts", "--restart-delay", "--elastic", "--elastic-batch")


@dataclass(frozen=True)
class RunWords:
    """`clusterctl run`'s command line, split: clusterctl's own words, the program (SCRIPT, or `-m` MODULE,
    or neither: the bundled trainer) and the program's arguments."""

    options: list[str]
    script: str | None
    module: str | None
    args: list[str]
    trailing: list[str]          # clusterctl options taken from the end of the line (a note says so)


def split_run_words(words: list[str], takes_value: dict[str, bool]) -> RunWords:
    """Split run's words (pure). Everything after SCRIPT or `-m MODULE` belongs to the program, as with
    `python -m` and torchrun; `clusterctl run [OPTIONS] -- ARGS` gives ARGS to the bundled trainer. Two
    older spellings still work: `SCRIPT [OPTIONS] -- ARGS` (the words between the program and `--` are all
    clusterctl options), and a block of clusterctl options at the very end of the line that starts with an
    option naming the launch (LAUNCH_ONLY: --hosts, --fetch, ...), which the caller reports as taken.
    `takes_value` maps each option spelling to whether it takes a value."""
    options, i = [], 0
    script = module = None
    while i < len(words):
        word = words[i]
        if word == "--":
            return RunWords(options, None, None, words[i + 1:], [])
        name, eq, _ = word.partition("=")
        if word in ("-m", "--module") and i + 1 < len(words):
            module, i = words[i + 1], i + 2
            break
        if name == "--module" and eq or word.startswith("-m") and len(word) > 2 and not word.startswith("--"):
            module, i = (word.split("=", 1)[1] if eq else word[2:]), i + 1
            break
        if not word.startswith("-") or word == "-":
            script, i = word, i + 1
            break
        options.append(word)
        if takes_value.get(name) and not eq and i + 1 < len(words):
            options.append(words[i + 1])
            i += 1
        i += 1
    rest = words[i:]
    if rest[:1] == ["--"]:
        return RunWords(options, script, module, rest[1:], [])
    if "--" in rest:
        k = rest.index("--")
        if k and _all_options(rest[:k], takes_value):
            return RunWords(options + rest[:k], script, module, rest[k + 1:], [])
    for start, word in enumerate(rest):
        if word.partition("=")[0] in LAUNCH_ONLY and _all_options(rest[start:], takes_value):
            return RunWords(options + rest[start:], script, module, rest[:start], rest[start:])
    return RunWords(options, script, module, rest, [])


def _all_options(words: list[str], takes_value: dict[str, bool]) -> bool:
    """Whether `words` are entirely clusterctl options, each with its value."""
    i = 0
    while i < len(words):
        name, eq, _ = words[i].partition("=")
        if name not in takes_value or name in ("-m", "--module"):
            return False
        i += 2 if takes_value[name] and not eq else 1
        if i > len(words):
            return False
    return True


# what a detached run's supervisor is not given of the run's own words (supervisor_argv): what applies
# here only (the inventory's path, this machine's --env and stdin, the staging that happened here, the detach
# itself), each replaced by what the supervisor does instead (SUPERVISOR_WORDS)
HERE_ONLY = frozenset({"--hosts", "--env", "--runs-dir", "--data", "--all-shards", "--direct", "--no-sync",
                       "--no-stdin", "--plain", "--dry-run", "--detach", "--supervisor", "--handoff"})


def supervisor_argv(words: RunWords, takes_value: dict[str, bool], runs_dir: str) -> list[str]:
    """The words of `run` that the supervisor of this run, detached, runs with (pure): clusterctl's options less
    HERE_ONLY (in any spelling: --opt VALUE, --opt=VALUE), then its own (no copy: staged; no stdin; its runs
    directory; plain output, no terminal), then the program as given."""
    out, i, given = [], 0, words.options
    while i < len(given):
        word = given[i]
        name = word.split("=", 1)[0] if word.startswith("--") else word
        skip_value = takes_value.get(name, False) and "=" not in word
        if name in HERE_ONLY:
            i += 2 if skip_value else 1
            continue
        out.extend(given[i:i + (2 if skip_value else 1)])
        i += 2 if skip_value else 1
    out += ["--no-sync", "--no-stdin", "--plain", "--runs-dir", runs_dir]
    if words.module is not None:
        return [*out, "-m", words.module, *words.args]
    if words.script is not None:
        return [*out, words.script, *words.args]
    return [*out, "--", *words.args]


class RunCommand(click.Command):
    """`run`'s parser: split_run_words decides what is clusterctl's and what is the program's; click then
    parses clusterctl's options alone, and the program's words arrive untouched."""

    def collect_usage_pieces(self, ctx):
        return ["[OPTIONS]", "[SCRIPT | -m MODULE] [ARGS]..."]

    def takes_value(self) -> dict[str, bool]:
        """Every spelling of run's options -> whether it takes a value (what split_run_words needs)."""
        return {opt: not param.is_flag and not param.count for param in self.params
                if isinstance(param, click.Option) for opt in (*param.opts, *param.secondary_opts)}

    def parse_args(self, ctx, args):
        words = split_run_words(list(args), self.takes_value())
        ctx.meta["clusterctl.run"] = words
        return super().parse_args(ctx, [*words.options, "--"])
