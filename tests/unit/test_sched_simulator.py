"""The rollout-step simulator: hand-computed makespans, bubbles, tails and bounds."""

from __future__ import annotations

import random
import time

import pytest

from pipeline.errors import UsageError
from pipeline.costs import SCHED_COST, CostModel, tail_s
from pipeline.history.lengths import LengthEvidence
from pipeline.sched.load import SPEC_COST_MODELS, LoadEstimate
from pipeline.sched.registry import POLICIES, make_policy
from pipeline.sched.settings import PlacementParams
from pipeline.sched.predictor import LengthPredictor
from pipeline.sched.simulator import SimConfig, ideal_s, simulate
from pipeline.sched.types import Chunk, Dispatcher, GroupWork, Placement, Request

ONE_S_PASS = CostModel(base_s=1.0, per_token_s=0.0)  # a pass costs 1 s whatever the batch


def step(*lengths_per_group, predicted=None, known=True):
    return [GroupWork(f"p{i}", len(ls), float(predicted or max(ls)), known, tuple(ls))
            for i, ls in enumerate(lengths_per_group)]


def run(name, groups, workers, cost=ONE_S_PASS, capacity=256, prompt_tokens=0, params=None):
    config = SimConfig(workers=workers, capacity=capacity, prompt_tokens=prompt_tokens, cost=cost)
    params = params or PlacementParams(cost=cost, capacity=capacity)
    return simulate(make_policy(name, params), groups, config)


def test_cost_model_by_hand():
    assert SCHED_COST.pass_s(400) == pytest.approx(0.098)  # 18 ms + 400 * 0.2 ms
    spec = CostModel(base_s=1.0, per_token_s=0.5, tau=2.0, draft_tokens=3, spec_max_batch=2)
    assert spec.pass_s(2) == pytest.approx(1 + 0.5 * 2 * 4) and spec.tokens_per_pass(2) == 2.0
    assert spec.pass_s(3) == pytest.approx(2.5) and spec.tokens_per_pass(3) == 1.0
    assert spec.rate(2) == pytest.approx(2 / 5)
    assert set(SPEC_COST_MODELS) == {"none", "history+group"}
    for bad, message in [({"tau": 0.5}, "tau must be >= 1"), ({"base_s": 0.0, "per_token_s": 0.0}, "not both 0"),
                         ({"draft_tokens": -1}, "draft_tokens must be >= 0")]:
        with pytest.raises(ValueError, match=message):
            CostModel(**{"base_s": 0.018, "per_token_s": 0.0002, **bad})


def test_static_makespan_bubble_and_tail_by_hand():
    # w0 runs lengths 1 and 2 (busy 2 s), w1 runs 3 and 4 (busy 4 s), 1 s a pass
    r = run("static", step([1, 2, 3, 4]), 2)
    assert r.finish_s == [[1.0, 2.0, 3.0, 4.0]]
    assert r.makespan_s == 4.0 and r.bubble_ratio == pytest.approx(2 / 8)
    assert r.timelines == [[(0.0, 1.0, 2), (1.0, 2.0, 1)], [(0.0, 3.0, 2), (3.0, 4.0, 1)]]
    assert r.ideal_s == 4.0  # the longest alone; the work bound is 10 tokens / (2 a pass) / 2
    assert r.makespan_over_ideal == 1.0 and r.tail_s == 0.0  # 90 % of 4 rounds up to all 4


def test_tail_is_the_time_after_90_percent_finished():
    r = run("static", step(list(range(1, 11))), 1)
    assert r.makespan_s == 10.0 and r.tail_s == 1.0 and r.bubble_ratio == 0.0
    assert tail_s([5.0]) == 0.0
    assert tail_s([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20]) == 20 - 10  # ceil(9.9) = 10th


def test_per_token_cost_slows_every_request_of_the_batch():
    # batch 2 passes cost 2 s: the 2-token request ends at 4; then 2 more passes alone
    cost = CostModel(base_s=0.0, per_token_s=1.0)
    r = run("static", step([2, 4]), 1, cost=cost)
    assert r.finish_s == [[4.0, 6.0]]
    assert r.ideal_s == pytest.approx(6.0)  # work: 6 tokens at batch 2 = 6 s
    assert r.makespan_over_ideal == pytest.approx(1.0)


