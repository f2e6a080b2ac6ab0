"""The target side of `rhymectl bench drafter`: vLLM's model runner as a proposer sees it.

After every target pass vLLM's runner (`vllm/v1/worker/gpu_model_runner.py`) writes each
row's sampled tokens into `input_batch.token_ids_cpu` and `num_tokens_no_spec`
(`_bookkeeping_sync`), then asks the proposer for drafts (`propose_draft_token_ids`):
rhymectl's `custom_class` proposer as `propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu)`, vLLM's suffix proposer as `propose(k, input_batch, sampled_token_ids)`.
Finished requests leave the batch before the next pass, the last rows moving into the
holes (`InputBatch.condense`). `InputBatch` here holds what either proposer reads.

A `Lane` is one proposer on its own copy of the step. Each request follows its planned
response: a pass emits the longest prefix of the request's draft that matches the plan,
plus one token, so the output is the target's whatever is drafted and both proposers see
the same token streams. The first call hands every request the first `start` tokens of its
response at once (a rollout reaching the window), untimed; the timed passes follow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from pipeline.bench.drafter_workload import Workload


class InputBatch:
    """What a proposer reads of vLLM's `InputBatch`, with vLLM's row condensing."""

    def __init__(self, max_reqs: int, width: int):
        self.req_ids: list[str] = []
        self.req_id_to_index: dict[str, int] = {}
        self.num_prompt_tokens = np.zeros(max_reqs, dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_reqs, dtype=np.int32)
        self.token_ids_cpu = np.zeros((max_reqs, width), dtype=np.int32)

    def add(self, req_id: str, prompt: np.ndarray) -> None:
        i = len(self.req_ids)
        self.req_ids.append(req_id)
        self.req_id_to_index[req_id] = i
        self.num_prompt_tokens[i] = len(prompt)
        self.token_ids_cpu[i, :len(prompt)] = prompt
        self.num_tokens_no_spec[i] = len(prompt)

    def emit(self, i: int, tokens: list[int]) -> None:
        n = int(self.num_tokens_no_spec[i])
        self.token_ids_cpu[i, n:n + len(tokens)] = tokens
        self.num_tokens_no_spec[i] = n + len(tokens)

    def remove(self, gone: set[str]) -> None:
        """vLLM's `condense`: the last rows move down into the holes."""
        ids: list[str | None] = list(self.req_ids)
        holes = sorted(self.req_id_to_index.pop(r) for r in gone)
        for hole in holes:
            ids[hole] = None
        last = len(ids) - 1
        for hole in holes:
            while last >= 0 and ids[last] is None:
                last -= 1
            if hole >= last:
                break
            r, ids[last] = ids[last], None
            ids[hole] = r
            self.req_id_to_index[r] = hole
            for arr in (self.num_prompt_tokens, self.num_tokens_no_spec, self.token_ids_cpu):
                arr[hole] = arr[last]
        self.req_ids = [r for r in ids if r is not None]


@dataclass
class PassLog:
    """Per timed pass: ms in the proposer (wall and this thread's CPU time: on a shared
    machine the wall time also holds the time other processes had the core), rows, draft
    tokens, accepted draft tokens
    (of the drafts made in that pass, known after the next one); totals over them."""

    ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # this thread's CPU time in the proposer
    rows: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    seq_passes: int = 0  # rows that emitted tokens in the timed passes
    emitted: int = 0  # their tokens

    @property
    def tau(self) -> float:
        return self.emitted / self.seq_passes if self.seq_passes else 1.0

    @property
    def accept_rate(self) -> float:
        drafted = sum(self.drafted[:len(self.accepted)])
        return sum(self.accepted) / drafted if drafted else 0.0


Propose = Callable[[list[list[int]]], Sequence[Sequence[int]]]


