"""`rhymectl --version` and the one place the version is written.

The version is `rhymectl.__version__`; pyproject.toml reads it (`dynamic = ["version"]`) and
the newest released section of CHANGELOG.md names it (CONTRIBUTING.md: cutting a release).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import rhymectl
from rhymectl.app import main

ROOT = Path(__file__).resolve().parents[2]
SEMVER = re.compile(r"\d+\.\d+\.\d+")


def run(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `rhymectl ARGS`, run in-process."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return (0 if info.value.code is None else info.value.code), out, err


def test_version_prints_the_package_version_and_exits_0(capsys):
    assert run(capsys, "--version") == (0, f"rhymectl {rhymectl.__version__}\n", "")


def test_version_is_listed_in_the_help(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "--version" in out


def test_the_version_is_semver():
    assert SEMVER.fullmatch(rhymectl.__version__), rhymectl.__version__


def test_pyproject_reads_the_version_from_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"], "the version is written in rhymectl/__init__.py"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rhymectl.__version__"}



def test_the_newest_changelog_release_is_the_package_version():
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$",
                          (ROOT / "CHANGELOG.md").read_text(), flags=re.MULTILINE)
    assert releases, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' section"
    assert releases[0] == rhymectl.__version__
