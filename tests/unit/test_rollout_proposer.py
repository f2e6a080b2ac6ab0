"""The vLLM custom proposer driven the way vLLM's model runner drives it, with a stand-in
input batch (no engine; milliseconds). The real engine is exercised by the engine tests."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.history.store import prompt_hash
from pipeline.rollout.proposer import RhymeProposer, attach, speculative_config
from pipeline.costs import CostModel
from pipeline.drafting.budget_throughput import ThroughputBudget, ThroughputConfig
from pipeline.drafting.drafter import GroupDrafter
from pipeline.drafting.inputs import DrafterConfig, HistoryResponse
from tests.unit.test_drafting_budget import cap
from tests.unit.test_drafting_drafter import cached_prompts

P = [90, 91, 92, 93]
RESPONSE = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]


class FakeBatch:
    """What RhymeProposer reads of vLLM's InputBatch: rows of prompt + output tokens."""

    def __init__(self, max_len: int = 64, rows: int = 8):
        self.max_len = max_len
        self.req_ids: list[str] = []
        self.req_id_to_index: dict[str, int] = {}
        self.num_prompt_tokens = np.zeros(rows, dtype=np.int32)
        self.token_ids_cpu = np.zeros((rows, max_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(rows, dtype=np.int32)

    def add(self, req_id: str, prompt: list[int], output: list[int] = ()) -> None:
        """A new request, or a resumed one with its output so far."""
        i = len(self.req_ids)
        self.req_ids.append(req_id)
        self.req_id_to_index[req_id] = i
        self.num_prompt_tokens[i] = len(prompt)
        tokens = list(prompt) + list(output)
        self.token_ids_cpu[i, :len(tokens)] = tokens
        self.num_tokens_no_spec[i] = len(tokens)

    def remove(self, req_id: str) -> None:  # vLLM condenses rows the same way
        keep = [r for r in self.req_ids if r != req_id]
        rows = [self.req_id_to_index[r] for r in keep]
        self.num_prompt_tokens[: len(keep)] = self.num_prompt_tokens[rows]
        self.token_ids_cpu[: len(keep)] = self.token_ids_cpu[rows]
        self.num_tokens_no_spec[: len(keep)] = self.num_tokens_no_spec[rows]
        self.req_ids = keep
        self.req_id_to_index = {r: i for i, r in enumerate(keep)}

    def emit(self, req_id: str, tokens: list[int]) -> list[int]:
        i = self.req_id_to_index[req_id]
        n = self.num_tokens_no_spec[i]
        self.token_ids_cpu[i, n:n + len(tokens)] = tokens
        self.num_tokens_no_spec[i] = n + len(tokens)
        return tokens


def make(history=True, budget_cfg=None, max_model_len=64):
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                          model_config=SimpleNamespace(max_model_len=max_model_len))
    proposer = RhymeProposer(cfg)
    batch = FakeBatch(max_model_len)
    runner = SimpleNamespace(input_batch=batch, drafter=proposer)
    drafter = GroupDrafter(DrafterConfig(max_spec_factor=8.0))
    if history:
        drafter.set_history(prompt_hash(P), [HistoryResponse(RESPONSE)])
    budget = ThroughputBudget(budget_cfg or ThroughputConfig(start_len=2, max_len=8,
                                                            batch_aware=False))
    attach(runner, drafter, budget)
    return proposer, batch


def step(proposer, batch, emitted: dict[str, list[int]]):
    sampled = [np.asarray(batch.emit(r, emitted[r]) if r in emitted else [], dtype=np.int64)
               for r in batch.req_ids]
    return proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu,
                            slot_mappings=None)


def step_rows(proposer, batch, emitted: dict[str, list[int]]):
    """As `step`, with rows as vLLM hands them over: lists of Python ints."""
    sampled = [list(batch.emit(r, emitted[r])) if r in emitted else [] for r in batch.req_ids]
    return proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu,
                            slot_mappings=None)


def test_speculative_config_names_this_class():
    assert speculative_config(8) == {"method": "custom_class",
                                     "model": "pipeline.rollout.proposer.RhymeProposer",
                                     "num_speculative_tokens": 8}


def test_unattached_proposer_drafts_nothing():
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                          model_config=SimpleNamespace(max_model_len=32))
    assert RhymeProposer(cfg).propose([[1], [2]], [5, 5], np.zeros((2, 32))) == [[], []]
    with pytest.raises(TypeError, match="RhymeProposer"):
        attach(SimpleNamespace(drafter=object()), None, None)


