"""The two kinds of failure every command distinguishes.

`UsageError` is the user's to fix (bad config, data set, model directory, command-line use):
one line, exit code 2, nothing written. `RuntimeFailure` is a run that was set up correctly
but failed (exit code 1). Anything else is a bug and is reported the same way as a runtime
failure, with the traceback behind `--debug`.
"""

from __future__ import annotations


DEBUG_ENV = "RHYMECTL_DEBUG"  # "1": tracebacks instead of one-line errors (ranks inherit it)


class UsageError(Exception):
    """Bad input. The message is one line: what is wrong and how to fix it."""

    exit_code = 2


class RuntimeFailure(Exception):
    """A correctly configured run failed."""

    exit_code = 1


def require_file(path, what: str, fix: str):
    """`path` (a pathlib.Path) if it is a regular file; otherwise a UsageError that says
    whether it is missing or something else (a directory, a device), then `fix`."""
    if path.is_file():
        return path
    state = ("is a directory" if path.is_dir() else "is not a regular file") if path.exists() \
        else "does not exist"
    raise UsageError(f"{what} {path} {state}; {fix}")


def existing_part(path):
    """`path` (a pathlib.Path) if it exists, else its nearest ancestor that does: where
    creating it as a folder would start."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path
