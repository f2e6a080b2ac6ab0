"""The project speaks only of itself: no tracked file refers to how it was built.

Every git-tracked text file (`git ls-files`; binary files skipped) is scanned for the marks
of a build history: numbered work sessions, issue numbers used as a work tracker, "today",
deadlines, the agents that worked on it, and absolute paths of a build machine. A hit fails
naming file:line. The patterns aim at those uses only: pytest's `scope="session"`,
`start_new_session`, a W&B or HTTP session, "an issue with X" and a `deadline` variable in
code do not match.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

# (what it is, pattern, file suffixes it applies to; None = every text file)
RULES: list[tuple[str, re.Pattern[str], tuple[str, ...] | None]] = [
    ("a numbered work session", re.compile(r"\b[Ss]essions?[- ]\d+"), None),
    ("the current work session", re.compile(r"\b[Tt]his session\b"), None),
    ("an issue number as a work item", re.compile(r"\b[Ii]ssues?[- ]#?\d+"), None),
    ("an issue as a work item", re.compile(r"\b[Tt]he issue(?:'s\b| asks\b| targets\b)"), None),
    ("'today'", re.compile(r"\b[Tt]oday\b"), None),
    ("a deadline", re.compile(r"\b(?:[Tt]he|[Aa]|before|after|at|by) deadline\b"), None),
    ("a deadline", re.compile(r"\b[Dd]eadlines?\b"), (".md",)),
    ("the agents that built it", re.compile(r"(?<!RL )(?<!LLM )\b[Aa]gents?\b"), (".md",)),
    ("a build machine's path", re.compile(r"(?<![\w.~-])/(?:work|home|root|Users)/"), None),
    ("a temporary path in a result", re.compile(r"(?<![\w.~-])/tmp/"), (".json",)),
]


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    return [name for name in out.decode().split("\0") if name and name != SELF]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary (NUL byte or not UTF-8) or missing file."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # deleted in the work tree, a submodule
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def hits_in(name: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern, suffixes in RULES:
            if suffixes is not None and not name.endswith(suffixes):
                continue
            match = pattern.search(line)
            if match:
                found.append(f"{name}:{number}: {what}: {match.group(0)!r} in {line.strip()[:120]!r}")
    return found


def test_no_tracked_file_refers_to_how_the_project_was_built():
    hits = []
    for name in tracked_files():
        text = text_of(ROOT / name)
        if text is not None:
            hits += hits_in(name, text)
    assert not hits, "the project should speak only of itself:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", [
    "measured in session 10 on the VM", "Session 8: shared drafts", "sessions 4-6",
    "as this session measured", "(issue 4, item 4)", "the issue-13 targets", "issues 4/5",
    "Against the issue targets", "the issue's command", "the machine today",
    "stopped at the deadline", "run dir /work/main/runs/x", "see /home/me/x",
    "/root/.cache/x",
])
def test_build_history_is_caught(line):
    assert hits_in("x.py", line), line


@pytest.mark.parametrize("name, line", [
    ("docs/x.md", "Six agents were working on it"),
    ("docs/x.md", "finished before the deadline"),
    ("docs/bench.json", '"plot": "/tmp/p/t1.png"'),
])
def test_build_history_in_docs_and_results_is_caught(name, line):
    assert hits_in(name, line), line


@pytest.mark.parametrize("name, line", [
    ("tests/conftest.py", '@pytest.fixture(scope="session")'),
    ("scripts/x.py", "proc = subprocess.Popen(cmd, start_new_session=True)"),
    ("tests/x.py", "deadline = time.monotonic() + 30"),
    ("docs/x.md", "the W&B session of the run"),
    ("docs/x.md", "an issue with resumed runs is that ..."),
    ("docs/x.md", "an RL agent's policy"),
    ("rhymectl/cmd_report.py", "rhymectl report runs/tiny --out /tmp/tiny-report"),
    ("requirements/pins.txt", "agent-detector==2.0.0"),
    ("docs/x.md", "a relative path such as runs/work/x or ~/work/x"),
])
def test_legitimate_uses_pass(name, line):
    assert not hits_in(name, line), line
