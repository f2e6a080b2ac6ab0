"""Every request is seeded in one place (`RequestId.seed`), whichever path generates it:
the adapter's `generate` and `generate_first`, and the scheduler runtime's chunks. The
real adapter (`RolloutEngine`) runs on a stand-in for `vllm.LLM` that records the
`SamplingParams` vLLM would have been given; the seeds are compared with the numbers runs
drew before (`test_rollout_request_id`), so a change of any path fails here. The results
carry what callers read after a rollout (`RolloutResult`, `RolloutStats`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.unit.vllm_runner_stand_in import runner_stand_in
from pipeline import distributed
from pipeline.config.schema import SchedConfig
from pipeline.loop.sched_runtime import rollout
from pipeline.rollout.contract import RequestId, Sampling
from pipeline.rollout.engine import RolloutEngine
from pipeline.sched.registry import make_policy
from pipeline.sched.settings import PlacementParams
from pipeline.sched.types import GroupWork

STEP_SEED = 65_536_327_680  # run.seed 1, step 2
N = 2
LENGTH = 20  # every response's length, when its budget allows


def output(request_id: str, tokens: list[int], finish: str):
    return SimpleNamespace(request_id=request_id, finished=True, metrics=None, outputs=[
        SimpleNamespace(token_ids=tokens, logprobs=None, finish_reason=finish)])


def respond(prompt, params) -> tuple[list[int], str]:
    """The stand-in's "model": a response is LENGTH tokens (100 and above, prompts' are
    below), each chunk of it one token repeated, drawn from its seed."""
    remaining = LENGTH - sum(t >= 100 for t in prompt["prompt_token_ids"])
    n = min(remaining, params.max_tokens)
    return [100 + (params.seed or 0) % 97] * n, "stop" if n == remaining else "length"


class StreamEngine:
    """`llm.llm_engine`: requests added one by one, all finished by the next step."""

    def __init__(self, runner):
        self.model_executor = SimpleNamespace(
            driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner)))
        self.added: list[tuple[str, int | None, int]] = []  # (id, seed, max_tokens)
        self.pending: list = []
        self.finish_per_step = 1  # requests finished by each step (the first added first)
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt, params) -> str:
        assert params.n == 1
        self.added.append((request_id, params.seed, params.max_tokens))
        self.pending.append((request_id, prompt, params))
        return f"{request_id}-0123abcd"  # vLLM's internal id

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def get_num_unfinished_requests(self) -> int:
        return len(self.pending)

    def step(self):
        done, self.pending = self.pending[:self.finish_per_step], self.pending[self.finish_per_step:]
        return [output(rid, *respond(prompt, params)) for rid, prompt, params in done]

    def abort_request(self, request_ids) -> None:
        self.aborted += request_ids
        self.pending = [x for x in self.pending if x[0] not in request_ids]


class RecordingLLM:
    """`vllm.LLM` as far as the adapter uses it without speculation or sleep mode."""

    def __init__(self):
        runner = runner_stand_in(lambda weights_iterator: None)
        self.llm_engine = StreamEngine(runner)
        self.batch_seeds: list[int | None] = []

    def generate(self, requests, params, use_tqdm=False):
        self.batch_seeds += [p.seed for p in params]
        return [output(str(i), *respond(r, p)) for i, (r, p) in enumerate(zip(requests, params))]


def engine() -> RolloutEngine:
    e = RolloutEngine.__new__(RolloutEngine)
    e._bind(RecordingLLM(), None, sleep_mode=False)
    return e


def expected(groups: int, n: int = N) -> list[int]:
    return [STEP_SEED + g * n + s for g in range(groups) for s in range(n)]


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
SAMPLING = Sampling(n=N, temperature=1.0, max_tokens=32, seed=STEP_SEED)


def test_generate_seeds_response_s_of_prompt_g_with_the_step_seed_plus_g_n_plus_s():
    e = engine()
    result = e.generate(PROMPTS, SAMPLING)
    assert e.llm.batch_seeds == expected(3) == [65_536_327_680 + i for i in range(6)]
    assert [[c.token_ids[0] for c in g] for g in result.groups] == \
        [[100 + s % 97 for s in expected(3)[2 * g: 2 * g + 2]] for g in range(3)]
    assert (result.stats.generated, result.stats.requests) == (6 * LENGTH, 6)
    assert result.stats.dropped_tokens == 0 and not result.stats.speculating
    assert result.stats.spec_metrics() == {}  # no speculation, no spec_* metrics


def test_an_unseeded_step_leaves_every_request_unseeded():
    e = engine()
    e.generate(PROMPTS, Sampling(n=N, temperature=0.0, max_tokens=32))
    assert e.llm.batch_seeds == [None] * 6


def test_generate_first_seeds_as_generate_does_and_reports_the_dropped_tokens():
    e = engine()
    stream = e.llm.llm_engine
    result = e.generate_first(PROMPTS, SAMPLING, keep=2, pinned=[False, False, True])
    assert [(rid, seed) for rid, seed, _ in stream.added] == \
        [(f"{g}:{s}", seed) for (g, s), seed in zip([(g, s) for g in range(3) for s in range(N)],
                                                     expected(3))]
    # one request finishes per step, in order: groups 0 and 1 complete first, then the
    # pinned group 2 is waited for and kept with the first, group 1 is dropped whole
    assert result.groups[0] is not None and result.groups[2] is not None
    assert result.groups[1] is None
    assert result.stats.dropped_tokens == 2 * LENGTH
    assert (result.stats.generated, result.stats.requests) == (6 * LENGTH, 6)
    assert stream.aborted == []  # every request had finished


def test_generate_first_aborts_what_it_does_not_wait_for():
    e = engine()
    stream = e.llm.llm_engine
    result = e.generate_first(PROMPTS, SAMPLING, keep=1)
    assert [g is not None for g in result.groups] == [True, False, False]
    assert sorted(stream.aborted) == ["1:0", "1:1", "2:0", "2:1"] and not stream.pending
    assert result.stats.dropped_tokens == 0 and result.stats.requests == 2


def test_scheduler_chunks_are_seeded_by_their_id_and_chunk_0_as_the_whole_response(one_rank):
    """Seer continues a response in chunks of 8 tokens: chunk c of response s of group g
    draws with the step seed + g * n + s + 1_000_003 * c, its first chunk with the seed
    `generate` gives the whole response."""
    e = engine()
    e.llm.llm_engine.finish_per_step = 100
    groups = [GroupWork(f"p{g}", N, 16.0, known=False) for g in range(len(PROMPTS))]
    policy = make_policy("seer", PlacementParams(chunk_tokens=8, migrate_gap=1, capacity=4))
    store = distributed.CoordinationStore(SchedConfig().store_timeout_s)
    out = rollout(e, PROMPTS, groups, SAMPLING, policy, store=store, capacity=4, step=2)
    added = e.llm.llm_engine.added
    assert len(added) > len(PROMPTS) * N  # responses were continued
    for rid, seed, _ in added:
        r = RequestId.parse(rid)
        assert r.chunk is not None
        assert seed == STEP_SEED + r.group * N + r.sample + 1_000_003 * r.chunk
    firsts = {RequestId.parse(rid): seed for rid, seed, _ in added
              if RequestId.parse(rid).chunk == 0}
    assert [firsts[RequestId(g, s, 0)] for g in range(3) for s in range(N)] == expected(3)
    # the completions come back whole, named by their response's id
    assert [[c.request_id for c in g] for g in out.groups] == \
        [[f"{g}:{s}" for s in range(N)] for g in range(3)]
    assert all(len(c.token_ids) == LENGTH for g in out.groups for c in g)
    assert out.local.requests == len(added)
    assert out.local.generated == sum(len(c.token_ids) for g in out.groups for c in g)
