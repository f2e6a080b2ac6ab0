"""Every relative link in the README, CONTRIBUTING, CHANGELOG and docs/*.md resolves.

A link `[text](path)` or `![alt](path)` that is not a URL must name a file or folder that
exists, relative to the page; a `#fragment` must name a heading of the target page (GitHub's
anchor rule). Paths written out as `docs/...` must exist too. Links inside code blocks and
code spans are not links.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
                *(ROOT / "docs").glob("*.md")])

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*[\w-]\.(?:md|json|png)\b")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase; letters, digits, spaces, '-' and '_' kept;
    spaces become '-'."""
    text = LINK.sub(lambda m: m.group(0)[1:m.group(0).index("](")], heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    kept = "".join(c for c in text
                   if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(page.read_text()):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def targets(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and written-out docs/ path on the page."""
    found = []
    for number, line in prose_lines(page.read_text()):
        found += [(number, m.group(1)) for m in REFERENCE.finditer(line)]
        found += [(number, m.group(1)) for m in LINK.finditer(CODE_SPAN.sub("", line))]
        found += [(number, "/" + m.group(0)) for m in DOCS_PATH.finditer(line)]
    return found


def broken(page: Path) -> list[str]:
    problems = []
    for number, target in targets(page):
        if URL.match(target):
            continue
        path, _, fragment = unquote(target).partition("#")
        if path.startswith("/"):
            file = ROOT / path.lstrip("/")
        else:
            file = (page.parent / path) if path else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not file.exists():
            problems.append(f"{where}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            problems.append(f"{where}: no heading with that anchor in {file.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert not broken(page), "\n".join(broken(page))


def test_the_readme_keeps_the_ci_test_command():
    assert "make test" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("heading, anchor", [
    ("Measured: `rhymectl bench spec`", "measured-rhymectl-bench-spec"),
    ("Draft length: `spec.budget`", "draft-length-specbudget"),
    ("Held-out mean@k (`run.eval_n`)", "held-out-meank-runeval_n"),
    ("Measured: real ranks (2-core CPU)", "measured-real-ranks-2-core-cpu"),
    ("Security and crash safety — what a run trusts", "security-and-crash-safety--what-a-run-trusts"),
])
def test_anchors_follow_githubs_rule(heading, anchor):
    assert slug(heading) == anchor


def test_a_broken_link_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](page.md#title) [gone](missing.md) [bad](page.md#nope)\n"
                    "```\n[in code](nowhere.md)\n```\n`[span](nowhere.md)` see docs/none.json\n")
    (tmp_path / "docs").mkdir()
    problems = broken(page)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "missing.md: no such file", "page.md#nope: no heading with that anchor in page.md",
        "/docs/none.json: no such file"]
