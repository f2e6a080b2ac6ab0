"""The per-request choice between a tree draft, a model draft and nothing
(`pipeline.drafting.choice`), on hand-made passes."""

from __future__ import annotations

import pytest

from pipeline.costs import CostModel
from pipeline.drafting.choice import (
    MODEL, NOTHING, TREE, ChoiceCosts, Options, SourceDraft, best_prefix, choose)

# a CPU-like pass: 2 ms + 0.02 ms per scheduled token
COSTS = ChoiceCosts(CostModel(base_s=0.002, per_token_s=0.00002), model_pass_s=0.0005,
                    model_row_s=0.00001, max_len=8)


def draft(*accept: float, start: int = 10) -> SourceDraft:
    return SourceDraft(tuple(range(start, start + len(accept))), tuple(accept))


def test_a_hand_made_pass():
    """The request predicted to end the step takes the model's confident draft, a close
    second keeps the tree's sure draft over the model's doubtful one, one whose drafts are
    both poor drafts nothing, and so does one predicted to end early (on a CPU-like pass
    a token verified off the critical path costs more than it saves)."""
    options = [
        Options("last", tree=draft(0.3, 0.2), model=draft(0.95, 0.95, 0.9, 0.9, 0.9, start=50),
                remaining=(120.0, 10.0), tau=1.5),
        Options("close", tree=draft(0.99, 0.99, 0.98, start=20),
                model=draft(0.6, 0.5, start=60), remaining=(110.0, 10.0), tau=1.5),
        Options("hopeless", tree=draft(0.003), model=draft(0.004, 0.004, start=70),
                remaining=(115.0, 10.0), tau=1.5),
        Options("early", tree=draft(0.99, 0.99, start=80), model=None,
                remaining=(8.0, 3.0), tau=2.0),
        Options("no-drafts", tree=None, model=None, remaining=(20.0, 10.0)),
    ]
    got = {c.req_id: c for c in choose(options, COSTS)}
    assert got["last"].source == MODEL
    assert got["last"].tokens == (50, 51, 52, 53, 54)
    assert got["last"].expected == pytest.approx(0.95 + 0.95**2 + 0.95**2 * 0.9
                                                 + 0.95**2 * 0.9**2 + 0.95**2 * 0.9**3)
    assert got["close"].source == TREE and got["close"].tokens == (20, 21, 22)
    assert got["early"].source == NOTHING
    assert got["hopeless"].source == NOTHING and got["hopeless"].tokens == ()
    assert got["no-drafts"].source == NOTHING and got["no-drafts"].value_s == 0.0
    assert [c.req_id for c in choose(options, COSTS)] == ["last", "close", "hopeless",
                                                           "early", "no-drafts"]


def test_the_request_predicted_to_finish_last_gets_the_longer_draft():
    """Same drafts, two requests: the one predicted to end the step keeps more of an
    uncertain draft, because its accepted tokens shorten the step itself."""
    same = draft(0.7, 0.6, 0.5, 0.5, 0.5, start=30)
    options = [Options("early", tree=same, model=None, remaining=(5.0, 1.0)),
               Options("late", tree=same, model=None, remaining=(60.0, 1.0))]
    early, late = choose(options, COSTS)
    assert len(late.tokens) == 5
    assert len(early.tokens) < len(late.tokens)


def test_the_model_is_not_run_when_its_pass_costs_more_than_it_gains():
    options = [Options("a", tree=draft(0.8, 0.5), model=draft(0.9, 0.9, start=40),
                       remaining=(50.0, 5.0))]
    cheap = choose(options, COSTS)[0]
    assert cheap.source == MODEL
    dear = choose(options, ChoiceCosts(COSTS.pass_cost, model_pass_s=1.0, max_len=8))[0]
    assert dear.source == TREE and dear.tokens == (10, 11)


def test_best_prefix_stops_where_tokens_stop_paying():
    # weight 3m: a token pays while its cumulative acceptance exceeds 1/3
    n, expected, value = best_prefix(draft(0.9, 0.5, 0.5, 0.9), weight=3.0, m=1.0)
    assert n == 2  # 0.9, 0.45 pay; 0.225 does not, and neither does 0.2025 after it
    assert expected == pytest.approx(1.35)
    assert value == pytest.approx(3.0 * 1.35 - 2.0)
    assert best_prefix(None, 3.0, 1.0) == (0, 0.0, 0.0)


def test_a_draft_needs_an_estimate_per_token():
    with pytest.raises(ValueError, match="2 tokens but 1 acceptance estimates"):
        SourceDraft((1, 2), (0.5,))


def test_a_model_step_pays_when_its_best_case_gain_beats_its_cost():
    from pipeline.drafting.choice import worth_a_step

    values, m = [10e-3, 1e-4], 1e-4
    # the request worth 10 ms a token, 5 % likely to reach its next token: 0.4 ms of gain
    assert worth_a_step([0.05, 1.0], values, m, step_s=0.3e-3)
    assert not worth_a_step([0.05, 1.0], values, m, step_s=0.5e-3)
    # a token worth no more than its verification gains nothing, however sure
    assert not worth_a_step([0.0, 1.0], values, m, step_s=0.0)