def test_capacity_queues_requests_on_a_worker():
    assert run("static", step([3, 1]), 1, capacity=1).finish_s == [[3.0, 4.0]]
    assert run("static", step([3, 1]), 1, capacity=2).finish_s == [[3.0, 1.0]]


def test_prefill_stalls_the_worker():
    # 10 prompt tokens * 0.1 s, then 2 passes of 1.1 s
    cost = CostModel(base_s=1.0, per_token_s=0.1)
    r = run("static", step([2]), 1, cost=cost, prompt_tokens=10)
    assert r.makespan_s == pytest.approx(3.2)
    assert r.timelines == [[(0.0, pytest.approx(1.0), 1), (pytest.approx(1.0), pytest.approx(3.2), 1)]]
    assert r.ideal_s == pytest.approx(3.2) and r.bubble_ratio == pytest.approx(0.0)


def test_speculation_divides_the_passes_where_it_is_on():
    spec = CostModel(base_s=1.0, per_token_s=0.0, tau=2.0, spec_max_batch=1)
    # batch 2: no speculation, 2 passes; alone: 4 tokens in 2 passes
    assert run("static", step([2, 6]), 1, cost=spec).finish_s == [[2.0, 4.0]]
    assert run("static", step([4]), 1, cost=spec).makespan_s == 2.0


class Scripted(Placement):
    """Request (0, 0) runs one 2-token chunk on worker 0, then the rest on worker `then`;
    request (0, 1), of length 0, runs on worker 1."""

    name = "scripted"

    def __init__(self, then):
        super().__init__()
        self.then = then

    def assign(self, groups, workers, step=0):
        raise NotImplementedError

    def dispatcher(self, groups, workers, step=0):
        then = self.then

        class D(Dispatcher):
            todo = [(1, Chunk(Request(0, 1))), (0, Chunk(Request(0, 0), 2))]

            def dispatch(self, cluster, freed):
                while self.todo:
                    cluster.assign(*self.todo.pop())

            def chunk_done(self, chunk, worker, generated, finished):
                if not finished:
                    self.todo.append((then, Chunk(chunk.request, None)))

            def pending(self):
                return len(self.todo)

        return D()


def test_migration_pays_a_re_prefill_of_prompt_and_output():
    cost = CostModel(base_s=1.0, per_token_s=0.5)
    config = SimConfig(workers=2, prompt_tokens=2, cost=cost)
    # w0: prefill 2 * 0.5 = 1 s, 2 passes of 1.5 s -> 4 s; w1 (after its empty request's
    # 1 s prefill): re-prefill (2 + 2) * 0.5 = 2 s, 1 pass -> 7.5 s
    moved = simulate(Scripted(then=1), step([3, 0]), config)
    assert moved.makespan_s == pytest.approx(7.5) and moved.migrations == 1
    assert moved.timelines[1] == [(0.0, 1.0, 1), (4.0, 6.0, 1), (6.0, 7.5, 1)]
    assert moved.bubble_ratio == pytest.approx(1 - (4 + 4.5) / 15)
    stayed = simulate(Scripted(then=0), step([3, 0]), config)
    assert stayed.makespan_s == pytest.approx(5.5) and stayed.migrations == 0


def random_step(rng, groups, n):
    out = []
    for i in range(groups):
        base = rng.lognormvariate(3.5, 0.7)
        lengths = tuple(max(0, int(base * rng.uniform(0.6, 1.4))) for _ in range(n))
        out.append(GroupWork(f"p{i}", n, base * rng.uniform(0.7, 1.3), rng.random() < 0.9, lengths))
    return out


