"""Where output goes: results on stdout (one JSON object with --json), logs on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

log = Console(stderr=True, highlight=False)
out = Console(highlight=False, soft_wrap=True)
_result_stream = None  # the real stdout while --json reserves it


def reserve_stdout_for_json() -> None:
    """With --json, stdout carries exactly one JSON object: anything else that prints to
    sys.stdout (DeepSpeed's logger, library warnings) is sent to stderr instead."""
    global _result_stream
    _result_stream = sys.stdout
    sys.stdout = sys.stderr


def release_stdout() -> None:
    global _result_stream
    if _result_stream is not None:
        sys.stdout, _result_stream = _result_stream, None


def emit_json(obj: Any) -> None:
    stream = _result_stream or sys.stdout
    stream.write(json.dumps(obj, indent=2, default=str) + "\n")
    stream.flush()
