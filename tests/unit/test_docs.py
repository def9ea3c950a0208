"""The documentation holds together: every `docs/<page>.md#<anchor>` cited in code, tests, templates,
benchmarks and docs names a file that exists and a heading whose GitHub anchor is that one, every relative
link in a Markdown page resolves, and the README stays a front door (at most 200 lines, Quickstart A's two
commands first, the second being what CI runs).

Comments cite the evidence log by anchor (docs/facts/README.md): a heading renamed or a page moved would
otherwise leave citations pointing nowhere, silently.
"""
import json
import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCOPES = ("clusterctl", "tests", "benchmarks", "templates", "inventory", "docs", ".ci")
TOP_FILES = ("README.md", "CONTRIBUTING.md", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".tmpl", ".yaml", ".yml", ".txt", ""}
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".venv", "results"}
THIS_FILE = os.path.abspath(__file__)

# A citation from the repository root: docs/run.md, docs/facts/ssh.md#all-to-all-ssh, README.md#exit-codes
CITATION = re.compile(r"(?<![\w/.-])((?:docs/(?:facts/)?[\w-]+|README|CONTRIBUTING)\.md)(?:#([\w-]+))?")
# ", #another-anchor" after a citation names another heading of the same page
MORE_ANCHORS = re.compile(r",\s*(?:#\s+)?#([a-z0-9][\w-]*)")
# an anchor wrapped onto the next line at a hyphen (in a comment or a docstring)
WRAPPED = re.compile(r"(#[\w-]*-)\n[ \t]*(?:#[ \t]*)?(?=\w)")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
# the README's old way of citing itself: the word README, then a section name in double quotes
README_SECTION = re.compile(r"README(?:\.md)?,? \"[^\"\n]+\"")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    """The anchors of a Markdown file's headings (outside fenced blocks), with GitHub's -1, -2 for repeats."""
    found: set[str] = set()
    repeats: dict[str, int] = {}
    fenced = False
    for line in open(path, encoding="utf-8").read().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6} +(.+?) *#* *$", line)
        if heading and not fenced:
            base = slug(heading.group(1))
            found.add(f"{base}-{repeats[base]}" if base in repeats else base)
            repeats[base] = repeats.get(base, 0) + 1
    return found


def source_files(root: str) -> list[str]:
    paths = [os.path.join(root, name) for name in TOP_FILES if os.path.isfile(os.path.join(root, name))]
    for scope in SCOPES:
        for directory, dirs, names in os.walk(os.path.join(root, scope)):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            paths += [os.path.join(directory, n) for n in names if os.path.splitext(n)[1] in TEXT_SUFFIXES]
    return sorted(p for p in paths if os.path.abspath(p) != THIS_FILE)


def read_text(path: str) -> str | None:
    try:
        return open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        return None


def citations(path: str, text: str, root: str):
    """(where, target file, anchor or None) for every citation and Markdown link in one file's text."""
    where = os.path.relpath(path, root)
    if path.endswith(".md"):
        for link in MARKDOWN_LINK.finditer(text):
            target = link.group(1)
            if re.match(r"^[a-z]+:", target):       # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            yield where, os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path, anchor or None
        text = MARKDOWN_LINK.sub("]()", text)         # what is left is cited from the repository root
    text = WRAPPED.sub(r"\1", text)
    for cite in CITATION.finditer(text):
        target = os.path.join(root, cite.group(1))
        yield where, target, cite.group(2)
        if cite.group(2):
            end = cite.end()
            while more := MORE_ANCHORS.match(text, end):
                yield where, target, more.group(1)
                end = more.end()


def broken_citations(root: str) -> list[str]:
    """One line per citation that names a missing file or a heading that file does not have."""
    broken, cache = [], {}
    for path in source_files(root):
        text = read_text(path)
        if text is None:
            continue
        for where, target, anchor in citations(path, text, root):
            shown = os.path.relpath(target, root) + (f"#{anchor}" if anchor else "")
            if not os.path.exists(target):
                broken.append(f"{where}: {shown}: no such file")
            elif anchor and target.endswith(".md"):
                if target not in cache:
                    cache[target] = anchors(target)
                if anchor not in cache[target]:
                    broken.append(f"{where}: {shown}: no such heading")
    return sorted(set(broken))


def test_every_cited_file_and_heading_exists():
    assert broken_citations(REPO) == []


