"""The vLLM custom proposer driven the way vLLM's model runner drives it, with a stand-in
input batch (no engine; milliseconds). The real engine is exercised by the engine tests."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.history.store import prompt_hash
from pipeline.rollout.proposer import RhymeProposer, attach, speculative_config
from pipeline.spec.budget import BudgetConfig, CostModel, DraftBudget
from pipeline.spec.drafter import DrafterConfig, GroupDrafter, HistoryResponse

P = [90, 91, 92, 93]
RESPONSE = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]


class FakeBatch:
    """What RhymeProposer reads of vLLM's InputBatch: rows of prompt + output tokens."""

    def __init__(self, max_len: int = 64):
        self.max_len = max_len
        self.req_ids: list[str] = []
        self.req_id_to_index: dict[str, int] = {}
        self.num_prompt_tokens = np.zeros(8, dtype=np.int32)
        self.token_ids_cpu = np.zeros((8, max_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(8, dtype=np.int32)

    def add(self, req_id: str, prompt: list[int]) -> None:
        i = len(self.req_ids)
        self.req_ids.append(req_id)
        self.req_id_to_index[req_id] = i
        self.num_prompt_tokens[i] = len(prompt)
        self.token_ids_cpu[i, :len(prompt)] = prompt
        self.num_tokens_no_spec[i] = len(prompt)

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
    budget = DraftBudget(budget_cfg or BudgetConfig(start_len=2, max_len=8, batch_aware=False))
    attach(runner, drafter, budget)
    return proposer, batch


def step(proposer, batch, emitted: dict[str, list[int]]):
    sampled = [np.asarray(batch.emit(r, emitted[r]) if r in emitted else [], dtype=np.int64)
               for r in batch.req_ids]
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
    assert s.tau == pytest.approx(3.0) and s.accept_rate == pytest.approx(6 / 9)
    assert proposer.budget.cap("r") == 4


def test_partial_prefill_rows_get_no_draft_and_siblings_share_tokens():
    proposer, batch = make(history=False)
    batch.add("a", P)
    batch.add("b", P)
    assert step(proposer, batch, {"a": [1]}) == [[], []]  # b still prefilling
    assert step(proposer, batch, {"a": [2], "b": [1]}) == [[], [2]]  # b drafts a's token
    out = step(proposer, batch, {"a": [3], "b": [2]})
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


def test_drafts_stop_at_the_model_length():
    proposer, batch = make(max_model_len=8)
    batch.add("r", P)
    assert step(proposer, batch, {"r": [1]}) == [[2, 3]]  # 5 tokens: room for 2
    assert step(proposer, batch, {"r": [2]}) == [[3]]  # 6 tokens: room for 1
    assert step(proposer, batch, {"r": [3]}) == [[]]


def test_batch_aware_budget_trims_drafts_in_a_full_batch():
    full = BudgetConfig(start_len=8, max_len=8, prior_accept=0.4, cost=CostModel(0.001, 0.001))
    proposer, batch = make(budget_cfg=full)
    batch.add("r", P)
    # a pass that is all per-token cost: 0.4 * 0.002 s <= 0.001 s/token * 1 token -> no draft
    assert step(proposer, batch, {"r": [1]}) == [[]]
    proposer.budget = DraftBudget(BudgetConfig(start_len=8, max_len=8, prior_accept=0.6))
    assert len(step(proposer, batch, {"r": [2]})[0]) >= 4  # default cost: the tail pays
