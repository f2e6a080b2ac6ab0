"""The ideal bound under the simulator's own cost model, and over_oracle."""

from __future__ import annotations

import pytest

from pipeline.bench.sched import with_oracle
from pipeline.sched.bound import ideal_makespan, throughputs
from pipeline.sched.load import SPEC_COST_MODELS
from pipeline.costs import SCHED_COST, CostModel
from pipeline.sched.registry import make_policy
from pipeline.sched.settings import PlacementParams
from pipeline.sched.simulator import SimConfig, simulate
from pipeline.sched.types import GroupWork

ONE_S_PASS = CostModel(base_s=1.0, per_token_s=0.0)
# speculation doubles tokens per pass, but only for a request running alone
SPEC_ALONE = CostModel(base_s=1.0, per_token_s=0.0, tau=2.0, spec_max_batch=1)


def groups_of(*lengths):
    return [GroupWork(f"p{i}", 1, float(x), True, (x,)) for i, x in enumerate(lengths)]


def sim(name, groups, workers, cost):
    config = SimConfig(workers=workers, prompt_tokens=0, cost=cost)
    return simulate(make_policy(name, PlacementParams(cost=cost)), groups, config)


def test_throughput_is_the_best_at_or_below_each_batch():
    best = throughputs(SPEC_ALONE, 3)
    assert list(best) == [0.0, 2.0, 2.0, 3.0]  # thr(1) = 2 (speculating), thr(2) = 2, thr(3) = 3


def test_oracle_reaches_the_bound_where_the_optimum_is_known_by_hand():
    # three 4-token requests on 2 workers, speculation only alone: one worker must hold
    # two of them, 8 tokens at 2 tokens/s at best (alone at tau 2 or both at batch 2):
    # the optimum is 4 s. The old bound (work at the even batch, 12 tokens / 2 / 2 = 3 s,
    # and the longest alone at tau, 2 s) said 3 s, which no placement reaches.
    groups = groups_of(4, 4, 4)
    assert ideal_makespan([4, 4, 4], 2, 256, 0, SPEC_ALONE) == pytest.approx(4.0)
    oracle = sim("oracle", groups, 2, SPEC_ALONE)
    assert oracle.makespan_s == pytest.approx(4.0)
    assert oracle.ideal_s == pytest.approx(oracle.makespan_s)


def test_bound_by_hand_without_speculation():
    # W = 2, lengths 6, 2, 2, 2 at 1 s a pass: the 6 alone is the critical path (6 s);
    # the oracle puts it alone and the three 2s together: 6 s
    assert ideal_makespan([6, 2, 2, 2], 2, 256, 0, ONE_S_PASS) == pytest.approx(6.0)
    assert sim("oracle", groups_of(6, 2, 2, 2), 2, ONE_S_PASS).makespan_s == pytest.approx(6.0)
    # per-token cost only: the work term, 12 tokens at 1 s each over 2 workers... at batch
    # 2 a pass costs 2 s for 2 tokens, so 1 s a token whatever the batch: 12 / 2 = 6 s
    per_token = CostModel(base_s=0.0, per_token_s=1.0)
    assert ideal_makespan([3, 3, 3, 3], 2, 256, 0, per_token) == pytest.approx(6.0)
    # prefill counts: 4 prompt tokens at 0.5 s a token before each request
    cost = CostModel(base_s=1.0, per_token_s=0.5)
    assert ideal_makespan([2], 1, 256, 4, cost) == pytest.approx(4 * 0.5 + 2 * 1.5)


def test_capacity_limits_the_pile_up_batch():
    # one worker, capacity 1: four 3-token requests run one after the other, 12 s
    assert ideal_makespan([3, 3, 3, 3], 1, 1, 0, ONE_S_PASS) == pytest.approx(12.0)
    assert ideal_makespan([3, 3, 3, 3], 1, 4, 0, ONE_S_PASS) == pytest.approx(3.0)


@pytest.mark.parametrize("cost", [ONE_S_PASS, SPEC_ALONE, SCHED_COST,
                                  SPEC_COST_MODELS["history+group"]])
def test_no_policy_beats_the_bound(cost):
    import random

    rng = random.Random(3)
    groups = [GroupWork(f"p{i}", 4, 50.0, True, tuple(rng.randint(1, 120) for _ in range(4)))
              for i in range(24)]
    for name in ("static", "histopipe", "seer", "oracle"):
        r = sim(name, groups, 5, cost)
        assert r.makespan_s >= r.ideal_s * (1 - 1e-9), name


def test_every_policy_reports_over_oracle():
    groups = groups_of(6, 2, 2, 2, 5, 1)
    per_token = CostModel(base_s=0.0, per_token_s=1.0)  # a worker's time = its tokens
    config = SimConfig(workers=2, prompt_tokens=0, cost=per_token)
    params = PlacementParams(cost=per_token)
    results = {n: simulate(make_policy(n, params), groups, config) for n in ("static", "seer")}
    with_oracle(results, groups, config, params)
    oracle = simulate(make_policy("oracle", params), groups, config).makespan_s
    for r in results.values():
        assert r.oracle_s == oracle
        assert r.summary()["over_oracle"] == pytest.approx(r.makespan_s / oracle)
    # static: 6 + 2 + 2 = 10 s on w0; the oracle (LPT) balances 9 and 9
    assert results["static"].over_oracle == pytest.approx(10 / 9)


def test_share_bound_when_every_worker_holds_a_longest_response():
    # four 10-token responses on 2 workers, 1 s a pass + 0.1 s a token: each worker runs
    # two at once, 10 passes + 20 tokens = 12 s. Pile-up alone says 2 * 10 / thr(2) =
    # 10 / (1 / 1.2) = 12 too; make the short ones matter: 10, 10, 1, 1 -> 10 + 0.1 * 11
    cost = CostModel(base_s=1.0, per_token_s=0.1)
    assert ideal_makespan([10, 10, 10, 10], 2, 256, 0, cost) == pytest.approx(12.0)
    assert sim("oracle", groups_of(10, 10, 10, 10), 2, cost).makespan_s == pytest.approx(12.0)
    assert ideal_makespan([10, 10, 1, 1], 2, 256, 0, cost) == pytest.approx(11.1)
    assert sim("oracle", groups_of(10, 10, 1, 1), 2, cost).makespan_s == pytest.approx(11.1)
