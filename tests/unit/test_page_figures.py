"""Every measured figure a page quotes is benchmarks/RESULTS.md's (issue 55: pages that agree).

The pages are README.md and the guide, docs/*.md (docs/cli.md included: the commands' help is quoted there). Not
docs/facts/: that is the evidence log, each fact with how it was established, not a quote of the benchmarks. The
rule, which a page can follow and this test can check:

1. A sentence that cites benchmarks/RESULTS.md (a link to it, or its path), or says its figures were measured,
   quotes it: every figure in it, a number with a unit of measure (s, ms, minutes, %, x or ×, tok/s, tokens/s,
   rows/s, MB/s, GB/s, MB, GB, MiB, GiB), must be a number RESULTS.md gives; where the citation names a section
   (`RESULTS.md#the-main-job-2026-11-27`), a number of that section. A range (45–48 s) is two figures.
2. A ratio with decimals (1.45x, 0.67×) and a rate (15,423 tok/s) is a measurement wherever it stands in a page's
   prose: it must be a number RESULTS.md gives, cited or not.
3. A fenced block that shows such figures (a rate, seconds with decimals: a transcript, a live panel) must be
   labelled an illustration in the paragraph just above it, since nobody measured it.

A sentence (or, for 3, the paragraph above a block) that says `illustration` is skipped: the page says its figures
were not measured. Figures inside `code spans` are commands or output lines, not quotes, and are not read by 1 and 2.
Numbers are compared as written, thousands' commas dropped, or rounded: a page may give RESULTS.md's 44.8 as 45 and
its 0.340 as 0.34, never another number.
"""
from __future__ import annotations

import os
import re
from decimal import ROUND_HALF_UP, Decimal

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RESULTS = os.path.join("benchmarks", "RESULTS.md")

NUMBER = r"\d[\d,]*(?:\.\d+)?"
UNIT = r"(?:tok/s|tokens/s|rows/s|[MG]B/s|minutes?|min|ms|s|%|x|×|[MG]i?B)"
FIGURE = re.compile(rf"(?<![\w.]){NUMBER}(?:\s?(?:–|-|to)\s?{NUMBER})?\s?{UNIT}(?![\w/])")
RATIO_OR_RATE = re.compile(rf"(?<![\w.])\d+\.\d+\s?[x×](?![\w/])|(?<![\w.]){NUMBER}\s?(?:tok/s|tokens/s)(?![\w/])")
IN_BLOCK = re.compile(rf"(?<![\w.]){NUMBER}\s?(?:tok/s|tokens/s)|(?<![\w.])\d+\.\d+\s?s\b")


def sentences(paragraph: str) -> list[str]:
    """A paragraph's sentences, on one line each (a full stop, then a capital, a code span, a bracket); each list item
    and each table row is a sentence of its own, or more."""
    return [sentence for item in re.split(r"\n\s*(?=[-*] |\d+\. |\|)", paragraph)
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])", " ".join(item.split()))]


def prose(sentence: str) -> str:
    """A sentence without its links' targets and its code spans (commands and output lines, not quotes)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"\]\([^)\s]*\)", "]()", sentence))


def pages(root: str) -> list[str]:
    docs = os.path.join(root, "docs")
    return [os.path.join(root, "README.md")] + sorted(
        os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))


def numbers(text: str) -> set[str]:
    """Every number of a text, as written, thousands' commas dropped."""
    return {n.replace(",", "") for n in re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?", text)}


def gives(quoted: str, given: set[str]) -> bool:
    """Whether a number quoted on a page is one of RESULTS.md's, as written or rounded to the quoted digits."""
    if quoted in given:
        return True
    places = Decimal(quoted).as_tuple().exponent
    return any(Decimal(n).as_tuple().exponent < places
               and Decimal(n).quantize(Decimal(1).scaleb(places), rounding=ROUND_HALF_UP) == Decimal(quoted)
               for n in given)


def sections(text: str) -> dict[str, str]:
    """RESULTS.md's sections by their GitHub anchor (## headings), the whole file under ''."""
    out = {"": text}
    for heading, body in re.findall(r"^## +(.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        out[re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")] = body
    return out