def test_history_drafts_grow_with_full_acceptance_and_are_observed():
    proposer, batch = make()
    batch.add("r", P)
    assert step(proposer, batch, {"r": [1]}) == [[2, 3]]  # after prefill: cap 2
    # the target accepted both drafts and added one: cap doubles to 4
    assert step(proposer, batch, {"r": [2, 3, 4]}) == [[5, 6, 7, 8]]
    assert step(proposer, batch, {"r": [5, 6, 7, 8, 9]}) == [[10, 11, 12]]  # history ends
    # the target diverged at the first draft token: cap halves (8 -> 4)
    assert step(proposer, batch, {"r": [77]}) == [[]]
    s = proposer.stats
    assert (s.seq_passes, s.emitted, s.drafted, s.accepted) == (3, 9, 9, 6)
    assert cap(proposer.budget, "r") == 4


def test_partial_prefill_rows_get_no_draft_and_siblings_share_tokens():
    proposer, batch = make(history=False)
    batch.add("a", P)
    batch.add("b", P)
    assert step(proposer, batch, {"a": [1]}) == [[], []]  # b still prefilling
    assert step(proposer, batch, {"a": [2]}) == [[], []]
    # b drafts a's tokens up to a's previous pass (its newest, 3, is held back)
    assert step(proposer, batch, {"a": [3], "b": [1]}) == [[], [2]]
    out = step(proposer, batch, {"a": [4], "b": [2]})
    assert out[1] == [3]


def test_requests_that_leave_the_batch_are_finished():
    proposer, batch = make()
    batch.add("a", P)
    batch.add("b", P)
    step(proposer, batch, {"a": [1], "b": [1]})
    batch.remove("a")
    step(proposer, batch, {"b": [2, 3]})
    assert proposer.drafter.running() == ["b"]
    proposer.end_step()
    assert proposer.drafter.running() == [] and proposer.drafter.stats().live_requests == 0


def test_a_continued_chunk_drafts_from_its_original_prompts_history():
    """A scheduler chunk that continues a response arrives as prompt + output so far; told
    where the original prompt ends, the proposer keys it by that prompt (its history)."""
    partial = RESPONSE[:4]
    for told in (True, False):
        proposer, batch = make()
        if told:
            proposer.continues("3:0:1", len(P))
        batch.add("3:0:1-a1b2c3d4", P + partial)  # vLLM appends 8 random characters
        step(proposer, batch, {"3:0:1-a1b2c3d4": [5]})
        # the request drafted from the tree of the prompt it was keyed by
        key = prompt_hash(P) if told else prompt_hash(P + partial)
        assert cached_prompts(proposer.drafter) == [key]


def test_drafts_stop_at_the_model_length():
    proposer, batch = make(max_model_len=8)
    batch.add("r", P)
    assert step(proposer, batch, {"r": [1]}) == [[2, 3]]  # 5 tokens: room for 2
    assert step(proposer, batch, {"r": [2]}) == [[3]]  # 6 tokens: room for 1
    assert step(proposer, batch, {"r": [3]}) == [[]]


def test_batch_aware_budget_trims_drafts_in_a_full_batch():
    full = ThroughputConfig(start_len=8, max_len=8, prior_accept=0.4, cost=CostModel(0.001, 0.001))
    proposer, batch = make(budget_cfg=full)
    batch.add("r", P)
    # a pass that is all per-token cost: 0.4 * 0.002 s <= 0.001 s/token * 1 token -> no draft
    assert step(proposer, batch, {"r": [1]}) == [[]]
    proposer.budget = ThroughputBudget(ThroughputConfig(start_len=8, max_len=8, prior_accept=0.6))
    assert len(step(proposer, batch, {"r": [2]})[0]) >= 4  # default cost: the tail pays


# ---------------------------------------------------------------- recorded drafts

FIXTURE = Path(__file__).parent / "data" / "proposer_drafts.json"
COSTS = {"tail": CostModel(0.006, 0.00014), "tight": CostModel(0.001, 0.0002)}


def _mutate(rng: random.Random, seq: list[int], rate: float) -> list[int]:
    out = []
    for t in seq:
        u = rng.random()
        if u < rate:
            out.append(rng.randrange(1, 12))
        elif u < 1.5 * rate:
            continue
        elif u < 2 * rate:
            out += [t, rng.randrange(1, 12)]
        else:
            out.append(t)
    return out or [1]


