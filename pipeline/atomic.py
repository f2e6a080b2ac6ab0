"""Atomic file writes: a temp file in the same folder, fsync, then rename.

A reader never sees a half-written file: it sees the old one or the new one. A target
that is a directory, or below a file, is a path the user gave wrongly (`--plot /tmp`):
`UsageError`, nothing written.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from pipeline.errors import UsageError


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_path)`, then move the result onto `path` in one rename."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTDIR):
            raise  # disk full, permissions: the caller's to report
        raise UsageError(f"{path} cannot be written: a file stands where a folder of its "
                         f"path should be ({exc.filename}); give another path") from None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda p: p.write_text(text))


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
