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

One race is closed too. In a multi-node job the first node's torchrun hosts the rendezvous
store, and every other node's torchrun asks that store, while its ranks run, whether new
nodes wait to join. When every rank stops on the same bad input (a check all ranks make
together, such as run.dir not being shared), the first node's ranks may exit a moment
before another node's: the first torchrun exits, its store with it, and the other torchrun's
next question fails with `RendezvousConnectionError` while its own rank is still printing
the same line; torchrun then stops that rank and exits 1 with a traceback. Here a node that
loses the store keeps watching its ranks for `LOST_STORE_GRACE_S` (no new node can join
through a store that is gone), so their own exit codes decide; a store still gone after that
is torchrun's own error, as before, so a node whose ranks hang after losing the first node
still stops.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from pipeline.errors import DEBUG_ENV

USAGE_EXIT = 2  # pipeline.errors.UsageError.exit_code, as a rank reports it
LOST_STORE_GRACE_S = 30.0  # how long a node watches its ranks after the store went away


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
    )
    from torch.distributed.run import main as torchrun

    tolerate_lost_store(DynamicRendezvousHandler, LOST_STORE_GRACE_S)
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


def tolerate_lost_store(handler_class: type, grace_s: float, clock=time.monotonic) -> None:
    """Make `handler_class.num_nodes_waiting` (the agent's question while its ranks run)
    answer 0 instead of raising `RendezvousConnectionError`, without asking the store again,
    for `grace_s` seconds after it first could not reach it; then ask once more and raise if
    it is still gone. Idempotent."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    asked = handler_class.num_nodes_waiting
    if getattr(asked, "tolerates_lost_store", False):
        return

    def num_nodes_waiting(self) -> int:
        lost_at = self.__dict__.get("_rhymectl_store_lost_at")
        if lost_at is not None and clock() - lost_at <= grace_s:
            return 0  # not asked again: each failed call logs a C++ stack dump
        try:
            waiting = asked(self)
        except RendezvousConnectionError:
            if lost_at is not None:
                raise  # still gone after the grace
            self.__dict__["_rhymectl_store_lost_at"] = clock()
            return 0
        self.__dict__.pop("_rhymectl_store_lost_at", None)
        return waiting

    num_nodes_waiting.tolerates_lost_store = True
    handler_class.num_nodes_waiting = num_nodes_waiting


if __name__ == "__main__":
    sys.exit(main())
