"""Trace-driven discrete-event simulation of one rollout step on W workers.

Each worker runs continuous batching with at most `capacity` requests at once (its KV
cache). One decode pass over a batch of b requests takes `CostModel.pass_s(b)` and gives
each request `tokens_per_pass(b)` tokens (1, or tau while speculating). Between events
the batch is constant, so progress is fluid: a worker's virtual clock counts the tokens
every running request has gained since the worker started, and the next event is the
earliest chunk end on it — a request finishing or reaching its chunk budget, when the
policy's dispatcher places work again. Admitting a request adds its prefill to the
worker's next pass (per_token_s per token, stalling its batch): the prompt on first
admission, prompt plus partial output when it arrives from another worker (migration),
nothing when it continues where its KV cache is.

ideal_s is the step's lower bound under the same cost model (`pipeline.sched.bound`): the
larger of the total work over W and the longest requests' own critical path. over_oracle
is the makespan over the oracle policy's on the same step (set by whoever ran the oracle).
"""

from __future__ import annotations

import gc
import heapq
import math
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count
from typing import Sequence

from pipeline.costs import SCHED_COST, CostModel, bubble_ratio, tail_s
from pipeline.sched.bound import ideal_makespan
from pipeline.sched.types import Chunk, Dispatcher, GroupWork, Placement, check_workers

Segment = tuple[float, float, int]  # (start_s, end_s, running requests), a busy interval


@dataclass(frozen=True)
class SimConfig:
    workers: int
    capacity: int = 256  # concurrent requests per worker (rollout.max_num_seqs)
    prompt_tokens: int = 16
    cost: CostModel = SCHED_COST

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {self.prompt_tokens}")


@dataclass
class SimResult:
    """One policy on one step. finish_s: [G][n] completion times; timelines: [W] lists of
    busy segments (start_s, end_s, running requests), in time order."""

    policy: str
    workers: int
    makespan_s: float
    ideal_s: float
    bubble_ratio: float
    tail_s: float
    migrations: int
    finish_s: list[list[float]]
    timelines: list[list[Segment]]
    oracle_s: float | None = None  # the oracle policy's makespan on the same step

    @property
    def makespan_over_ideal(self) -> float:
        return self.makespan_s / self.ideal_s if self.ideal_s > 0 else 1.0

    @property
    def over_oracle(self) -> float | None:
        if self.oracle_s is None:
            return None
        return self.makespan_s / self.oracle_s if self.oracle_s > 0 else 1.0

    def summary(self) -> dict[str, float]:
        out = {"makespan_s": self.makespan_s, "ideal_s": self.ideal_s,
               "makespan_over_ideal": self.makespan_over_ideal,
               "bubble_ratio": self.bubble_ratio, "tail_s": self.tail_s}
        if self.oracle_s is not None:
            out["over_oracle"] = self.over_oracle
        return out


def ideal_s(groups: Sequence[GroupWork], config: SimConfig) -> float:
    """The step's lower bound under config.cost (`pipeline.sched.bound`)."""
    lengths = [length for g in groups for length in g.lengths]
    return ideal_makespan(lengths, config.workers, config.capacity, config.prompt_tokens,
                          config.cost)


@contextmanager
def no_cyclic_gc():
    """Python's cyclic garbage collector off for the block. A step allocates millions of
    small tuples (heap entries, timeline segments) and no reference cycles; each
    collection would walk every live object, and with earlier results still alive (a
    bench runs policy after policy) that made seer's run 1.6x slower on 100k requests.
    Reference counting still frees everything."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_step(groups: Sequence[GroupWork], config: SimConfig) -> None:
    """What both simulators need of a step: 1 <= workers <= requests, true lengths."""
    check_workers(groups, config.workers)
    if any(g.lengths is None for g in groups):
        raise ValueError("the simulator needs every group's true lengths (GroupWork.lengths)")


class _Cluster:
    """The simulator's workers as `pipeline.sched.types.Cluster`."""

    def __init__(self, sim: "_Step", workers: int, capacity: int):
        self.sim, self.workers, self.capacity = sim, workers, capacity
        self.loads = [0] * workers
        self.heap = [(0, w) for w in range(workers)]  # (load, worker), stale entries skipped

    def load(self, worker: int) -> int:
        return self.loads[worker]

    def least_loaded(self) -> int | None:
        heap, loads = self.heap, self.loads
        while heap:
            load, w = heap[0]
            if load == loads[w] and load < self.capacity:
                return w
            heapq.heappop(heap)
        return None

    def assign(self, worker: int, chunk: Chunk) -> None:
        if self.loads[worker] >= self.capacity:
            raise RuntimeError(f"worker {worker} is full ({self.capacity} requests); the "
                               f"policy assigned {chunk} to it anyway")
        self.sim.admit(worker, chunk)
        self.changed(worker, +1)

    def changed(self, worker: int, delta: int) -> None:
        self.loads[worker] += delta
        if self.loads[worker] < self.capacity:
            heapq.heappush(self.heap, (self.loads[worker], worker))


