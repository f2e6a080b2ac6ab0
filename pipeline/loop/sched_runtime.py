"""Running one step's rollout work on the torchrun ranks (the rollout workers) for real.

Every rank is a worker with its own in-process vLLM engine, fed request by request. Rank 0
is also the coordinator: it holds the placement policy's `Dispatcher` (the global queue;
`pipeline.sched.types`) and sees the workers through a `Cluster` whose `assign` posts a
chunk to that worker. Coordination goes through the run's `CoordinationStore` (a torch.distributed
`TCPStore` hosted by rank 0; `pipeline.distributed`), one key namespace per rollout:

    a/<w>/<k>   k-th chunk assigned to worker w  (JSON: group, sample, prefix, tokens)
    an/<w>      how many chunks worker w was assigned (a counter: store.add)
    e/<w>/<k>   k-th chunk worker w finished      (JSON: tokens, logprobs, finish reason, time)
    en/<w>      how many chunks worker w finished
    done        set by the coordinator when the dispatcher is empty and nothing runs

A value is always written before its counter is raised, so whoever sees the counter finds
the value; its reader deletes it, and rank 0 deletes the counters after the step, so the
store holds only work in flight however long the run. A chunk that stops at its token budget without finishing goes back to the
dispatcher (`chunk_done(..., finished=False)`), which continues it on the same or another
worker: the continuation re-prefills prompt + partial output and samples the rest, so the
response keeps the distribution it would have had in one piece (only the random stream
differs), and logprobs of every chunk are kept. After the step every rank receives every
completion (broadcast over the process group) and per-worker busy time.

Scheduling changes when and where a token is generated, never which distribution it is
drawn from: each chunk is sampled by the same policy weights with the same settings.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch.distributed as dist

from pipeline.costs import CostModel, bubble_ratio, fit, tau
from pipeline.distributed import CoordinationStore
from pipeline.rollout.contract import Completion, RequestId, RolloutStats
from pipeline.sched.types import Chunk, Dispatcher, GroupWork, Placement, Request

POLL_S = 0.0005  # idle wait between store polls


@dataclass
class WorkerTimes:
    """One worker's view of a distributed rollout."""

    busy_s: float = 0.0  # inside engine steps with requests running
    wall_s: float = 0.0  # from the start until the coordinator said done
    chunks: int = 0
    migrated_in: int = 0  # continuations that started here after another worker's chunk
    timeline: list = field(default_factory=list)  # (start_s, end_s, running) per engine step
    passes: object = None  # the engine's PassCounts over the rollout
    generated: int = 0  # tokens generated here
    requests: int = 0  # chunks run here (each one an engine request)


@dataclass
class StepRollout:
    """What every rank gets back: completions per group and the workers' times."""

    groups: list  # [G][n] Completion
    workers: list[WorkerTimes] = field(default_factory=list)
    makespan_s: float = 0.0
    migrations: int = 0
    local: RolloutStats | None = None  # what this rank's engine measured (its stream)

    @property
    def bubble_ratio(self) -> float:
        return bubble_ratio([w.busy_s for w in self.workers], self.makespan_s)


def measured_cost(workers: Sequence[WorkerTimes], fallback: CostModel) -> CostModel:
    """The pass-cost model the workers measured (`pipeline.costs`): base and per-token
    seconds by least squares over their decode passes (`fallback`'s where the passes
    cannot determine them); with speculation also tau (tokens per request and pass) and
    draft tokens per request and pass."""
    workers = [w for w in workers if w.passes is not None]
    samples = [(t, s) for w in workers for t, s, prefill in w.passes.samples if not prefill]
    fitted = fit(samples, fallback)
    fitted = CostModel(base_s=fitted.base_s, per_token_s=fitted.per_token_s)
    decode = sum(w.passes.seq_passes - w.passes.prefill_seq_passes for w in workers)
    drafts = sum(w.passes.draft_tokens for w in workers)
    if not drafts or not decode:
        return fitted
    emitted = sum(w.generated - w.requests for w in workers)  # after each chunk's prefill
    return replace(fitted, tau=max(1.0, tau(emitted, decode)), draft_tokens=round(drafts / decode))


