"""The two kinds of failure every command distinguishes.

`UsageError` is the user's to fix (bad config, data set, model directory, command-line use):
one line, exit code 2, nothing written. `RuntimeFailure` is a run that was set up correctly
but failed (exit code 1). Anything else is a bug and is reported the same way as a runtime
failure, with the traceback behind `--debug`.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input. The message is one line: what is wrong and how to fix it."""

    exit_code = 2


class RuntimeFailure(Exception):
    """A correctly configured run failed."""

    exit_code = 1
