"""torchrun as rhymectl starts it: `python -m pipeline.loop.torchrun ARGS` is `torchrun ARGS`
(single node, or one per node of a multi-node job: sample_configs/slurm.sh), except in two
outcomes that torchrun reports with a traceback under the ranks' own one-line errors:

- a signal stops it: torchrun stops its ranks with the same signal and raises
  `SignalException`; here it ends with exit code 128 + the signal's number;
- a rank on this node stopped on bad input (exit code 2, after its one `error:` line) and
  the node's other ranks did too or were stopped by torchrun because of it: torchrun raises
  `ChildFailedError` and exits 1; here it exits 2, so `rhymectl train --nproc N` and a
  Slurm job report a usage error as one.

The tracebacks stay with --debug. Every other outcome is torchrun's own.
"""

from __future__ import annotations

import os
import signal
import sys

from pipeline.errors import DEBUG_ENV

USAGE_EXIT = 2  # pipeline.errors.UsageError.exit_code, as a rank reports it


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except SignalException as exc:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        if not usage_failure([f.exitcode for f in exc.failures.values()]) \
                or os.environ.get(DEBUG_ENV) == "1":
            raise
        return USAGE_EXIT
    return 0


def usage_failure(exit_codes: list[int]) -> bool:
    """The failed ranks' exit codes (negative: killed by that signal) tell of bad input:
    some rank exited 2 and the others did too or were stopped by torchrun (SIGTERM, then
    SIGKILL) because of it."""
    stopped = {-signal.SIGTERM, -signal.SIGKILL}
    return USAGE_EXIT in exit_codes and all(c == USAGE_EXIT or c in stopped for c in exit_codes)


if __name__ == "__main__":
    sys.exit(main())
