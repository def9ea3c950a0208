"""Which files of a project directory `clusterctl sync` ships.

Inside a git work tree (and with git installed) git decides: `git ls-files --cached --others
--exclude-standard` is exactly what .gitignore, .git/info/exclude and the user's global excludes leave.
Elsewhere the .gitignore files are read by `IgnoreRules`, a pure implementation of the parts of
gitignore(5) a project uses: comments, escapes, negation (`!`), directory-only patterns (`dir/`),
anchored patterns (`/top`, `a/b`), `*`, `?`, `[...]` and `**`.

Whatever the mode, some things never ship (BUILTIN_EXCLUDES and any directory holding `pyvenv.cfg`), and
`--exclude` patterns (gitignore syntax, relative to the project root) are applied on top.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import SyncSourceError

# Never shipped: VCS metadata, virtualenvs, run logs, caches, bytecode, and macOS's Finder (.DS_Store) and
# AppleDouble (._name) files (docs/facts/macos.md#ds-store-and-apple-double). `/runs/` is anchored: only the
# project's top-level runs/ (where `clusterctl run` writes) is excluded, not a package named runs.
BUILTIN_EXCLUDES = (".git/", ".hg/", ".svn/", ".venv/", "venv/", "/runs/", "__pycache__/", ".pytest_cache/",
                    ".mypy_cache/", ".ruff_cache/", "*.pyc", ".clusterctl/", ".DS_Store", "._*")
GIT_TIMEOUT_S = 60


@dataclass(frozen=True)
class Rule:
    base: str            # directory of the .gitignore this came from, relative to the root ("" = root)
    regex: re.Pattern
    negate: bool
    dir_only: bool


def translate(pattern: str) -> tuple[str, bool, bool, bool] | None:
    """One gitignore line -> (regex source, negate, dir_only, anchored), or None for blanks and comments.
    The regex matches a path relative to the .gitignore's directory."""
    line = pattern.rstrip("\n")
    # trailing spaces are ignored unless escaped with a backslash
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(line) > len(stripped):
        stripped += " "
    line = stripped
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if line.startswith("**/", i) and (i == 0 or line[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif line.startswith("**", i) and i + 2 == len(line) and (i == 0 or line[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = line.find("]", i + 2 if line.startswith("[!", i) or line.startswith("[^", i) else i + 1)
            if end == -1:
                out.append(re.escape(c))
                i += 1
                continue
            body = line[i + 1:end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < len(line):
            out.append(re.escape(line[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    body = "".join(out)
    source = ("^" if anchored else "^(?:.*/)?") + body + "$"
    return source, negate, dir_only, anchored


class IgnoreRules:
    """An ordered list of gitignore rules; the last rule that matches a path decides."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []

    def add(self, lines: Iterable[str], base: str = "") -> "IgnoreRules":
        for line in lines:
            t = translate(line)
            if t is not None:
                try:
                    pattern = re.compile(t[0], re.DOTALL)
                except re.error:       # a bracket git's wildmatch cannot match either ([z-a]): a rule matching nothing
                    pattern = re.compile(r"(?!)")
                self.rules.append(Rule(base.strip("/"), pattern, t[1], t[2]))
        return self

    def matches(self, rel: str, is_dir: bool) -> bool:
        """Whether the rules exclude `rel` itself (its parents are not consulted)."""
        verdict = False
        for rule in self.rules:
            if rule.base:
                if not rel.startswith(rule.base + "/"):
                    continue
                sub = rel[len(rule.base) + 1:]
            else:
                sub = rel
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(sub):
                verdict = not rule.negate
        return verdict

    def excludes(self, rel: str, is_dir: bool = False) -> bool:
        """Whether `rel` is excluded, itself or through an excluded parent directory (which git never
        looks inside, so a negation cannot bring a file back from an excluded directory)."""
        parts = rel.split("/")
        for k in range(1, len(parts)):
            if self.matches("/".join(parts[:k]), True):
                return True
        return self.matches(rel, is_dir)


@dataclass(frozen=True)
class Entry:
    rel: str          # path relative to the project root, '/'-separated
    size: int
    mode: int         # permission bits
    link: str | None  # symlink target, or None for a regular file


def always_excluded(extra: Sequence[str] = ()) -> IgnoreRules:
    return IgnoreRules().add(BUILTIN_EXCLUDES).add(extra)


def select_files(root: str, excludes: Sequence[str] = (), use_git: bool = True) -> tuple[list[Entry], str]:
    """The files to ship from `root`, sorted, and how they were chosen ("git" or "gitignore")."""
    if not os.path.isdir(root):
        raise SyncSourceError(f"{root}: no such directory" if not os.path.exists(root) else f"{root}: not a directory")
    fixed = always_excluded(excludes)
    listed = _git_files(root) if use_git else None
    mode = "git" if listed is not None else "gitignore"
    if listed is None:
        listed = list(_walk(root, fixed))
    venvs: dict[str, bool] = {}
    entries = []
    for rel in sorted(set(listed)):
        if fixed.excludes(rel) or _in_venv(root, rel, venvs):
            continue
        entry = _entry(root, rel)
        if entry is not None:
            entries.append(entry)
    return entries, mode


def _entry(root: str, rel: str) -> Entry | None:
    try:
        st = os.lstat(os.path.join(root, rel))
    except FileNotFoundError:       # in git's index but deleted from the work tree
        return None
    if stat.S_ISLNK(st.st_mode):
        return Entry(rel, st.st_size, 0o777, os.readlink(os.path.join(root, rel)))
    if stat.S_ISREG(st.st_mode):
        return Entry(rel, st.st_size, stat.S_IMODE(st.st_mode), None)
    return None                     # sockets, fifos, a submodule's directory


def _in_venv(root: str, rel: str, cache: dict[str, bool]) -> bool:
    parts = rel.split("/")[:-1]
    for k in range(1, len(parts) + 1):
        d = "/".join(parts[:k])
        if d not in cache:
            cache[d] = os.path.isfile(os.path.join(root, d, "pyvenv.cfg"))
        if cache[d]:
            return True
    return False


def _git_files(root: str) -> list[str] | None:
    git = shutil.which("git")
    if git is None:
        return None
    try:
        proc = subprocess.run([git, "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                              capture_output=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:        # not a work tree (or a broken one): read .gitignore ourselves
        return None
    return [p for p in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _walk(root: str, fixed: IgnoreRules):
    """Every file under root that neither the .gitignore files nor `fixed` exclude."""
    rules = IgnoreRules()
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        path = os.path.join(root, rel_dir)
        gitignore = os.path.join(path, ".gitignore")
        if os.path.isfile(gitignore):
            with open(gitignore, encoding="utf-8", errors="surrogateescape") as f:
                rules.add(f.read().splitlines(), rel_dir)
        try:
            names = sorted(os.listdir(path))
        except OSError:
            continue
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            is_dir = os.path.isdir(os.path.join(root, rel)) and not os.path.islink(os.path.join(root, rel))
            if rules.matches(rel, is_dir) or fixed.matches(rel, is_dir):
                continue
            if is_dir:
                if not os.path.isfile(os.path.join(root, rel, "pyvenv.cfg")):
                    stack.append(rel)
            else:
                yield rel


def ignored_by_project(root: str, mode: str, paths: Sequence[str], excludes: Sequence[str] = ()) -> set[str]:
    """Of `paths` (remote-only files), those the project's rules exclude: `--delete` leaves them alone,
    as rsync leaves excluded files alone without --delete-excluded."""
    fixed = always_excluded(excludes)
    out = {p for p in paths if fixed.excludes(p)}
    rest = [p for p in paths if p not in out]
    if not rest:
        return out
    if mode == "git":
        proc = subprocess.run(["git", "-C", root, "check-ignore", "--stdin", "-z"], input="\0".join(rest).encode(),
                              capture_output=True, timeout=GIT_TIMEOUT_S)
        if proc.returncode in (0, 1):      # 1: none ignored
            return out | {p for p in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if p}
    rules = IgnoreRules()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not fixed.matches(d, True)]
        if ".gitignore" in filenames:
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            with open(os.path.join(dirpath, ".gitignore"), encoding="utf-8", errors="surrogateescape") as f:
                rules.add(f.read().splitlines(), "" if rel_dir == "." else rel_dir)
    return out | {p for p in rest if rules.excludes(p)}


MAX_EXCLUDE_RULES = 500
_WILDCARD = set("*?[\\\n")


def exclusion_rules(root: str, entries: Sequence[Entry]) -> list[str] | None:
    """The same selection as rsync exclude rules for a recursive transfer: `/dir/` for every directory
    holding nothing selected, `/dir/name` for every unselected file beside selected ones. rsync walks a
    tree faster than it reads a long --files-from list, so this is preferred; None (use the list) when
    the rules would be many or a name would read as an rsync wildcard."""
    selected = {e.rel for e in entries}
    dirs = {""}
    for rel in selected:
        parts = rel.split("/")[:-1]
        dirs.update("/".join(parts[:k]) for k in range(1, len(parts) + 1))
    rules: list[str] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            names = os.listdir(os.path.join(root, rel_dir))
        except OSError:
            return None
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(root, rel)
            is_dir = os.path.isdir(full) and not os.path.islink(full)
            if is_dir and rel in dirs:
                stack.append(rel)
            elif rel not in selected:
                if _WILDCARD & set(rel):
                    return None
                rules.append(f"/{rel}/" if is_dir else f"/{rel}")
                if len(rules) > MAX_EXCLUDE_RULES:
                    return None
    return sorted(rules)
