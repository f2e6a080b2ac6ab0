"""The list-plan placement policies for one rollout step (the registry that names every
policy: `pipeline.sched.registry`).

- static: veRL's baseline. The batch (group-major, as veRL repeats each prompt n times) is
  split by position into W contiguous, equal shares.
- histopipe: RhymeRL's first tier. Groups are ranked by predicted length and dealt longest
  first to the worker with the least predicted time so far (LPT on
  `pipeline.sched.load.LoadEstimate`, so every worker gets the same predicted work in
  seconds); siblings stay together, which group drafting needs. Odd steps mirror the
  worker order, so the worker that got the longest group gets the shortest end next step.
  Online, a response that runs past `MIGRATE_FACTOR` times its prediction moves to a
  worker running at least `migrate_gap` fewer requests at its next chunk boundary.
- seer: divided rollout with a global queue (`pipeline/sched/seer.py`).
- tier2: HistoPipe's second tier: the longest predicted groups on reserved workers, a few
  sequences each (`pipeline/sched/tier2.py`).
- oracle: LPT on the true lengths, requests placed one by one; a bound for the bench only.

Every policy places every request exactly once: a prompt never seen before carries the
fallback prediction and is placed like any other.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Sequence

import numpy as np

from pipeline.sched.types import (Chunk, Cluster, Dispatcher, Placement, Request, check_workers,
                                 longest_first, lpt, place_continuation, requests_of)


class ListDispatcher(Dispatcher):
    """Runs a static plan: each worker takes its own list in order as slots free up.

    With `overrun` (histopipe), requests run in chunks of `chunk_tokens`; one for which
    overrun(request, generated) holds may move to a less-loaded worker at a boundary.
    """

    def __init__(self, plan: list[list[Request]], *, chunk_tokens: int | None = None,
                 overrun: Callable[[Request, int], bool] | None = None, migrate_gap: int = 8,
                 overrun_after: Callable[[Request], float] | None = None):
        """overrun_after(request): the tokens past which a request overruns (the same
        rule as `overrun`, in the form the event simulator can skip boundaries with)."""
        self.queues = [deque(p) for p in plan]
        self.chunk_tokens = chunk_tokens
        if overrun is None and overrun_after is not None:
            overrun = lambda r, generated: generated > overrun_after(r)  # noqa: E731
        self.overrun, self.overrun_after = overrun, overrun_after
        self.migrate_gap = self.quiet_gap = migrate_gap
        self.continuing: list[tuple[Request, int, int]] = []  # (request, worker, generated)
        self.migrations = 0

    def dispatch(self, cluster: Cluster, freed: Sequence[int]) -> None:
        waiting, self.continuing = self.continuing, []
        for request, own, generated in waiting:
            target = own
            if self.overrun is not None and self.overrun(request, generated):
                target = place_continuation(cluster, own, self.migrate_gap)
            elif cluster.load(own) >= cluster.capacity:
                target = None
            if target is None:
                self.continuing.append((request, own, generated))
                continue
            self.migrations += target != own
            cluster.assign(target, Chunk(request, self.chunk_tokens))
        for w in freed:
            queue = self.queues[w]
            while queue and cluster.load(w) < cluster.capacity:
                cluster.assign(w, Chunk(queue.popleft(), self.chunk_tokens))

    def chunk_done(self, chunk: Chunk, worker: int, generated: int, finished: bool) -> None:
        if not finished:
            self.continuing.append((chunk.request, worker, generated))

    def pending(self) -> int:
        return sum(len(q) for q in self.queues) + len(self.continuing)

    def movable_after(self, request: Request) -> float:
        if self.overrun is None:
            return math.inf
        return -1.0 if self.overrun_after is None else self.overrun_after(request)

    def stuck(self) -> bool:
        return bool(self.continuing)

    def stays(self, cluster, worker, stopping, finished):
        """The requests before the first overrun one: they continue in place, in order."""
        if self.continuing:
            return ()
        out = []
        for request, generated in stopping:
            if self.overrun is not None and self.overrun(request, generated):
                break
            out.append(request)
        return out


class StaticPolicy(Placement):
    name = "static"
    runs_locally = True

    def assign(self, groups, workers, step=0):
        check_workers(groups, workers)
        requests = requests_of(groups)
        shares = np.array_split(np.arange(len(requests)), workers)  # first shares one longer
        return [[requests[i] for i in share] for share in shares]

    def dispatcher(self, groups, workers, step=0):
        return ListDispatcher(self.assign(groups, workers, step))


class HistoPipePolicy(Placement):
    name = "histopipe"
    MIGRATE_FACTOR = 2.0  # only a response past this multiple of its prediction may move

    def assign(self, groups, workers, step=0):
        check_workers(groups, workers)
        if len(groups) >= workers:  # whole groups: siblings share a worker (group drafts)
            units = [[Request(g, s) for s in range(grp.n)] for g, grp in enumerate(groups)]
        else:  # fewer groups than workers: deal single requests so nobody idles
            units = [[r] for r in requests_of(groups)]
        lengths = [groups[unit[0].group].predicted for unit in units]
        plan = longest_first(lpt(units, lengths, workers, self.params), units, lengths)
        return plan[::-1] if step % 2 else plan

    def dispatcher(self, groups, workers, step=0):
        factor = self.MIGRATE_FACTOR

        def overrun_after(request: Request) -> float:
            return factor * groups[request.group].predicted

        return ListDispatcher(self.assign(groups, workers, step), overrun_after=overrun_after,
                              chunk_tokens=self.params.chunk_tokens,
                              migrate_gap=self.params.migrate_gap)


class OraclePolicy(Placement):
    """LPT on the true lengths (GroupWork.lengths), one request at a time."""

    name = "oracle"
    needs_lengths = True

    def assign(self, groups, workers, step=0):
        check_workers(groups, workers)
        if any(g.lengths is None for g in groups):
            raise ValueError("the oracle policy needs the true lengths (GroupWork.lengths)")
        units = [[r] for r in requests_of(groups)]
        lengths = [float(groups[g].lengths[s]) for [(g, s)] in units]
        return longest_first(lpt(units, lengths, workers, self.params), units, lengths)

    def dispatcher(self, groups, workers, step=0):
        return ListDispatcher(self.assign(groups, workers, step))


__all__ = ["HistoPipePolicy", "ListDispatcher", "OraclePolicy", "StaticPolicy"]
