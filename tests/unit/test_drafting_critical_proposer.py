"""The critical-path budget behind the vLLM custom proposer, driven as vLLM's model runner
drives it (stand-in input batch, no engine; milliseconds)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.history.store import prompt_hash
from pipeline.rollout.proposer import RhymeProposer, attach
from pipeline.drafting.budget_critical import CriticalBudget, CriticalConfig
from pipeline.drafting.drafter import GroupDrafter
from pipeline.drafting.inputs import DrafterConfig, HistoryResponse
from pipeline.costs import PassCost
from tests.unit.test_rollout_proposer import P, RESPONSE, FakeBatch, step


def make(budget: CriticalBudget, history=((RESPONSE,)), max_model_len=64):
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                          model_config=SimpleNamespace(max_model_len=max_model_len))
    proposer = RhymeProposer(cfg)
    batch = FakeBatch(max_model_len)
    drafter = GroupDrafter(DrafterConfig(max_spec_factor=8.0))
    drafter.set_history(prompt_hash(P), [HistoryResponse(list(h)) for h in history])
    attach(SimpleNamespace(input_batch=batch, drafter=proposer), drafter, budget)
    return proposer, batch, drafter


def test_unknown_cost_drafts_to_the_cap_and_observations_calibrate():
    budget = CriticalBudget(CriticalConfig(max_len=4))
    proposer, batch, _ = make(budget)
    batch.add("r", P)
    assert step(proposer, batch, {"r": [1]}) == [[2, 3, 4, 5]]
    step(proposer, batch, {"r": [2, 3, 9]})  # two of four accepted, the third rejected
    rows = budget.calibrator.table()
    assert sum(r.tried for r in rows) == 3
    assert sum(r.observed * r.tried for r in rows) == 2
    assert proposer.stats.accepted == 2 and proposer.stats.drafted >= 4


def test_the_proposer_passes_predicted_remaining_lengths_from_history_and_siblings():
    seen = []

    class Spy(CriticalBudget):
        def ask(self, req_ids, available, rows, remaining):
            seen.append(dict(zip(req_ids, remaining(req_ids))))
            return super().ask(req_ids, available, rows, remaining)

    # history: responses of 12 and 30 tokens
    proposer, batch, drafter = make(Spy(CriticalConfig(max_len=4)),
                                    history=(RESPONSE, list(range(1, 31))))
    drafter.expect_group(P, 2)
    batch.add("a", P)
    batch.add("b", P)
    step(proposer, batch, {"a": [1], "b": [1]})
    # 1 generated: samples above 1 are 12 and 30 -> mean 21 - 1 = 20
    assert seen[-1]["a"][0] == 20.0
    # a finishes with 3 tokens: a sibling sample (3) joins; b at 2 tokens: mean(3, 12, 30) - 2
    step(proposer, batch, {"a": [2, 3], "b": [2]})
    batch.remove("a")
    step(proposer, batch, {"b": [3]})
    assert seen[-1]["b"][0] == (12 + 30) / 2 - 3
    assert sorted(drafter.lengths.lengths(prompt_hash(P))) == [3, 12, 30]


def test_a_measured_flat_cost_drafts_and_a_steep_one_trims_in_a_full_batch():
    # after [.., 1]: 2 always (q = 1), then 3 in 2 of 4 responses (q = 0.5), then q = 1
    history = [RESPONSE, RESPONSE, [1, 2, 50, 51, 52], [1, 2, 60, 61, 62]]
    for seconds, want in ((lambda x: 0.01, 8), (lambda x: 1e-4 * x, 1)):
        cost = PassCost(refit_every=1)
        for x in (1, 8, 64, 512):
            cost.observe(x, seconds(x))
        budget = CriticalBudget(CriticalConfig(max_len=8, first_prior=0.9), cost)
        proposer, batch, _ = make(budget, history=history)
        for i in range(8):
            batch.add(f"r{i}", P)
        out = step(proposer, batch, {f"r{i}": [1] for i in range(8)})
        # eight equally critical requests: pi = 1/8, tau = 2. Flat: m = 0, every token
        # pays. Linear 0.1 ms/token: v = c(9) / 8 / 2 = 0.056 ms, threshold
        # 0.1 / 0.156 = 0.64; calibrated cumulative acceptance 0.995, then 0.995 * 0.55:
        # one token each.
        assert [len(d) for d in out] == [want] * 8
        assert out[0][:2] == [2, 3][:want]


def test_requests_whose_first_tokens_are_rarely_accepted_are_not_drafted():
    # the steep case above with a first-token rate of 0.5: 0.5 * (0.1 + 0.056) < 0.1 ms,
    # so stage 1 asks the drafter for nothing; after accepted drafts the rate rises
    cost = PassCost(refit_every=1)
    for x in (1, 8, 64, 512):
        cost.observe(x, 1e-4 * x)
    budget = CriticalBudget(CriticalConfig(max_len=8, first_prior=0.5), cost)
    proposer, batch, _ = make(budget, history=[RESPONSE] * 4)
    for i in range(8):
        batch.add(f"r{i}", P)
    assert step(proposer, batch, {f"r{i}": [1] for i in range(8)}) == [[]] * 8
    assert proposer.drafter.stats().drafts == 0
    for _ in range(3):
        budget.observe_draft("r0", [1.0], 1)  # r0's first tokens were accepted: 0.5 -> 0.83
    out = step(proposer, batch, {f"r{i}": [2] for i in range(8)})
    assert len(out[0]) > 0 and out[1:] == [[]] * 7


def test_the_engine_drafting_state_feeds_decode_passes_and_reports_calibration():
    """`Drafting` (the engine's drafting state) hands the pass meter's decode passes to the
    budget `spec.budget` names and reads its calibration, whatever the rule."""
    from pipeline.config.schema import SpecConfig
    from pipeline.rollout.speculation import Drafting
    from tests.unit.test_history_window import _Runner

    from pipeline.costs import DRAFT_COST

    for name, cost in (("critical", "online"), ("critical", "fixed"), ("tree", "fixed"),
                       ("throughput", "fixed")):
        d = Drafting(_Runner(), SpecConfig(method="history+group", budget=name, pass_cost=cost))
        for x in (4, 8, 16, 32, 64) * 2:
            d.on_pass(x, 0.01 + 0.001 * x, prefill=False)
            d.on_pass(x, 5.0, prefill=True)  # prefill passes cost differently: not fed
        if name == "critical":
            assert isinstance(d.budget, CriticalBudget) and d.budget.cost.known
            # online: fitted to the measured passes; fixed: measured seconds decide nothing
            expected = 0.074 if cost == "online" else DRAFT_COST.pass_seconds(64)
            assert d.budget.cost.seconds(64) == pytest.approx(expected, rel=0.05)
            assert d.calibration() == d.budget.calibrator.state()
        else:
            assert d.calibration() is None
        d.drafter.close()