class Lane:
    """One proposer driven through one step of `work` from output token `start` on.

    propose(sampled) -> drafts per row; it reads `batch` as the runner left it. Request ids
    are `{id_prefix}{prompt}:{sample}` (a proposer that lives across steps needs each
    step's ids new, as vLLM's are)."""

    def __init__(self, name: str, work: Workload, batch: InputBatch, propose: Propose,
                 start: int, id_prefix: str = ""):
        self.name = name
        self.batch = batch
        self.propose = propose
        self.log = PassLog()
        self.plan: dict[str, list[int]] = {}
        self.length: dict[str, int] = {}
        self.produced: dict[str, int] = {}
        self.draft: dict[str, list[int]] = {}
        for p, prompt in enumerate(work.prompts):
            for j, planned in enumerate(work.planned[p]):
                req_id = f"{id_prefix}{p}:{j}"
                batch.add(req_id, prompt)
                self.plan[req_id] = planned.tolist()
                self.length[req_id] = work.lengths[p][j]
                self.produced[req_id] = 0
                self.draft[req_id] = []
        self.start = start
        self.started = False

    @property
    def live(self) -> int:
        return len(self.batch.req_ids)

    def fast_forward(self) -> None:
        """The untimed first call: every request's first `start` tokens (at least one)."""
        sampled = []
        for i, req_id in enumerate(self.batch.req_ids):
            toks = self.plan[req_id][:max(1, self.start)]
            self.batch.emit(i, toks)
            self.produced[req_id] = len(toks)
            sampled.append(toks)
        self._after(self.propose(sampled), timed=False)
        self.started = True

    def run(self, passes: int, gpu_s: float = 0.0) -> int:
        """Up to `passes` timed passes (fewer when every request finishes); returns how
        many ran. gpu_s: seconds each target pass sleeps before the proposer is called
        (a GPU pass: the host thread waits with the GIL released)."""
        if not self.started:
            self.fast_forward()
        log, batch = self.log, self.batch
        done = 0
        while done < passes and batch.req_ids:
            sampled = []
            accepted = 0
            for i, req_id in enumerate(batch.req_ids):
                want, have, draft = self.plan[req_id], self.produced[req_id], self.draft[req_id]
                acc = 0
                for tok in draft:
                    if have + acc >= len(want) or tok != want[have + acc]:
                        break
                    acc += 1
                toks = want[have:min(have + acc + 1, self.length[req_id])]
                if not toks:
                    raise RuntimeError(f"request {req_id} ran past its planned tokens")
                batch.emit(i, toks)
                self.produced[req_id] = have + len(toks)
                sampled.append(toks)
                accepted += min(acc, len(toks) - 1)
                log.emitted += len(toks)
            log.seq_passes += len(sampled)
            if log.drafted:
                log.accepted.append(accepted)
            if gpu_s:
                time.sleep(gpu_s)
            t0, c0 = time.perf_counter(), time.thread_time()
            drafts = self.propose(sampled)
            log.ms.append((time.perf_counter() - t0) * 1e3)
            log.cpu_ms.append((time.thread_time() - c0) * 1e3)
            log.rows.append(len(sampled))
            self._after(drafts, timed=True)
            done += 1
        return done

    def _after(self, drafts: Sequence[Sequence[int]], timed: bool) -> None:
        batch = self.batch
        drafted = 0
        for req_id, d in zip(batch.req_ids, drafts):
            self.draft[req_id] = d if type(d) is list else list(d)
            drafted += len(d)
        if timed:
            self.log.drafted.append(drafted)
        gone = {r for r in batch.req_ids if self.produced[r] >= self.length[r]}
        if gone:
            batch.remove(gone)


def simulated_runner(spec, batch: InputBatch | None, max_model_len: int):
    """What `Drafting` attaches to in place of vLLM's model runner: the input batch and a
    `RhymeProposer` built as vLLM builds it for `spec` (its engine's draft cap)."""
    from types import SimpleNamespace

    from pipeline.rollout.proposer import RhymeProposer
    from pipeline.rollout.speculation import engine_draft_tokens

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=engine_draft_tokens(spec)),
        model_config=SimpleNamespace(max_model_len=max_model_len))
    return SimpleNamespace(input_batch=batch, drafter=RhymeProposer(config))


__all__ = ["InputBatch", "Lane", "PassLog", "simulated_runner"]
