"""torchrun as rhymectl starts it: `python -m pipeline.loop.torchrun ARGS` is `torchrun ARGS`,
except when a signal stops it. torchrun then stops its ranks with the same signal and
raises `SignalException`, which printed a traceback under rhymectl's one error line; here
it ends with exit code 128 + the signal's number instead (the traceback stays with
--debug). Every other outcome, ranks' failures included, is torchrun's own.
"""

from __future__ import annotations

import os
import sys

from pipeline.errors import DEBUG_ENV


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except SignalException as exc:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
