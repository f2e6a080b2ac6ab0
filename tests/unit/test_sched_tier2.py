"""HistoPipe tier 2: the longest predicted groups on reserved workers, few sequences each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.sched.events import simulate_events
from pipeline.sched.registry import POLICIES, make_policy
from pipeline.sched.settings import PlacementParams
from pipeline.sched.simulator import SimConfig, simulate
from pipeline.sched.types import GroupWork, Request

ONE_S_PASS = PlacementParams()


def groups_with(predicted, n=4, lengths=None):
    return [GroupWork(f"p{i}", n, float(p), True, lengths[i] if lengths else (int(p),) * n)
            for i, p in enumerate(predicted)]


def test_registered_and_every_request_placed_once():
    assert "tier2" in POLICIES
    groups = groups_with([10, 80, 30, 50, 20, 70, 60, 40])
    plan = make_policy("tier2", replace(ONE_S_PASS, tier2_workers_frac=0.25, tier2_max_seqs=2)).assign(groups, 8)
    placed = [r for w in plan for r in w]
    assert sorted(placed) == sorted(Request(g, s) for g in range(8) for s in range(4))
    # 2 reserved workers (the last two) x 2 sequences: the longest group (p1, 80) split over them
    assert sorted(plan[6] + plan[7]) == [Request(1, s) for s in range(4)]
    assert all(len(w) == 2 for w in plan[6:])
    # tier 1 never gets p1; the next-longest groups stay whole on their worker
    assert all(r.group != 1 for w in plan[:6] for r in w)
    assert any(sorted(w) == [Request(5, s) for s in range(4)] for w in plan[:6])


def test_no_reserve_is_tier_one():
    groups = groups_with([10, 80, 30, 50, 20, 70])
    params = replace(ONE_S_PASS, tier2_workers_frac=0.0)
    assert make_policy("tier2", params).assign(groups, 3) == make_policy("histopipe", params).assign(groups, 3)


def test_bad_tier2_knobs():
    with pytest.raises(ValueError, match="tier2_workers_frac must be in"):
        PlacementParams(tier2_workers_frac=1.0)
    with pytest.raises(ValueError, match="tier2_max_seqs must be >= 1"):
        PlacementParams(tier2_max_seqs=0)


def test_tier2_runs_the_long_group_with_fewer_sequences_a_pass():
    # per-token cost only: a long group beside short ones pays for their tokens every pass.
    from pipeline.costs import SCHED_COST, CostModel

    cost = CostModel(base_s=0.01, per_token_s=0.01)
    lengths = [(200, 200, 200, 200)] + [(20, 20, 20, 20)] * 7
    groups = groups_with([200] + [20] * 7, lengths=lengths)
    config = SimConfig(workers=4, prompt_tokens=0, cost=cost)
    params = PlacementParams(cost=cost, tier2_workers_frac=0.5, tier2_max_seqs=2)
    tier1 = simulate(make_policy("histopipe", params), groups, config)
    tier2 = simulate(make_policy("tier2", params), groups, config)
    # tier 1: the long group alone on one worker at batch 4; tier 2: two workers at batch 2
    assert tier2.makespan_s < tier1.makespan_s
    assert simulate_events(make_policy("tier2", params), groups, config).makespan_s == \
        pytest.approx(tier2.makespan_s, rel=1e-9)