@pytest.mark.parametrize("name", list(POLICIES))
def test_ideal_is_a_lower_bound_and_every_request_finishes(name):
    rng = random.Random(3)
    for case in range(15):
        workers = rng.choice([1, 2, 3, 8])
        groups = random_step(rng, rng.randint(workers, 12), rng.choice([1, 4]))
        if sum(g.n for g in groups) < workers:
            continue
        capacity = rng.choice([1, 4, 256])
        r = run(name, groups, workers, cost=SCHED_COST, capacity=capacity, prompt_tokens=8)
        assert r.makespan_s >= r.ideal_s * (1 - 1e-9), (case, r.summary())
        assert all(t == t for g in r.finish_s for t in g)  # no NaN: every request finished
        assert 0.0 <= r.bubble_ratio < 1.0 and 0.0 <= r.tail_s <= r.makespan_s


def test_ideal_by_hand_with_the_default_cost():
    groups = step([100], [10, 10, 10])
    config = SimConfig(workers=2, prompt_tokens=0)
    # batch min(256, ceil(4/2)) = 2: 130 tokens * (18.4 ms / 2) / 2 = 0.598 s; alone 100 * 18.2 ms
    assert ideal_s(groups, config) == pytest.approx(1.82)
    assert ideal_s(step([10] * 40), SimConfig(workers=1, prompt_tokens=0)) == pytest.approx(
        400 * (0.018 + 0.0002 * 40) / 40)


@pytest.mark.parametrize("name", ["static", "histopipe", "seer"])
def test_an_unknown_prompt_is_not_starved_by_long_predicted_work(name):
    """20 groups predicted (and running) 100 tokens, then a prompt never seen before: the
    fallback prediction places it, and it finishes within Graham's list bound."""
    predictor = LengthPredictor(LengthEvidence({f"long{i}": {0: [100] * 4} for i in range(20)}))
    groups = [GroupWork(f"long{i}", 4, predictor.predict(f"long{i}"), True, (100,) * 4) for i in range(20)]
    groups.append(GroupWork("new", 4, predictor.predict("new"), predictor.known("new"), (5,) * 4))
    assert groups[-1].predicted == 100.0 and not groups[-1].known
    r = run(name, groups, 2, capacity=1)
    total = sum(sum(g.lengths) for g in groups)
    assert max(r.finish_s[-1]) <= total / 2 + 100  # total work / W + the longest request
    assert max(r.finish_s[-1]) <= r.makespan_s


def test_seer_starts_an_unknown_prompts_probe_in_the_first_wave():
    groups = [GroupWork(f"long{i}", 8, 500.0, True, (500,) * 8) for i in range(30)]
    groups.append(GroupWork("new", 8, 500.0, False, (20,) * 8))
    r = run("seer", groups, 4, capacity=8)
    probes_end = 30 * 500 / (4 * 8) + 500  # every probe is in the first 31 starts
    assert r.finish_s[-1][0] <= probes_end


def test_more_workers_than_requests_is_a_usage_error():
    with pytest.raises(UsageError, match="^3 workers for 2 requests: give at most 2 workers"):
        run("seer", step([1, 2]), 3)
    with pytest.raises(ValueError, match="needs every group's true lengths"):
        simulate(make_policy("static"), [GroupWork("p", 1, 1.0)], SimConfig(workers=1))


def test_zero_length_requests_finish_at_once():
    r = run("seer", step([0, 3]), 1)
    assert r.finish_s == [[0.0, 3.0]]


def test_load_estimate_skips_full_and_stale_workers():
    est = LoadEstimate(3, CostModel(base_s=1.0, per_token_s=0.0), capacity=10)
    est.add(0, 5.0)
    est.add(1, 2.0)
    assert est.best() == 2
    est.set_available(2, False)
    assert est.best() == 1
    est.done(1, 2.0)
    assert est.best() == 1 and est.time(1) == 0.0
    est.set_available(2, True)
    assert est.best() == 1  # lowest index on ties