def simulate(method: str, cost: str, seed: int = 0) -> dict:
    """A seeded rollout through the proposer, as vLLM drives it: requests wait for one of
    8 rows, enter with a prefill pass that samples nothing, one is preempted and resumed,
    rows emit one token plus the drafted tokens that match a planned response, finished
    requests leave the batch; two steps, the second with the first's responses as history.
    Returns every pass's drafts (one string per pass) and the final counters."""
    rng = random.Random(seed)
    max_len, rows_cap, n = 64, 8, 4
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                          model_config=SimpleNamespace(max_model_len=max_len))
    proposer = RhymeProposer(cfg)
    batch = FakeBatch(max_len, rows=rows_cap)
    drafter = GroupDrafter(DrafterConfig.for_method(method, max_spec_factor=2.0, global_live=True,
                                                    chain=False))  # recorded before chains
    budget = ThroughputBudget(ThroughputConfig(max_len=8, start_len=2, cost=COSTS[cost],
                                               explore_floor=0.0))
    attach(SimpleNamespace(input_batch=batch, drafter=proposer), drafter, budget)
    prompts = [[rng.randrange(1, 12) for _ in range(5)] + [12 + g] for g in range(3)]
    bases = [[rng.randrange(1, 6) for _ in range(rng.randint(10, 60))] for _ in prompts]
    history = [[_mutate(rng, b, 0.05) for _ in range(4)] for b in bases]
    passes = []
    for step in range(2):
        plan, queue = {}, []
        for g, prompt in enumerate(prompts):
            drafter.set_history(prompt_hash(prompt), [HistoryResponse(h) for h in history[g]])
            drafter.expect_group(prompt, n)
            group = _mutate(rng, bases[g], 0.03)
            for j in range(n):
                req = f"{step}-{g}-{j}"
                plan[req] = (prompt, _mutate(rng, group, 0.03)[: max_len - len(prompt)])
                queue.append(req)
        done = {r: 0 for r in plan}
        drafts: dict[str, list[int]] = {}
        prefilling: set[str] = set()
        parked: list[tuple[int, str]] = []
        t = 0
        while queue or batch.req_ids or parked:
            for when, req in list(parked):  # resume preempted requests
                if when <= t and len(batch.req_ids) < rows_cap:
                    parked.remove((when, req))
                    prompt, want = plan[req]
                    batch.add(req, prompt, want[: done[req]])
            while queue and len(batch.req_ids) < rows_cap:
                req = queue.pop(0)
                batch.add(req, plan[req][0])
                prefilling.add(req)
            emitted = {}
            for req in batch.req_ids:
                if req in prefilling:  # this pass prefills it and samples nothing
                    prefilling.discard(req)
                    continue
                want, d = plan[req][1], drafts.pop(req, [])
                acc = 0
                while acc < len(d) and done[req] + acc < len(want) \
                        and d[acc] == want[done[req] + acc]:
                    acc += 1
                emitted[req] = want[done[req]: done[req] + acc + 1]
                done[req] += len(emitted[req])
            out = step_rows(proposer, batch, emitted)
            passes.append("|".join(",".join(map(str, d)) for d in out))
            drafts.update((r, d) for r, d in zip(batch.req_ids, out))
            for req in list(batch.req_ids):
                if done[req] >= len(plan[req][1]):
                    batch.remove(req)
            if t == 6 and batch.req_ids:  # preempt one request for two passes
                req = batch.req_ids[-1]
                batch.remove(req)
                drafts.pop(req, None)
                parked.append((t + 2, req))
            t += 1
        proposer.end_step()
        for g in range(len(prompts)):
            history[g] = (history[g] + [plan[f"{step}-{g}-{j}"][1] for j in range(n)])[-4:]
    s, ds = proposer.stats, drafter.stats()
    return {"passes": passes,
            "counters": [s.passes, s.seq_passes, s.emitted, s.drafted, s.accepted,
                         ds.drafts, ds.drafted_tokens, ds.wins, ds.tree_bytes,
                         round(budget.overall_acceptance(), 12)]}


CASES = [(m, c) for m in ("history+group", "group", "history") for c in COSTS]


@pytest.mark.parametrize("method,cost", CASES)
def test_drafts_match_the_recorded_run(method, cost):
    """Speed work must not change a single draft: compare with the recorded output of the
    implementation before it (regenerate with `python tests/unit/test_rollout_proposer.py`
    only for an intended change of behaviour)."""
    want = json.loads(FIXTURE.read_text())[f"{method}/{cost}"]
    got = simulate(method, cost)
    assert len(got["passes"]) == len(want["passes"])
    for t, (g, w) in enumerate(zip(got["passes"], want["passes"])):
        assert g == w, f"pass {t}"
    assert got["counters"] == want["counters"]


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({f"{m}/{c}": simulate(m, c) for m, c in CASES}) + "\n")