class _RemoteCluster:
    """The workers as the coordinator's dispatcher sees them."""

    def __init__(self, channel, workers: int, capacity: int):
        self.channel, self.workers, self.capacity = channel, workers, capacity
        self.loads = [0] * workers
        self.sent = [0] * workers
        self.running: dict[Request, int] = {}  # request -> worker, while a chunk runs
        self.last_worker: dict[Request, int] = {}
        self.migrations = 0
        self.prefix: dict[Request, list[int]] = {}  # tokens so far of a continuing request
        self.chunks: dict[Request, int] = {}  # chunks started per request

    def load(self, worker: int) -> int:
        return self.loads[worker]

    def least_loaded(self) -> int | None:
        free = [w for w in range(self.workers) if self.loads[w] < self.capacity]
        return min(free, key=lambda w: (self.loads[w], w)) if free else None

    def assign(self, worker: int, chunk: Chunk) -> None:
        r = chunk.request
        if r in self.last_worker and self.last_worker[r] != worker:
            self.migrations += 1
        payload = {"g": r.group, "s": r.sample, "prefix": self.prefix.get(r, []),
                   "budget": chunk.budget, "chunk": self.chunks.get(r, 0)}
        self.channel.set(f"a/{worker}/{self.sent[worker]}", json.dumps(payload))
        self.sent[worker] += 1
        self.channel.add(f"an/{worker}", 1)
        self.loads[worker] += 1
        self.running[r] = worker
        self.last_worker[r] = worker
        self.chunks[r] = self.chunks.get(r, 0) + 1


def rollout(engine, prompts: Sequence[list[int]], groups: Sequence[GroupWork], sampling,
            placement: Placement, *, store: CoordinationStore, capacity: int,
            step: int = 0, tp_size: int = 1, tp_group=None) -> StepRollout:
    """Run the step's `sampling.n` responses per prompt over all ranks under `placement`.

    prompts[g] are the token ids of groups[g]; every rank passes the same arguments.
    store: the run's coordination store (every rank's own handle on it).
    With tp_size T > 1 a worker is a TP group of T consecutive ranks sharing one vLLM engine
    (`tp_group`: this rank's torch.distributed subgroup): only the group's leader talks to
    the store, and each loop turn it broadcasts what to submit and whether to stop, so every
    rank of the group feeds its engine shard the same requests and steps it in lockstep.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    workers, worker, leader = world // tp_size, rank // tp_size, rank % tp_size == 0
    channel = store.channel("rollout")
    dispatcher = placement.dispatcher(groups, workers, step) if rank == 0 else None
    engine.open_stream(prompts, sampling.n)
    dist.barrier()
    started, clock0 = time.time(), time.perf_counter()
    times = WorkerTimes()
    coordinator = _Coordinator(channel, dispatcher, workers, capacity, sampling, started) if rank == 0 else None

    def in_group(value):
        """The leader's `value` on every rank of the TP group."""
        if tp_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=worker * tp_size, group=tp_group)
        return box[0]

    seen = posted = 0
    try:
        while True:
            new = []
            if leader:
                assigned = int(channel.add(f"an/{worker}", 0))
                for k in range(seen, assigned):
                    new.append(json.loads(channel.get(f"a/{worker}/{k}")))
                    channel.delete_key(f"a/{worker}/{k}")  # the store only holds work in flight
                seen = assigned
            for a in in_group(new):
                g, s, prefix = a["g"], a["s"], a["prefix"]
                remaining = sampling.max_tokens - len(prefix)
                budget = remaining if a["budget"] is None else min(a["budget"], remaining)
                # seeded by its id: chunk 0 draws what the unchunked response would
                engine.submit(RequestId(g, s, a["chunk"]), list(prompts[g]) + list(prefix),
                              replace(sampling, max_tokens=budget), prompt_len=len(prompts[g]))
                times.chunks += 1
                times.migrated_in += bool(prefix)
            if engine.busy():
                running = engine.running()
                t0 = time.perf_counter()
                finished = engine.step()
                t1 = time.perf_counter()
                times.busy_s += t1 - t0
                times.timeline.append((t0 - clock0, t1 - clock0, running))
                for rid, c in finished if leader else ():
                    event = {"g": rid.group, "s": rid.sample, "tokens": c.token_ids,
                             "logprobs": c.logprobs, "finish": c.finish_reason,
                             "gen_s": c.gen_seconds, "t": time.time() - started}
                    channel.set(f"e/{worker}/{posted}", json.dumps(event))
                    posted += 1
                    channel.add(f"en/{worker}", 1)
            done = False
            if coordinator is not None:
                done = coordinator.tick()
                if done:
                    channel.set("done", "1")
            elif leader and not engine.busy():
                done = channel.check(["done"])
            if in_group(done):
                break
            if not engine.busy():
                time.sleep(POLL_S)
    finally:
        local = engine.close_stream()
    times.wall_s = time.time() - started
    times.passes, times.generated, times.requests = local.passes, local.generated, local.requests
    result = [coordinator.result() if coordinator else None]
    dist.broadcast_object_list(result, src=0)  # every rank has left its loop
    if rank == 0:
        for key in ["done"] + [f"{c}/{w}" for c in ("an", "en") for w in range(workers)]:
            channel.delete_key(key)
    groups_out, makespan, migrations = result[0]
    all_times = [None] * world
    dist.all_gather_object(all_times, times)
    return StepRollout(groups_out, all_times[::tp_size], makespan, migrations, local)


