"""How a rhymectl process ends: the exit code, without the interpreter's teardown.

After a run, Python's own shutdown frees every module, tensor and C++ object one by one:
2-3 s with torch, vLLM and DeepSpeed loaded, on every `rhymectl train`, on every rank and
every training run a bench starts. Nothing on disk depends on it (files are written
atomically and closed before the command returns), so the program's entry points end with
`exit_now`: the same orderly part of an exit — other threads joined, atexit handlers run
(loggers closed, temp folders removed), stdout and stderr flushed — then `os._exit`.
In-process callers (tests, `rhymectl.app.main`) never call it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_code(value: object) -> int:
    """What Python makes of `SystemExit(value)`: None is 0, an int itself, anything else is
    printed on stderr and is 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def exit_now(code: int) -> NoReturn:
    """End the process with `code`: the exit hooks threading keeps (a thread pool's
    shutdown, a logger's), the other non-daemon threads joined, the atexit handlers run and
    the standard streams flushed, as at any exit; then skip the interpreter's teardown."""
    threading._shutdown()  # what the interpreter does first: threading's exit hooks
    # (thread pools, loggers), then the other non-daemon threads joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader that went away
            pass
    os._exit(code)