def test_a_pass_vllm_did_not_report_is_taken_from_its_token_rows():
    """vLLM skips the proposer for a whole pass when a sequence would not fit the drafter:
    the next call finds rows longer than the drafter's; it takes vLLM's tokens, keeps the
    request running (no finished length recorded) and drafts from the right context."""
    proposer, batch = make()
    batch.add("r", P)
    assert step(proposer, batch, {"r": [1]}) == [[2, 3]]
    batch.emit("r", [2, 3, 4])  # a pass the proposer never saw
    out = step(proposer, batch, {"r": [5]})
    drafter = proposer.drafter
    assert drafter.ends(["r"]) == [len(P) + 5] and proposer.stats.resynced == 1
    assert out == [[6, 7]]  # from the history, after ...4, 5: not lost at the first token
    assert drafter.running() == ["r"]
    assert drafter.lengths.lengths(prompt_hash(P)) == [len(RESPONSE)]  # history only
    assert step(proposer, batch, {"r": [6, 7, 8]}) and proposer.stats.resynced == 1


def test_rows_that_agree_with_the_drafter_are_left_alone():
    proposer, batch = make(history=False)
    batch.add("a", P)
    batch.add("b", P)
    for t in range(1, 6):
        step(proposer, batch, {"a": [t], "b": [t]})
    assert proposer.stats.resynced == 0
    assert proposer.drafter.ends(["a", "b", "zz"]) == [len(P) + 5, len(P) + 5, -1]


def test_a_thin_pass_drafts_longer_than_a_full_one():
    """PassCaps(8, 16, 296): one running request may draft 16 tokens, 40 of them 8 each
    (296 // 40 - 1 = 6, never below the full pass's 8)."""
    from pipeline.drafting.budget_tree import TreeBudget
    from pipeline.drafting.pass_caps import PassCaps

    long_response = list(range(100, 140))
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=16),
                          model_config=SimpleNamespace(max_model_len=128))
    out = {}
    for rows in (1, 40):
        proposer = RhymeProposer(cfg)
        batch = FakeBatch(128, rows=rows)
        drafter = GroupDrafter(DrafterConfig(max_spec_factor=8.0))
        drafter.set_history(prompt_hash(P), [HistoryResponse(long_response)])
        attach(SimpleNamespace(input_batch=batch, drafter=proposer), drafter, TreeBudget(16),
               PassCaps(8, 16, 296))
        for i in range(rows):
            batch.add(f"r{i}", P)
        step(proposer, batch, {f"r{i}": [100] for i in range(rows)})
        drafts = step(proposer, batch, {f"r{i}": [101] for i in range(rows)})
        out[rows] = {len(d) for d in drafts}
    assert out == {1: {16}, 40: {8}}
    with pytest.raises(ValueError, match="built for 16"):
        RhymeProposer(cfg).bind(None, None, None, PassCaps(8, 32, 296))


def test_a_pass_above_max_draft_rows_drafts_nothing():
    """spec.max_draft_rows = 20: 40 running requests get no draft, 20 get their thin
    pass's 13 (296 // 20 - 1)."""
    from pipeline.drafting.budget_tree import TreeBudget
    from pipeline.drafting.pass_caps import PassCaps

    long_response = list(range(100, 140))
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=16),
                          model_config=SimpleNamespace(max_model_len=128))
    out = {}
    for rows in (20, 40):
        proposer = RhymeProposer(cfg)
        batch = FakeBatch(128, rows=rows)
        drafter = GroupDrafter(DrafterConfig(max_spec_factor=8.0))
        drafter.set_history(prompt_hash(P), [HistoryResponse(long_response)])
        attach(SimpleNamespace(input_batch=batch, drafter=proposer), drafter, TreeBudget(16),
               PassCaps(8, 16, 296, max_rows=20))
        for i in range(rows):
            batch.add(f"r{i}", P)
        step(proposer, batch, {f"r{i}": [100] for i in range(rows)})
        drafts = step(proposer, batch, {f"r{i}": [101] for i in range(rows)})
        out[rows] = {len(d) for d in drafts}
    assert out == {20: {13}, 40: {0}}