class _Coordinator:
    """Rank 0's side: events in, dispatcher decisions out."""

    def __init__(self, channel, dispatcher: Dispatcher, workers: int, capacity: int, sampling, started):
        self.channel, self.dispatcher, self.sampling, self.started = channel, dispatcher, sampling, started
        self.cluster = _RemoteCluster(channel, workers, capacity)
        self.read = [0] * workers
        self.parts: dict[Request, list[dict]] = {}
        self.finished: dict[Request, float] = {}
        self.dispatcher.dispatch(self.cluster, list(range(workers)))

    def tick(self) -> bool:
        """Handle new events; True when the step's work is all done."""
        freed = set()
        for w in range(self.cluster.workers):
            count = int(self.channel.add(f"en/{w}", 0))
            for k in range(self.read[w], count):
                self._event(w, json.loads(self.channel.get(f"e/{w}/{k}")))
                self.channel.delete_key(f"e/{w}/{k}")
                freed.add(w)
            self.read[w] = count
        if freed:
            self.dispatcher.dispatch(self.cluster, sorted(freed))
        return self.dispatcher.pending() == 0 and not self.cluster.running

    def _event(self, worker: int, e: dict) -> None:
        r = Request(e["g"], e["s"])
        parts = self.parts.setdefault(r, [])
        parts.append(e)
        self.cluster.loads[worker] -= 1
        self.cluster.running.pop(r, None)
        generated = sum(len(p["tokens"]) for p in parts)
        done = e["finish"] != "length" or generated >= self.sampling.max_tokens
        if not done:
            self.cluster.prefix[r] = [t for p in parts for t in p["tokens"]]
        else:
            self.finished[r] = e["t"]
        chunk = Chunk(r, None)
        self.dispatcher.chunk_done(chunk, worker, generated, done)

    def result(self):
        groups: dict[int, dict[int, Completion]] = {}
        for r, parts in self.parts.items():
            groups.setdefault(r.group, {})[r.sample] = Completion(
                request_id=str(RequestId(r.group, r.sample)),
                token_ids=[t for p in parts for t in p["tokens"]],
                logprobs=[x for p in parts for x in p["logprobs"]],
                finish_reason=parts[-1]["finish"], gen_seconds=sum(p["gen_s"] for p in parts),
                finish_s=parts[-1]["t"])
        out = [[groups[g][s] for s in sorted(groups[g])] for g in sorted(groups)]
        makespan = max(self.finished.values(), default=0.0)
        return out, makespan, self.cluster.migrations


__all__ = ["StepRollout", "WorkerTimes", "measured_cost", "rollout"]