def figures_in(text: str) -> list[str]:
    """The numbers of each figure in a piece of prose: '45–48 s' gives '45' and '48'."""
    return [n.replace(",", "") for m in FIGURE.finditer(text)
            for n in re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?", m.group(0))]


def paragraphs(text: str):
    """(first line number, text, is it a fenced block, the paragraph before it) of a Markdown page."""
    lines, out, i, before = text.splitlines(), [], 0, ""
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```")), len(lines))
            out.append((i + 1, "\n".join(lines[i + 1:end]), True, before))
            i = end + 1
            continue
        if not lines[i].strip():
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith("```"):
            i += 1
        before = "\n".join(lines[start:i])
        out.append((start + 1, before, False, ""))
    return out


def unquoted(root: str) -> list[str]:
    """One line per figure a page quotes that RESULTS.md does not give, or a transcript not labelled."""
    results = sections(open(os.path.join(root, RESULTS), encoding="utf-8").read())
    known = {anchor: numbers(body) for anchor, body in results.items()}
    problems = []
    for path in pages(root):
        where = os.path.relpath(path, root)
        for line, text, fenced, before in paragraphs(open(path, encoding="utf-8").read()):
            if fenced:
                found = IN_BLOCK.findall(text)
                if found and "illustration" not in before.lower():
                    problems.append(f"{where}:{line}: a block showing {found[0]!r} is not labelled an illustration")
                continue
            for sentence in sentences(text):
                if "illustration" in sentence.lower():
                    continue
                anchors = re.findall(r"RESULTS\.md(?:#([\w-]+))?", sentence)
                if not anchors and re.search(r"\bmeasur", sentence, re.I):
                    anchors = [""]                 # says it was measured: a figure of RESULTS.md's, anywhere in it
                words = prose(sentence)
                if anchors:
                    within = [a for a in anchors if a] or [""]
                    for n in figures_in(words):
                        if not any(gives(n, known.get(a, set())) for a in within):
                            section = f"#{within[0]}" if within[0] else ""
                            problems.append(f"{where}:{line}: {n} is not in {RESULTS}{section}")
                for m in RATIO_OR_RATE.finditer(words):
                    for n in numbers(m.group(0)):
                        if not gives(n, known[""]):
                            problems.append(f"{where}:{line}: {m.group(0)!r} is not in {RESULTS}")
    return problems


def test_every_figure_a_page_quotes_is_in_results():
    assert unquoted(REPO) == []


def test_the_check_finds_a_figure_results_does_not_give(tmp_path):
    """The checker can fail: a cited sentence with a figure of another section and one of none, a ratio and a rate
    quoted without a citation, a figure said to be measured that RESULTS.md lacks, and an unlabelled transcript; the
    same page labelled and quoted right passes."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "RESULTS.md").write_text(
        "# Results\n\n## The main job (2026-11-27)\n\n| wall | 45 / 48 s | 1,234 tokens/s |\n\n"
        "## Relay (2026-11-27)\n\nrelayed / 1 host 1.05, 62 s\n")
    (tmp_path / "docs").mkdir()
    cite = "(benchmarks/" + "RESULTS.md#the-main-job-2026-11-27)"       # apart: this file cites nothing itself
    bad = (f"# X\n\nThe job takes 45–62 s [here]{cite}. Ranks 2 and 3 differ by 12% [there](benchmarks/"
           "RESULTS.md).\nPushing is 1.11x faster, at 1,235 tok/s. A push was measured at 9.9 s.\n"
           "\nThe output:\n\n```\nready in 41.2s\n```\n")
    (tmp_path / "README.md").write_text(bad)
    assert unquoted(str(tmp_path)) == [
        "README.md:3: 62 is not in benchmarks/RESULTS.md#the-main-job-2026-11-27",
        "README.md:3: 12 is not in benchmarks/RESULTS.md",
        "README.md:3: '1.11x' is not in benchmarks/RESULTS.md",
        "README.md:3: '1,235 tok/s' is not in benchmarks/RESULTS.md",
        "README.md:3: 9.9 is not in benchmarks/RESULTS.md",
        "README.md:8: a block showing '41.2s' is not labelled an illustration",
    ]
    good = (f"# X\n\nThe job takes 45–48 s [here]{cite}. Pushing relayed takes 1.05x one host's time, at 1,234 "
            "tok/s.\nA push was measured at 62 s. "
            "A transcript (`run 3: 1.11x`), 12% faster, not cited.\n\nThe output, an illustration (not "
            "measured):\n\n```\nready in 41.2s\n```\n")
    (tmp_path / "README.md").write_text(good)
    assert unquoted(str(tmp_path)) == []


def test_sentences_and_sections():
    text = "## Summary (latest figures)\n\na 1.05\n\n## The main job (2026-11-27)\n\n45 / 1,048 s\n"
    assert set(sections(text)) == {"", "summary-latest-figures", "the-main-job-2026-11-27"}
    assert numbers(sections(text)["the-main-job-2026-11-27"]) == {"45", "1048"}
    assert sentences("A 1 s.\nB (2 s).\n- c\n  d. E\n| 3 | 4 |\n| 5 |") == ["A 1 s.", "B (2 s).", "- c d.", "E", "| 3 | 4 |",
                                                                         "| 5 |"]
    assert gives("45", {"44.8"}) and gives("0.34", {"0.340"}) and gives("1.5", {"1.45"}) and gives("12", {"12"})
    assert not gives("44", {"44.8"}) and not gives("0.341", {"0.34"}) and not gives("45", {"45.5", "4"})
    assert figures_in("in 45–48 s wall, 0.63x the bytes, 31% shorter, 2 ranks, step 400") == ["45", "48", "0.63", "31"]