def test_load_estimate_longest_follows_adds_and_completions():
    """The cached longest outstanding length equals a recount after every change."""
    rng = random.Random(7)
    est = LoadEstimate(4, CostModel(base_s=1.0, per_token_s=0.01), capacity=8, floor=3.0)
    outstanding: list[list[float]] = [[] for _ in range(4)]
    for _ in range(2000):
        w = rng.randrange(4)
        if outstanding[w] and rng.random() < 0.5:
            length = outstanding[w].pop(rng.randrange(len(outstanding[w])))
            est.done(w, length)
        else:
            length, count = float(rng.choice([1, 2, 5, 5, 9, 40])), rng.choice([1, 1, 3])
            outstanding[w] += [length] * count
            est.add(w, length, count)
        for v in range(4):
            assert est.longest(v) == max(outstanding[v], default=0.0)
            tokens = sum(outstanding[v])
            assert est.time(v) == pytest.approx(max(max(outstanding[v], default=0.0), 3.0, tokens / 8)
                                                + 0.01 * tokens)


def test_load_estimate_prices_speculation_at_the_workers_batch():
    # tau 2 and 3 drafts a request while at most 2 requests run, no speculation above
    cost = CostModel(base_s=1.0, per_token_s=0.1, tau=2.0, draft_tokens=3, spec_max_batch=2)
    est = LoadEstimate(2, cost, capacity=8)
    est.add(0, 40.0)
    est.add(0, 10.0)
    # speculating: 40 / 2 passes of 1 s, 50 tokens scheduled 4 times for every 2 emitted
    assert est.time(0) == pytest.approx((1.0 * 40 + 0.1 * 4 * 50) / 2)
    # a third request stops speculation: 40 passes, every token scheduled once
    assert est.time_with(0, 10.0) == pytest.approx(1.0 * 40 + 0.1 * 60)
    est.add(0, 10.0)
    assert est.time(0) == pytest.approx(46.0)
    est.done(0, 10.0)
    assert est.time(0) == pytest.approx(30.0)


def test_the_oracle_balances_under_speculation():
    # One 100-token request and 40 of 10 tokens on 2 workers; tau 2.5, 4 drafts a request.
    # By hand: the 40 short ones run 4 passes. With m of them beside the long one, its
    # worker takes 4 passes of 0.1 + 0.1 (m + 1) s, then 36 alone of 0.2 s: 8 + 0.4 m; the
    # other worker takes 4 passes of 0.1 + 0.1 (40 - m) s: 16.4 - 0.4 m. The best split
    # (m = 10 or 11) ends at 12.4 s. Pricing speculation as if there were none put fewer
    # beside the long one and took 16.4 s.
    cost = CostModel(base_s=0.1, per_token_s=0.02, tau=2.5, draft_tokens=4)
    groups = [GroupWork("long", 1, 100.0, True, (100,))] + \
        [GroupWork(f"s{i}", 1, 10.0, True, (10,)) for i in range(40)]
    r = simulate(make_policy("oracle", PlacementParams(cost=cost, capacity=256)), groups,
                 SimConfig(workers=2, prompt_tokens=0, cost=cost))
    assert r.makespan_s == pytest.approx(12.4)


def test_no_cyclic_gc_restores_the_collector():
    import gc

    from pipeline.sched.simulator import no_cyclic_gc

    assert gc.isenabled()
    with pytest.raises(KeyError):
        with no_cyclic_gc():
            assert not gc.isenabled()
            raise KeyError("x")
    assert gc.isenabled()
    gc.disable()
    try:
        with no_cyclic_gc():
            pass
        assert not gc.isenabled()  # left off, as it was
    finally:
        gc.enable()


def test_a_thousand_workers_simulate_quickly():
    rng = random.Random(0)
    groups = random_step(rng, 1024, 8)  # 8 requests a worker
    start = time.perf_counter()
    results = {n: run(n, groups, 1024, cost=SCHED_COST, prompt_tokens=16) for n in POLICIES}
    assert time.perf_counter() - start < 20
    for r in results.values():
        assert len(r.timelines) == 1024 and r.makespan_s >= r.ideal_s * (1 - 1e-9)  # oracle: = ideal
    assert results["oracle"].makespan_s <= results["static"].makespan_s
