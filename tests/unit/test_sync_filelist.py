"""File selection for `clusterctl sync`: gitignore rules (pure) and select_files on real directories."""
import os
import subprocess

import pytest

from clusterctl.transfer.filelist import (
    IgnoreRules,
    SyncSourceError,
    exclusion_rules,
    ignored_by_project,
    select_files,
    translate,
)
from clusterctl.transfer.rsync import rsync_argv


@pytest.mark.parametrize("patterns,path,is_dir,excluded", [
    (["*.log"], "a.log", False, True),
    (["*.log"], "deep/dir/a.log", False, True),
    (["*.log"], "a.logx", False, False),
    (["/top.txt"], "top.txt", False, True),
    (["/top.txt"], "sub/top.txt", False, False),          # anchored to the .gitignore's directory
    (["a/b.txt"], "a/b.txt", False, True),
    (["a/b.txt"], "x/a/b.txt", False, False),             # a middle slash anchors too
    (["build/"], "build", True, True),
    (["build/"], "build", False, False),                  # dir-only pattern, a file named build
    (["*.log", "!keep.log"], "keep.log", False, False),   # negation: last match wins
    (["!keep.log", "*.log"], "keep.log", False, True),
    (["**/cache"], "a/b/cache", True, True),
    (["**/cache"], "cache", True, True),
    (["docs/**"], "docs/a/b.md", False, True),
    (["a/**/z"], "a/z", False, True),
    (["a/**/z"], "a/b/c/z", False, True),
    (["file?.txt"], "file1.txt", False, True),
    (["file?.txt"], "file10.txt", False, False),
    (["[ab].py"], "a.py", False, True),
    (["[!ab].py"], "a.py", False, False),
    (["[!ab].py"], "c.py", False, True),
    (["\\#hash"], "#hash", False, True),
    (["# comment", ""], "# comment", False, False),
    (["\\!bang"], "!bang", False, True),
    (["trail   "], "trail", False, True),                # unescaped trailing spaces are dropped
    (["*.txt"], "dir.txt/inner", False, False),           # matches() looks at the path itself only
    # issue 25 item 8: a range Python's re refuses ([z-a]) was an internal error; git matches nothing with it
    # (`git check-ignore` with .gitignore `[z-a]`: neither `a` nor `z` nor `z-a` is ignored)
    (["[z-a]"], "z", False, False),
    (["[z-a]"], "z-a", False, False),
    (["[z-a]", "*.txt"], "a.txt", False, True),
])
def test_gitignore_rules(patterns, path, is_dir, excluded):
    assert IgnoreRules().add(patterns).matches(path, is_dir) is excluded


def test_excluded_parent_directory_cannot_be_negated_back():
    rules = IgnoreRules().add(["logs/", "!logs/keep.txt"])
    assert rules.excludes("logs/keep.txt") is True
    assert rules.excludes("other/keep.txt") is False


def test_rules_from_a_subdirectory_apply_only_below_it():
    rules = IgnoreRules().add(["*.tmp"], base="sub").add(["/only-here"], base="sub")
    assert rules.matches("sub/x.tmp", False) and not rules.matches("x.tmp", False)
    assert rules.matches("sub/only-here", False) and not rules.matches("sub/deeper/only-here", False)


def test_translate_skips_blanks_and_comments():
    assert translate("") is None and translate("   ") is None and translate("# x") is None
    assert translate("/") is None


def make_tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


TREE = {
    "main.py": "", "pkg/mod.py": "", "pkg/__pycache__/mod.pyc": "", "x.pyc": "", ".gitignore": "*.out\n/build/\n",
    "result.out": "", "build/lib.so": "", "sub/build/kept.txt": "", "sub/.gitignore": "secret.txt\n",
    "sub/secret.txt": "", "runs/r/log": "", "pkg/runs/code.py": "", "myenv/pyvenv.cfg": "", "myenv/lib/a.py": "",
    "venv/a.py": "", ".venv/b.py": "", ".mypy_cache/c": "", ".pytest_cache/d": "",
}
SHIPPED = [".gitignore", "main.py", "pkg/mod.py", "pkg/runs/code.py", "sub/.gitignore", "sub/build/kept.txt"]


