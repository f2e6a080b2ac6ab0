"""The event-driven rollout-step simulator: events are completions and the chunk
boundaries where the policy could do something, never every pass or every chunk.

Same model and same policies (the dispatchers themselves) as `pipeline.sched.simulator`,
which stops at every chunk boundary. Most boundaries change nothing: the policy puts the
request back where its KV cache is, and the worker runs on. A boundary can matter only if
the dispatcher could move the request, which it says through its hints
(`Dispatcher.quiet_gap`, `movable_after`, `stuck`): the worker runs at least `quiet_gap`
+ 1 more requests than the least-loaded worker and the request is past
`movable_after(request)` tokens (or continuations are waiting for a slot). So a worker
only gets boundary events while it is such a candidate; its requests otherwise run to
completion in one event each. A request keeps its chunk grid (boundaries every
`chunk.budget` tokens from where it was last placed), exactly as when the old simulator
puts it back at each boundary, so both simulators give the same schedule.

Per event the work is O(log W) heap operations plus, for candidate workers only, a scan
of their running requests; a step costs O(requests + migrations + candidate boundaries).
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

from pipeline.sched.simulator import SimConfig, SimResult, _Fluid, check_step, no_cyclic_gc
from pipeline.sched.simulator import _Cluster as Workers
from pipeline.sched.types import Chunk, Dispatcher, GroupWork, Placement

EPS = 1e-9


class _Cluster(Workers):
    """The simulator's workers, plus a worker set per load (the candidates for boundary
    events) and the set of workers whose load changed since the last event."""

    def __init__(self, sim: "_Events", workers: int, capacity: int):
        super().__init__(sim, workers, capacity)
        self.by_load: list[set[int]] = [set() for _ in range(capacity + 1)]
        self.by_load[0].update(range(workers))

    def changed(self, worker: int, delta: int) -> None:
        # the base class's bookkeeping, inlined: this runs on every start and stop
        old = self.loads[worker]
        self.loads[worker] = new = old + delta
        if new < self.capacity:
            heapq.heappush(self.heap, (new, worker))
        self.by_load[old].discard(worker)
        self.by_load[new].add(worker)
        self.sim.touched.add(worker)


class _Events(_Fluid):
    """running[w]: the worker's requests (a dict, in admission order)."""

    cluster_type = _Cluster

    def __init__(self, groups: Sequence[GroupWork], config: SimConfig, dispatcher: Dispatcher):
        self.d = dispatcher
        super().__init__(groups, config)
        n, w = len(self.length), config.workers
        # the running chunk of each request: its worker's virtual clock and the request's
        # generated tokens when it was placed, its grid step, the Chunk, its admission order
        self.v0, self.g0, self.step = [0.0] * n, [0] * n, [0] * n
        self.chunk: list[Chunk | None] = [None] * n
        self.seq_of, self.movable = [0] * n, [math.inf] * n
        # end_id: which entry of its worker's completion heap is the request's current one;
        # left_v: the worker's virtual clock when the request last stopped at a boundary
        self.end_id, self.left_v = [0] * n, [math.nan] * n
        self.running: list[dict[int, None]] = [{} for _ in range(w)]  # rid, in admission order
        self.ends: list[list] = [[] for _ in range(w)]  # heaps (v_end, seq, rid), stale skipped
        self.target_v = [math.inf] * w
        self.movers = [0] * w  # running requests a boundary could move
        self.next_v: list[float | None] = [None] * w  # cached next_boundary (None: unknown)
        # cohorts[w]: the running requests by chunk grid (v0, step): those placed in one
        # event share it, so a boundary is checked once per cohort, not per request
        self.cohorts: list[dict[tuple[float, int], dict[int, None]]] = [{} for _ in range(w)]
        self.gap = dispatcher.quiet_gap

    def admit(self, w: int, chunk: Chunk) -> None:
        group, sample = chunk.request
        rid = self.offset[group] + sample
        done, last = self.generated[rid], self.last_worker[rid]
        if self.now > self.clock_t[w]:
            self.sync(w, self.now)
        if last == w and self.left_v[rid] == self.clock_v[w]:
            # put back where it stopped, nothing ran since: its completion is unchanged
            self.seq_of[rid], self.chunk[rid] = next(self.seq), chunk
            self.v0[rid], self.g0[rid] = self.clock_v[w], done
            self.running[w][rid] = None
            self._join_cohort(w, rid)
            if self.movable[rid] < math.inf:
                self.movers[w] += 1
                self._first_boundary(w, rid)
            return
        self.place(w, rid)
        v = self.clock_v[w]
        self.v0[rid], self.g0[rid], self.chunk[rid] = v, done, chunk
        self.step[rid] = chunk.budget or 0
        self.seq_of[rid] = next(self.seq)
        self.end_id[rid] = end_id = next(self.seq)
        self.movable[rid] = self.d.movable_after(chunk.request) if chunk.budget else math.inf
        if self.movable[rid] >= self.length[rid] - 1:  # it completes before it could move
            self.movable[rid] = math.inf
        self.running[w][rid] = None
        self._join_cohort(w, rid)
        if self.movable[rid] < math.inf:
            self.movers[w] += 1
            self._first_boundary(w, rid)
        heapq.heappush(self.ends[w], (v + self.length[rid] - done, end_id, rid))

    def _join_cohort(self, w: int, rid: int) -> None:
        if self.step[rid]:
            self.cohorts[w].setdefault((self.v0[rid], self.step[rid]), {})[rid] = None

    def _leave_cohort(self, w: int, rid: int) -> None:
        if self.step[rid]:
            key = (self.v0[rid], self.step[rid])
            members = self.cohorts[w][key]
            del members[rid]
            if not members:
                del self.cohorts[w][key]

    def _stopping(self, w: int, v: float, tol: float, ended: list) -> None:
        """Add to `ended` the requests at a chunk boundary now, less those the dispatcher
        says it would put straight back (`Dispatcher.stays`): they run on untouched."""
        at: list = []
        self._at_boundary(w, v, tol, at)
        if not at:
            return
        at.sort()
        chunk = self.chunk
        stays = self.d.stays(self.cluster, w, [(chunk[rid].request, gen) for _, rid, gen in at],
                             len(ended))
        if stays:
            stays = set(stays)
            at = [e for e in at if chunk[e[1]].request not in stays]
        ended.extend(at)

    def _at_boundary(self, w: int, v: float, tol: float, ended: list) -> None:
        """Append (seq, rid, generated) of the worker's requests at a chunk boundary now
        that does not end them."""
        g0, length, seq_of = self.g0, self.length, self.seq_of
        for (v0, c), members in self.cohorts[w].items():
            k = round((v - v0) / c)
            if v - v0 >= c - tol and abs((v - v0) / c - k) * c <= tol:
                for rid in members:
                    gen = g0[rid] + c * k
                    if gen < length[rid]:
                        ended.append((seq_of[rid], rid, gen))

    def _first_boundary(self, w: int, rid: int) -> None:
        """Keep the worker's cached next boundary current for a request placed now (the
        cache only goes stale, never wrong, when requests leave: their boundaries lie in
        the past by then)."""
        cached = self.next_v[w]
        if cached is None:
            return
        c, g0 = self.step[rid], self.g0[rid]
        need = self.movable[rid] - g0
        k = math.floor(need / c) + 1 if need >= c else 1
        if g0 + k * c < self.length[rid]:
            self.next_v[w] = min(cached, self.v0[rid] + k * c)

    # --- which boundaries can matter ------------------------------------------------------
    def candidate(self, w: int, least: int) -> bool:
        if not self.movers[w]:
            return False
        if self.gap is None or self.stuck:
            return True
        return self.cluster.loads[w] - 1 - least >= self.gap

    def next_boundary(self, w: int) -> float:
        """The worker's next chunk boundary (virtual clock) at which a request could move.
        One exactly now counts when the old simulator would still process it now (its
        worker comes after the one whose event this is)."""
        v, best = self.clock_v[w], math.inf
        now = -EPS if w > self.current else EPS
        length, g0, movable = self.length, self.g0, self.movable
        for (v0, c), members in self.cohorts[w].items():
            first = max(1, math.floor((v - v0) / c + now) + 1)  # the cohort's next boundary
            if v0 + first * c >= best:
                continue
            for rid in members:
                k = first
                need = movable[rid] - g0[rid]  # the boundary must be past movable (generated)
                if need >= k * c:
                    if math.isinf(need):
                        continue
                    k = math.floor(need / c) + 1
                if g0[rid] + k * c < length[rid] and v0 + k * c < best:
                    best = v0 + k * c
                    if k == first:
                        break  # none of the cohort can do better
        return best

    def schedule(self, w: int, boundary: bool) -> None:
        self.version[w] += 1
        ends, running = self.ends[w], self.running[w]
        while ends and (ends[0][2] not in running or ends[0][1] != self.end_id[ends[0][2]]):
            heapq.heappop(ends)
        target = ends[0][0] if ends else math.inf
        if boundary:
            self.sync(w, self.now)  # the next boundary from now, not from its last event
            cached = self.next_v[w]
            if cached is None or cached <= self.clock_v[w] + EPS * max(1.0, self.clock_v[w]):
                cached = self.next_v[w] = self.next_boundary(w)
            target = min(target, cached)
        self.target_v[w] = target
        if math.isfinite(target):
            gap = max(0.0, target - self.clock_v[w])
            b = len(self.running[w])
            t = self.clock_t[w] + gap / self.rates[b]
            heapq.heappush(self.events, (round(t, 9), w, self.version[w], t))  # as the old one

    def refresh(self) -> None:
        """Reschedule the workers whose loads changed and those whose candidacy flipped
        because the least load moved (all of them when `stuck` flips)."""
        cluster = self.cluster
        least_w = cluster.least_loaded()
        least = cluster.loads[least_w] if least_w is not None else cluster.capacity
        stuck = self.d.stuck()
        workers = self.touched
        if stuck != self.stuck or self.gap is None and self.least is None:
            workers = range(cluster.workers)
        elif least != self.least and self.gap is not None and self.least is not None:
            lo, hi = sorted((least, self.least))
            flipped = set()
            for load in range(lo + self.gap + 1, min(hi + self.gap + 1, cluster.capacity + 1)):
                flipped |= cluster.by_load[load]
            workers = flipped | self.touched
        self.stuck, self.least = stuck, least
        for w in workers:
            boundary = self.candidate(w, least)
            if w in self.touched or boundary or self.was_candidate[w]:
                self.was_candidate[w] = boundary
                self.schedule(w, boundary)
        self.touched = set()

    # --- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        self.least, self.stuck, self.current = None, False, -1
        self.was_candidate = [False] * self.cluster.workers
        self.d.dispatch(self.cluster, range(self.cluster.workers))
        self.refresh()
        finished_count = 0
        while self.events:
            _, w, version, t = heapq.heappop(self.events)  # ties: lowest worker first
            if version != self.version[w]:
                continue
            self.now, self.current = t, w
            self.sync(w, t)
            v = self.clock_v[w] = max(self.clock_v[w], self.target_v[w])  # no float drift
            ended, running, ends, tol = [], self.running[w], self.ends[w], EPS * max(1.0, v)
            while ends and ends[0][0] <= v + tol:
                _, end_id, rid = heapq.heappop(ends)
                if rid in running and end_id == self.end_id[rid]:
                    ended.append((self.seq_of[rid], rid, self.length[rid]))
            if self.was_candidate[w]:
                self._stopping(w, v, tol, ended)
            if not ended:  # a stale boundary (the candidate bar moved since)
                self.touched.add(w)
                self.refresh()
                continue
            ended.sort()
            for _, rid, _ in ended:
                del self.running[w][rid]
                self._leave_cohort(w, rid)
                self.left_v[rid] = v
                self.movers[w] -= self.movable[rid] < math.inf
            self.cluster.changed(w, -len(ended))
            for _, rid, gen in ended:
                self.generated[rid] = gen
                finished = gen >= self.length[rid]
                if finished:
                    self.finish[rid] = t
                    finished_count += 1
                self.d.chunk_done(self.chunk[rid], w, gen, finished)
            self.d.dispatch(self.cluster, (w,))
            self.refresh()
        if finished_count < len(self.length):
            raise RuntimeError(f"{len(self.length) - finished_count} requests never finished "
                               f"({self.d.pending()} still queued by the policy)")


def simulate_events(policy: Placement, groups: Sequence[GroupWork], config: SimConfig,
                    step: int = 0) -> SimResult:
    """`pipeline.sched.simulator.simulate`, event-driven: the same result, much faster
    when chunks are short compared with the responses."""
    check_step(groups, config)
    with no_cyclic_gc():
        sim = _Events(groups, config, policy.dispatcher(groups, config.workers, step))
        sim.run()
        return sim.result(policy.name, groups, config)


__all__ = ["simulate_events"]