class _Fluid:
    """The fluid model both simulators share: per-worker virtual token clocks advanced at
    the batch's token rate, timelines of (start, end, batch) segments, prefill charged
    when a request is placed on a worker that lacks its KV cache."""

    cluster_type: type = None  # set below: the workers' load bookkeeping

    def __init__(self, groups: Sequence[GroupWork], config: SimConfig):
        self.cost, self.prompt_tokens = config.cost, config.prompt_tokens
        self.offset = [0]
        for g in groups:
            self.offset.append(self.offset[-1] + g.n)
        self.length = [length for g in groups for length in g.lengths]
        n, w = len(self.length), config.workers
        self.generated, self.last_worker, self.finish = [0] * n, [-1] * n, [math.nan] * n
        self.rates = [0.0] + [self.cost.rate(b) for b in range(1, config.capacity + 1)]
        self.clock_t, self.clock_v = [0.0] * w, [0.0] * w
        self.running: list = [[] for _ in range(w)]
        self.version = [0] * w
        self.timelines: list[list[Segment]] = [[] for _ in range(w)]
        self.events: list[tuple[float, int, int]] = []
        self.cluster = self.cluster_type(self, w, config.capacity)
        self.seq, self.now, self.touched, self.migrations = count(), 0.0, set(), 0

    def sync(self, w: int, now: float) -> None:
        t = self.clock_t[w]
        if now > t:
            b = len(self.running[w])
            if b:
                self.clock_v[w] += (now - t) * self.rates[b]
                self.timelines[w].append((t, now, b))
            self.clock_t[w] = now

    def place(self, w: int, rid: int) -> None:
        """Request `rid` starts (or resumes) on worker `w`: charge its prefill there unless
        the worker holds its KV cache, and count a migration."""
        done, last = self.generated[rid], self.last_worker[rid]
        prefill = self.prompt_tokens if last < 0 else (self.prompt_tokens + done if last != w else 0)
        self.migrations += 0 <= last != w
        if prefill:
            t, delay = self.clock_t[w], prefill * self.cost.per_token_s
            self.timelines[w].append((t, t + delay, len(self.running[w]) + 1))
            self.clock_t[w] = t + delay
        self.last_worker[rid] = w

    def result(self, policy: str, groups: Sequence[GroupWork], config: SimConfig) -> SimResult:
        """The finished step as a `SimResult`."""
        makespan = max(self.finish)
        busy = [sum(end - start for start, end, _ in line) for line in self.timelines]
        finish = [self.finish[self.offset[g]:self.offset[g + 1]] for g in range(len(groups))]
        return SimResult(policy=policy, workers=config.workers, makespan_s=makespan,
                         ideal_s=ideal_s(groups, config),
                         bubble_ratio=bubble_ratio(busy, makespan),
                         tail_s=tail_s(self.finish), migrations=self.migrations,
                         finish_s=finish, timelines=self.timelines)


class _Step(_Fluid):
    """The event loop: per-worker virtual token clocks and one global event heap.
    running[w]: a heap of (v_end, seq, rid, tokens, chunk)."""

    cluster_type = _Cluster

    def admit(self, w: int, chunk: Chunk) -> None:
        self.sync(w, self.now)
        group, sample = chunk.request
        rid = self.offset[group] + sample
        tokens = self.length[rid] - self.generated[rid]
        if chunk.budget is not None:
            tokens = min(tokens, chunk.budget)
        self.place(w, rid)
        heapq.heappush(self.running[w], (self.clock_v[w] + tokens, next(self.seq), rid, tokens, chunk))
        self.touched.add(w)

    def schedule(self, w: int) -> None:
        self.version[w] += 1
        running = self.running[w]
        if running:
            gap = max(0.0, running[0][0] - self.clock_v[w])
            t = self.clock_t[w] + gap / self.rates[len(running)]
            # events within a nanosecond count as simultaneous: the lower worker goes first
            heapq.heappush(self.events, (round(t, 9), w, self.version[w], t))

    def run(self, dispatcher: Dispatcher) -> None:
        dispatcher.dispatch(self.cluster, range(self.cluster.workers))
        self._flush()
        finished_count = 0
        while self.events:
            _, w, version, t = heapq.heappop(self.events)  # ties: lowest worker first
            if version != self.version[w]:
                continue
            self.now = t
            self.sync(w, t)
            running = self.running[w]
            self.clock_v[w] = v = max(self.clock_v[w], running[0][0])  # no float drift
            ended = []
            while running and running[0][0] <= v + 1e-9 * max(1.0, v):
                ended.append(heapq.heappop(running))
            self.cluster.changed(w, -len(ended))
            for _, _, rid, tokens, chunk in ended:
                self.generated[rid] += tokens
                finished = self.generated[rid] >= self.length[rid]
                if finished:
                    self.finish[rid] = t
                    finished_count += 1
                dispatcher.chunk_done(chunk, w, self.generated[rid], finished)
            self.touched.add(w)
            dispatcher.dispatch(self.cluster, (w,))
            self._flush()
        if finished_count < len(self.length):
            raise RuntimeError(f"{len(self.length) - finished_count} requests never finished "
                               f"({dispatcher.pending()} still queued by the policy)")

    def _flush(self) -> None:
        for w in self.touched:
            self.schedule(w)
        self.touched = set()


def simulate(policy: Placement, groups: Sequence[GroupWork], config: SimConfig,
             step: int = 0) -> SimResult:
    """Run one step of `groups` (with true `lengths`) under `policy` on config.workers."""
    check_step(groups, config)
    with no_cyclic_gc():
        sim = _Step(groups, config)
        sim.run(policy.dispatcher(groups, config.workers, step))
        return sim.result(policy.name, groups, config)


__all__ = ["SimConfig", "SimResult", "check_step", "ideal_s", "no_cyclic_gc", "simulate"]
