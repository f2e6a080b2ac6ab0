"""`pipeline.atomic.write_atomic`: a wrong target path is one UsageError, and nothing is
left behind (not even the temp file, which lives beside the target)."""

from __future__ import annotations

import pytest

from pipeline.atomic import write_atomic, write_text_atomic
from pipeline.errors import UsageError


def test_writes_and_replaces(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two" and [p.name for p in target.parent.iterdir()] == ["a.txt"]


def test_a_directory_as_target_is_refused_and_nothing_written(tmp_path):
    (tmp_path / "plots").mkdir()
    with pytest.raises(UsageError, match="plots is a directory; give a file name"):
        write_text_atomic(tmp_path / "plots", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["plots"]
    assert list((tmp_path / "plots").iterdir()) == []


def test_a_file_where_a_folder_should_be_is_refused(tmp_path):
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(UsageError, match="a file stands where a folder of its path should be"):
        write_text_atomic(tmp_path / "notes" / "deeper" / "p.png", "x")
    assert (tmp_path / "notes").read_text() == "mine"


def test_a_failing_writer_leaves_nothing(tmp_path):
    def write(tmp):
        tmp.write_text("half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_atomic(tmp_path / "a.txt", write)
    assert list(tmp_path.iterdir()) == []