def test_select_files_without_git(tmp_path):
    make_tree(tmp_path, TREE)
    os.symlink("main.py", tmp_path / "link")
    entries, mode = select_files(str(tmp_path), use_git=False)
    assert mode == "gitignore"
    assert [e.rel for e in entries] == sorted(SHIPPED + ["link"])
    link = next(e for e in entries if e.rel == "link")
    assert link.link == "main.py"


def test_select_files_with_git_and_user_excludes(tmp_path):
    make_tree(tmp_path, {**TREE, "untracked.txt": "", "data.bin": ""})
    subprocess.run(["git", "-C", str(tmp_path), "init", "-q"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "main.py"], check=True)
    os.unlink(tmp_path / "venv" / "a.py")
    entries, mode = select_files(str(tmp_path), excludes=["*.bin", "/untracked.txt"])
    assert mode == "git"
    assert [e.rel for e in entries] == sorted(SHIPPED)
    # what --delete must leave alone on a host: what the rules ignore, through git and ours
    kept = ignored_by_project(str(tmp_path), "git", ["a.out", "gone.py", "x.bin", "sub/secret.txt", "z.pyc"],
                              ["*.bin"])
    assert kept == {"a.out", "x.bin", "sub/secret.txt", "z.pyc"}
    assert ignored_by_project(str(tmp_path), "gitignore", ["a.out", "gone.py", "sub/secret.txt"]) == \
        {"a.out", "sub/secret.txt"}


def test_missing_directory_is_a_usage_error(tmp_path):
    with pytest.raises(SyncSourceError) as info:
        select_files(str(tmp_path / "nope"))
    assert info.value.exit_code == 2 and "no such directory" in str(info.value)
    (tmp_path / "f").write_text("")
    with pytest.raises(SyncSourceError, match="not a directory"):
        select_files(str(tmp_path / "f"))


def test_exclusion_rules_select_the_same_files_as_the_list(tmp_path):
    make_tree(tmp_path, TREE)
    entries, _ = select_files(str(tmp_path), use_git=False)
    rules = exclusion_rules(str(tmp_path), entries)
    assert "/build/" in rules and "/x.pyc" in rules and "/pkg/__pycache__/" in rules and "/myenv/" in rules
    # rsync itself applies them: exactly the selected files arrive
    dest = tmp_path.parent / (tmp_path.name + "-dest")
    rules_file = tmp_path.parent / (tmp_path.name + "-rules")
    rules_file.write_bytes("".join(r + "\0" for r in rules).encode())
    subprocess.run(rsync_argv("rsync", str(tmp_path), str(rules_file), str(dest), excludes=True), check=True,
                   capture_output=True)
    arrived = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if not p.is_dir())
    assert arrived == [e.rel for e in entries]
    (tmp_path / "pkg" / "we*ird.py").write_text("")
    assert exclusion_rules(str(tmp_path), entries) is None     # would read as a wildcard: use the list


def test_finders_and_apple_double_files_never_ship(tmp_path):
    """Finder's .DS_Store and the AppleDouble `._name` files macOS writes beside files on non-APFS volumes
    are never shipped, with or without git (docs/facts/macos.md#ds-store-and-apple-double)."""
    from clusterctl.transfer.filelist import select_files

    for rel in ("train.py", ".DS_Store", "._train.py", "pkg/.DS_Store", "pkg/._model.py", "pkg/model.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    entries, mode = select_files(str(tmp_path), ())
    assert mode == "gitignore" and sorted(e.rel for e in entries) == ["pkg/model.py", "train.py"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    entries, mode = select_files(str(tmp_path), ())
    assert mode == "git" and sorted(e.rel for e in entries) == ["pkg/model.py", "train.py"]
