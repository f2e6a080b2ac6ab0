"""Seer's divided rollout: single requests, chunks, one global queue.

Groups are split into single requests and requests into chunks of `chunk_tokens`. A
global queue hands the next requests to the workers with free slots: a sibling joins its
group's worker while that has room, otherwise the worker with the least predicted time
(`LoadEstimate`) takes it. The queue's order:

1. probes first: sample 0 of every group, shortest predicted first, so each group's
   first finished response (which refines its prediction) arrives early;
2. then the other siblings, longest predicted first (LPT), re-ranked as probes finish.

A request that reaches a chunk boundary is placed before any unstarted work, so a
running request is never queued behind new ones; it continues on its worker (KV cache
kept) or moves to one running at least `migrate_gap` fewer requests, paying a re-prefill
of prompt and partial output. A prompt never seen before is queued with the fallback
prediction like any other: its probe is in the first phase, and the queue only empties.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Sequence

from pipeline.sched.load import LoadEstimate
from pipeline.sched.predictor import refine
from pipeline.sched.settings import PlacementParams
from pipeline.sched.types import (Chunk, Cluster, Dispatcher, GroupWork, Placement, Request,
                                 RequestState, check_workers, lpt, place_continuation)


def queue_order(groups: Sequence[GroupWork]) -> list[Request]:
    """The initial global order: probes shortest-predicted first, then the rest
    longest-predicted first, siblings of a group together."""
    by_length = sorted(range(len(groups)), key=lambda g: (groups[g].predicted, g))
    probes = [Request(g, 0) for g in by_length]
    rest = sorted((Request(g, s) for g in by_length for s in range(1, groups[g].n)),
                  key=lambda r: (-groups[r.group].predicted, r.group, r.sample))
    return probes + rest


class SeerDispatcher(Dispatcher):
    """The global queue. Every request of the step has a `RequestState`: WAITING in the
    probe queue or the ranked rest, RUNNING once assigned, CONTINUING at a chunk boundary
    until `dispatch` places it again, FINISHED when its last chunk finished."""

    def __init__(self, groups: Sequence[GroupWork], workers: int, params: PlacementParams):
        self.groups = groups
        self.state = {Request(g, s): RequestState.WAITING
                      for g, group in enumerate(groups) for s in range(group.n)}
        self.chunk_tokens = params.chunk_tokens
        self.migrate_gap = self.quiet_gap = params.migrate_gap
        self.load = LoadEstimate(workers, params.cost, params.capacity, params.length_floor)
        self.placed: dict[Request, float] = {}  # predicted length it was placed with
        self.estimate = [g.predicted for g in groups]
        self.probed = [False] * len(groups)
        self.probes = deque(r for r in queue_order(groups) if r.sample == 0)
        self.next_sample = [1] * len(groups)
        self.version = [0] * len(groups)
        self.rest = [(-g.predicted, i, 0) for i, g in enumerate(groups) if g.n > 1]
        heapq.heapify(self.rest)
        self.unstarted_rest = sum(g.n - 1 for g in groups)
        self.continuing: list[tuple[Request, int, int]] = []  # (request, worker, generated)
        self.free: dict[int, int] = {}  # free slots of the workers that have some
        self.free_total = 0
        self.home: dict[int, int] = {}  # group -> the worker its siblings join
        self.migrations = 0

    def _pop(self) -> Request | None:
        if self.probes:
            return self.probes.popleft()
        while self.rest:
            _, g, version = heapq.heappop(self.rest)
            if version != self.version[g]:
                continue  # re-ranked since
            request = Request(g, self.next_sample[g])
            self.next_sample[g] += 1
            if self.next_sample[g] < self.groups[g].n:
                heapq.heappush(self.rest, (-self.estimate[g], g, version))
            self.unstarted_rest -= 1
            return request
        return None

    def dispatch(self, cluster: Cluster, freed: Sequence[int]) -> None:
        # the longest-running first: they have the first claim on the least-loaded worker
        waiting = sorted(self.continuing, key=lambda c: -c[2])
        self.continuing, moved_to = [], set()
        for request, own, generated in waiting:
            target = place_continuation(cluster, own, self.migrate_gap)
            if target is None:
                self.continuing.append((request, own, generated))
                continue
            if target != own:
                self.migrations += 1
                moved_to.add(target)
                self.load.done(own, self.placed[request])
                self.load.add(target, self.placed[request])
            self.state[request] = RequestState.RUNNING
            cluster.assign(target, Chunk(request, self.chunk_tokens))
        for w in {*freed, *moved_to}:
            self._set_free(w, cluster.capacity - cluster.load(w))
        if self.probes or self.unstarted_rest:
            self._start_new(cluster)

    def _set_free(self, worker: int, slots: int) -> None:
        self.free_total += slots - self.free.get(worker, 0)
        if slots:
            self.free[worker] = slots
        else:
            self.free.pop(worker, None)
        self.load.set_available(worker, slots > 0)

    def _start_new(self, cluster: Cluster) -> None:
        """Start as many queued requests as there are free slots, taken in queue order.

        They are placed longest-first, each where it is predicted to end soonest: the
        worker with the least predicted time (LPT, so the one holding the longest request
        carries little else), unless its group's worker has a free slot and would end no
        later with it. Siblings then stay together where that is free under the load
        model (they draft for each other, and a worker's passes are set by its longest
        request), and spread where stacking them would lengthen the step's critical path:
        a group whose responses all run to max_tokens on one worker pays every pass for
        all of them. They start in queue order.
        """
        batch = []
        for _ in range(min(self.free_total, len(self.probes) + self.unstarted_rest)):
            batch.append(self._pop())
        placed = {}
        for request in sorted(batch, key=lambda r: (-self.estimate[r.group], r)):
            estimate, best = self.estimate[request.group], self.load.best()
            worker = self.home.get(request.group)
            if worker not in self.free or (
                    worker != best and self.load.time_with(worker, estimate)
                    > self.load.time_with(best, estimate)):
                worker = self.home[request.group] = best
            placed[request] = worker
            self.placed[request] = self.estimate[request.group]
            self.load.add(worker, self.placed[request])
            self._set_free(worker, self.free[worker] - 1)
        for request in batch:
            self.state[request] = RequestState.RUNNING
            cluster.assign(placed[request], Chunk(request, self.chunk_tokens))

    def chunk_done(self, chunk: Chunk, worker: int, generated: int, finished: bool) -> None:
        g = chunk.request.group
        if self.state[chunk.request] is not RequestState.RUNNING:
            raise ValueError(f"{chunk.request} reported done while {self.state[chunk.request].value}")
        if not finished:
            self.state[chunk.request] = RequestState.CONTINUING
            self.continuing.append((chunk.request, worker, generated))
            return
        self.state[chunk.request] = RequestState.FINISHED
        self.load.done(worker, self.placed.pop(chunk.request))
        if not self.probed[g]:  # the group's first finished response: refine, re-rank
            self.probed[g] = True
            group = self.groups[g]
            self.estimate[g] = refine(group.predicted, 1.0 if group.known else 0.0, [generated])
            if self.next_sample[g] < group.n:
                self.version[g] += 1
                heapq.heappush(self.rest, (-self.estimate[g], g, self.version[g]))

    def pending(self) -> int:
        return len(self.probes) + self.unstarted_rest + len(self.continuing)

    def stuck(self) -> bool:
        return bool(self.continuing)

    def stays(self, cluster, worker, stopping, finished):
        """`dispatch` takes the continuations longest-running first. The worker's own
        load, down by everything that stopped, counts back up as they stay; none can move
        before it reaches the least-loaded other worker's load + migrate_gap."""
        if self.continuing or not stopping:
            return ()
        target = cluster.least_loaded()
        if target is None or target == worker:
            return ()
        own = cluster.load(worker) - len(stopping) - finished
        quiet = min(len(stopping), max(0, cluster.load(target) + self.migrate_gap - own))
        order = sorted(stopping, key=lambda s: -s[1])
        return [request for request, _ in order[:quiet]]


class SeerPolicy(Placement):
    name = "seer"

    def assign(self, groups, workers, step=0):
        """Without a shared queue: requests dealt LPT by predicted length, each worker
        running its share in queue order (its probes first)."""
        check_workers(groups, workers)
        order = queue_order(groups)
        lengths = [groups[g].predicted for g, _ in order]
        plan = lpt([[r] for r in order], lengths, workers, self.params)
        return [[order[u] for u in sorted(us)] for us in plan]

    def dispatcher(self, groups, workers, step=0):
        check_workers(groups, workers)
        return SeerDispatcher(groups, workers, self.params)


__all__ = ["SeerDispatcher", "SeerPolicy", "queue_order"]