def test_a_broken_anchor_is_reported(tmp_path):
    """The check can fail: a heading that is not there, a page that is not there, and a wrapped anchor."""
    (tmp_path / "docs" / "facts").mkdir(parents=True)
    (tmp_path / "docs" / "facts" / "x.md").write_text("# X\n\n## A fact: `kept`\n\n```\n# not a heading\n```\n")
    (tmp_path / "docs" / "guide.md").write_text("See [the fact](facts/x.md#a-fact-kept), [gone](facts/x.md#gone)"
                                                " and [here](#nowhere).\n")
    (tmp_path / "clusterctl").mkdir()
    cite = "docs" + "/facts/x.md#"            # spelled apart so that this file cites nothing itself
    (tmp_path / "clusterctl" / "m.py").write_text(
        f"# ok ({cite}a-fact-kept), ({cite}a-\n# fact-kept, #not-a-heading)\n"
        f"# ({cite}not-a-heading) ({cite}" + "a-fact-kept) (docs" + "/missing.md)\n")
    assert broken_citations(str(tmp_path)) == [
        "clusterctl/m.py: docs/facts/x.md#not-a-heading: no such heading",
        "clusterctl/m.py: docs/missing.md: no such file",
        "docs/guide.md: docs/facts/x.md#gone: no such heading",
        "docs/guide.md: docs/guide.md#nowhere: no such heading",
    ]


def test_slugs_are_githubs():
    assert slug("Restarts and elastic runs") == "restarts-and-elastic-runs"
    assert slug("How a host's SSH settings are decided") == "how-a-hosts-ssh-settings-are-decided"
    assert slug("FSDP (clusterctl.train.fsdp)") == "fsdp-clusterctltrainfsdp"
    assert slug("Host keys (per host, or under `defaults:`)") == "host-keys-per-host-or-under-defaults"


def test_no_code_cites_a_readme_section_by_name():
    """Sections are cited as file#anchor, which the test above can check; a quoted name it cannot."""
    found = []
    for path in source_files(REPO):
        text = read_text(path)
        if text is not None and not path.endswith(".md"):
            found += [f"{os.path.relpath(path, REPO)}: {m.group(0)}" for m in README_SECTION.finditer(text)]
    assert found == []


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[\w-]*\n(.*?)^```", text, re.S | re.M)


def test_the_readme_is_a_front_door():
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert len(readme.splitlines()) <= 200
    install, tests = fenced_blocks(readme)[:2]
    # Quickstart A: the install and main job on this machine, then the tests CI runs
    assert install.startswith("apt-get ") and ".venv/bin/pip install . && .venv/bin/clusterctl run\n" in install
    assert tests == "bash tests/run.sh\n"
    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read().splitlines()
    assert "exec " + tests.strip() in ci
    headings = anchors(os.path.join(REPO, "README.md"))
    assert {"quickstart-a-this-machine", "quickstart-b-two-macs", "install", "commands", "concepts",
            "exit-codes"} <= headings
    # issue 42: for people with Macs, at a glance: the first 15 lines name Macs, show the picture (an image made
    # from a source file here) and give Quickstart A's command
    top = "\n".join(readme.splitlines()[:15])
    assert "Macs" in top and "## Quickstart A" in top and ".venv/bin/clusterctl run" in top, top
    picture = re.search(r"!\[[^\]]+\]\((docs/images/[\w.-]+\.png)\)", top)
    assert picture and os.path.getsize(os.path.join(REPO, picture.group(1))) > 10_000, top
    assert os.path.isfile(os.path.join(REPO, picture.group(1)[:-4] + ".py"))


def test_the_main_job_s_figures_come_from_its_benchmark_record():
    """The main job's time and losses are quoted from benchmarks/results/main_job.json (bench_main_job.py), the one
    place they are measured; the pages that give them quote that record, none has a figure of its own."""
    record = json.load(open(os.path.join(REPO, "benchmarks", "results", "main_job.json"), encoding="utf-8"))
    s = record["summary"]
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert f"in {s['wall_s']['min']:.0f}–{s['wall_s']['max']:.0f} s wall on {record['cores']} CPU cores" in readme
    assert f"the loss falls from {s['first_loss']:.2f} at step 1 to {s['last_loss']:.2f} at step {s['steps']}, " \
           f"held-out\n{s['held_out']:.2f}" in readme
    trainer = open(os.path.join(REPO, "docs", "trainer.md"), encoding="utf-8").read()
    assert "benchmarks/RESULTS.md#the-main-job" in trainer and "about a minute" not in trainer
