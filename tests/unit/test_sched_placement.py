"""Placement policies: hand-checked plans, Seer's queue and re-ranking, the registry."""

from __future__ import annotations

import random
from collections import deque

import pytest

from pipeline.errors import UsageError
from pipeline.costs import CostModel
from pipeline.sched.registry import POLICIES, make_policy, policy_names, resolve_policy_name
from pipeline.sched.seer import SeerDispatcher, queue_order
from pipeline.sched.settings import PlacementParams
from pipeline.sched.types import Chunk, GroupWork, Request, RequestState

TOKENS_ONLY = PlacementParams(cost=CostModel(base_s=0.0, per_token_s=1.0))  # time = tokens


def groups(*predicted, n=1, lengths=None):
    return [GroupWork(f"p{i}", n, float(x), lengths=None if lengths is None else lengths[i])
            for i, x in enumerate(predicted)]


def R(g, s=0):
    return Request(g, s)


class FakeCluster:
    """Workers with a concurrency cap; records every start."""

    def __init__(self, workers, capacity):
        self.workers, self.capacity = workers, capacity
        self.loads = [0] * workers
        self.started: list[tuple[int, Chunk]] = []

    def load(self, w):
        return self.loads[w]

    def least_loaded(self):
        free = [w for w in range(self.workers) if self.loads[w] < self.capacity]
        return min(free, key=lambda w: (self.loads[w], w)) if free else None

    def assign(self, w, chunk):
        assert self.loads[w] < self.capacity
        self.loads[w] += 1
        self.started.append((w, chunk))

    def finish(self, dispatcher, w, chunk, generated, finished=True):
        self.loads[w] -= 1
        dispatcher.chunk_done(chunk, w, generated, finished)
        dispatcher.dispatch(self, [w])


def test_static_splits_the_batch_by_position():
    plan = make_policy("static").assign(groups(1, 1, 1, n=2), 2)
    assert plan == [[R(0, 0), R(0, 1), R(1, 0)], [R(1, 1), R(2, 0), R(2, 1)]]
    plan = make_policy("static").assign(groups(1, 1, n=2)[:1] + groups(5), 2)  # 3 requests
    assert [len(share) for share in plan] == [2, 1]


def test_histopipe_deals_longest_first_and_mirrors_on_odd_steps():
    policy = make_policy("histopipe", TOKENS_ONLY)
    gs = groups(10, 50, 20, 40)
    # 50 -> w0, 40 -> w1, 20 -> w1 (40 < 50), 10 -> w0 (50 < 60)
    assert policy.assign(gs, 2, step=0) == [[R(1), R(0)], [R(3), R(2)]]
    assert policy.assign(gs, 2, step=1) == [[R(3), R(2)], [R(1), R(0)]]


def test_histopipe_keeps_siblings_together():
    plan = make_policy("histopipe").assign(groups(30, 20, 10, n=3), 2)
    for share in plan:
        for g in {r.group for r in share}:
            assert sum(r.group == g for r in share) == 3


def test_histopipe_deals_requests_when_there_are_fewer_groups_than_workers():
    plan = make_policy("histopipe").assign(groups(30, n=4), 4)
    assert sorted(len(share) for share in plan) == [1, 1, 1, 1]


def test_the_worker_with_the_longest_request_carries_little_else():
    # time = 18 ms per pass of its longest request + 0.2 ms per token: 15 short ones
    # (0.21 s together) never catch up with the long one's 1.82 s
    plan = make_policy("histopipe").assign(groups(100, *[10] * 15), 2)
    assert plan[0] == [R(0)]
    assert len(plan[1]) == 15


def test_above_the_length_floor_tokens_are_balanced():
    params = PlacementParams(length_floor=100.0)  # every worker will hit 100 anyway
    plan = make_policy("histopipe", params).assign(groups(100, *[10] * 15), 2)
    tokens = [sum(100 if r.group == 0 else 10 for r in share) for share in plan]
    assert abs(tokens[0] - tokens[1]) <= 10


def test_oracle_uses_the_true_lengths():
    gs = groups(1, 1, n=2, lengths=[(1, 9), (5, 5)])
    # 9 -> w0, 5 -> w1, 5 -> w1 (5 < 9), 1 -> w0 (9 < 10)
    assert make_policy("oracle", TOKENS_ONLY).assign(gs, 2) == [[R(0, 1), R(0, 0)], [R(1, 0), R(1, 1)]]
    with pytest.raises(ValueError, match="needs the true lengths"):
        make_policy("oracle").assign(groups(1, 2), 2)


def test_seer_queue_order_probes_shortest_first_then_longest_first():
    gs = [GroupWork("a", 2, 30.0), GroupWork("b", 3, 10.0), GroupWork("c", 2, 20.0)]
    assert queue_order(gs) == [R(1, 0), R(2, 0), R(0, 0),  # probes
                               R(0, 1), R(2, 1), R(1, 1), R(1, 2)]


def test_seer_reranks_a_group_after_its_probe():
    gs = [GroupWork("a", 2, 10.0), GroupWork("b", 2, 50.0)]
    d = SeerDispatcher(gs, 1, PlacementParams(capacity=1))
    cluster = FakeCluster(1, 1)
    d.dispatch(cluster, [0])
    cluster.finish(d, 0, cluster.started[-1][1], generated=200)  # a's probe ran long: (10+200)/2
    assert d.estimate[0] == pytest.approx(105.0)
    cluster.finish(d, 0, cluster.started[-1][1], generated=50)
    cluster.finish(d, 0, cluster.started[-1][1], generated=100)
    cluster.finish(d, 0, cluster.started[-1][1], generated=40)
    assert [c.request for _, c in cluster.started] == [R(0, 0), R(1, 0), R(0, 1), R(1, 1)]
    assert d.pending() == 0


def test_seer_unknown_prompt_takes_the_probe_length_outright():
    gs = [GroupWork("new", 3, 64.0, known=False)]
    d = SeerDispatcher(gs, 1, PlacementParams(capacity=1))
    cluster = FakeCluster(1, 1)
    d.dispatch(cluster, [0])
    cluster.finish(d, 0, cluster.started[-1][1], generated=7)
    assert d.estimate[0] == pytest.approx(7.0)


def test_seer_continues_in_place_or_moves_to_a_much_lighter_worker():
    gs = [GroupWork("a", 1, 500.0)] + [GroupWork(f"s{i}", 1, 5.0) for i in range(9)]
    d = SeerDispatcher(gs, 2, PlacementParams(chunk_tokens=64, migrate_gap=8, capacity=32))
    cluster = FakeCluster(2, 32)
    d.dispatch(cluster, [0, 1])
    where = {c.request: w for w, c in cluster.started}
    assert all(c.budget == 64 for _, c in cluster.started)
    long_worker = where[R(0)]
    assert [r for r, w in where.items() if w == long_worker] == [R(0)]  # alone (LPT on time)
    cluster.finish(d, long_worker, Chunk(R(0), 64), generated=64, finished=False)
    assert cluster.started[-1] == (long_worker, Chunk(R(0), 64))  # its KV cache is there
    assert d.migrations == 0
    # the other worker runs the 9 short ones; 17 more on the long one's: 17 - 9 >= gap 8
    cluster.loads[long_worker] += 17
    cluster.finish(d, long_worker, Chunk(R(0), 64), generated=128, finished=False)
    assert cluster.started[-1] == (1 - long_worker, Chunk(R(0), 64)) and d.migrations == 1


def count(d: SeerDispatcher, state: RequestState) -> int:
    return sum(1 for s in d.state.values() if s is state)


def test_seer_tracks_each_request_state_through_its_chunks():
    gs = [GroupWork("a", 2, 100.0)]
    d = SeerDispatcher(gs, 1, PlacementParams(chunk_tokens=64, capacity=1))
    cluster = FakeCluster(1, 1)
    assert count(d, RequestState.WAITING) == 2
    d.dispatch(cluster, [0])
    assert d.state[R(0, 0)] is RequestState.RUNNING and d.state[R(0, 1)] is RequestState.WAITING
    d.chunk_done(Chunk(R(0, 0), 64), 0, generated=64, finished=False)
    cluster.loads[0] -= 1
    assert d.state[R(0, 0)] is RequestState.CONTINUING and d.pending() == 2
    d.dispatch(cluster, [0])  # the continuation goes before any unstarted request
    assert d.state[R(0, 0)] is RequestState.RUNNING and d.state[R(0, 1)] is RequestState.WAITING
    cluster.finish(d, 0, Chunk(R(0, 0), 64), generated=90)
    assert d.state[R(0, 0)] is RequestState.FINISHED and d.state[R(0, 1)] is RequestState.RUNNING
    with pytest.raises(ValueError, match="reported done while finished"):
        d.chunk_done(Chunk(R(0, 0), 64), 0, generated=90, finished=True)
    cluster.finish(d, 0, Chunk(R(0, 1), 64), generated=80)
    assert count(d, RequestState.FINISHED) == 2 and d.pending() == 0


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_request_is_placed_exactly_once(name):
    rng = random.Random(7)
    for _ in range(20):
        gs = [GroupWork(f"p{i}", rng.randint(1, 5), float(rng.randint(0, 300)), known=rng.random() < 0.8,
                        lengths=None) for i in range(rng.randint(1, 30))]
        gs = [GroupWork(g.prompt_id, g.n, g.predicted, g.known,
                        tuple(rng.randint(0, 300) for _ in range(g.n))) for g in gs]
        total = sum(g.n for g in gs)
        workers = rng.randint(1, total)
        plan = make_policy(name).assign(gs, workers, step=rng.randint(0, 3))
        assert len(plan) == workers
        placed = sorted(r for share in plan for r in share)
        assert placed == sorted(Request(g, s) for g, grp in enumerate(gs) for s in range(grp.n))


def test_registry_names_and_errors():
    assert policy_names() == ["static", "histopipe", "tier2", "seer", "oracle"]
    with pytest.raises(UsageError) as exc:
        make_policy("fifo")
    assert str(exc.value) == "unknown placement policy 'fifo'; choose from static, histopipe, tier2, seer, oracle"
    assert resolve_policy_name("auto", 4) == "seer"
    assert resolve_policy_name("auto", 1) == "static"
    assert resolve_policy_name("histopipe", 4) == "histopipe"
    assert resolve_policy_name("histopipe", 1) == "static"  # one worker runs everything


def test_more_workers_than_requests_is_a_usage_error():
    with pytest.raises(UsageError) as exc:
        make_policy("static").assign(groups(1, 2, n=2), 5)
    assert str(exc.value) == "5 workers for 4 requests: give at most 4 workers or more requests"


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n must be >= 1"), ({"predicted": -1.0}, "finite number >= 0"),
    ({"predicted": float("nan")}, "finite number >= 0"), ({"lengths": (1,)}, "1 lengths for n=2"),
])
def test_group_work_is_validated(kwargs, message):
    args = {"prompt_id": "p", "n": 2, "predicted": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        GroupWork(**args)


def test_histopipe_moves_a_response_that_ran_far_past_its_prediction():
    from pipeline.sched.placement import ListDispatcher

    plan = [[R(g) for g in range(18)], []]
    d = ListDispatcher(plan, chunk_tokens=64, overrun=lambda r, generated: generated > 2 * 10,
                       migrate_gap=8)
    cluster = FakeCluster(2, 32)
    d.dispatch(cluster, [0, 1])
    assert cluster.loads == [18, 0]
    cluster.finish(d, 0, Chunk(R(1), 64), generated=64, finished=False)  # 17 left on w0
    assert cluster.started[-1] == (1, Chunk(R(1), 64)) and d.migrations == 1
    plain = ListDispatcher([[R(0), R(1)], []], chunk_tokens=64, overrun=lambda r, g: False)
    cluster = FakeCluster(2, 32)
    plain.dispatch(cluster, [0, 1])
    cluster.finish(plain, 0, Chunk(R(0), 64), generated=64, finished=False)
    assert cluster.started[-1] == (0, Chunk(R(0), 64)) and plain.migrations == 0


def test_seer_static_plan_runs_probes_first_on_each_worker():
    gs = [GroupWork(f"p{i}", 3, float(10 * (i + 1))) for i in range(4)]
    for share in make_policy("seer").assign(gs, 2):
        samples = [r.sample for r in share]
        first_sibling = next((i for i, s in enumerate(samples) if s > 0), len(samples))
        assert all(s == 0 for s in samples[:first_sibling])
        assert all(s > 0 for s in samples[first_sibling:])


def test_seer_spreads_siblings_where_stacking_them_lengthens_the_critical_path():
    # base 1 s a pass, 0.1 s a token. Group 0: two responses predicted 100 tokens. On one
    # worker: 100 passes + 200 tokens = 120 s; apart: 110 s each. So the second sibling
    # goes to the empty worker, though its home has a free slot.
    cost = CostModel(base_s=1.0, per_token_s=0.1)
    d = SeerDispatcher(groups(100, n=2), 2, PlacementParams(capacity=8, cost=cost))
    cluster = FakeCluster(2, 8)
    d.dispatch(cluster, [0, 1])
    where = {c.request: w for w, c in cluster.started}
    assert where[R(0, 0)] != where[R(0, 1)]


def test_seer_keeps_siblings_together_where_that_ends_no_later():
    # One worker gets a 1,000-token request (1,100 s); two 10-token siblings: the
    # second ends sooner beside the first (10 passes + 20 tokens = 12 s) than beside the
    # long one (1,000 passes + 1,020 tokens).
    cost = CostModel(base_s=1.0, per_token_s=0.1)
    gs = [GroupWork("long", 1, 1000.0), GroupWork("short", 2, 10.0)]
    d = SeerDispatcher(gs, 2, PlacementParams(capacity=8, cost=cost))
    cluster = FakeCluster(2, 8)
    d.dispatch(cluster, [0, 1])
    where = {c.request: w for w, c in cluster.started}
    assert where[R(1, 0)] == where[R(1, 1)] != where[R(0, 0)]


def boundary(dispatcher, cluster, w, stopping):
    """Stop `stopping` ((request, generated)) at a chunk boundary on w, the runtime's way,
    and return which of them were put back on w."""
    cluster.loads[w] -= len(stopping)
    for request, generated in stopping:
        dispatcher.chunk_done(Chunk(request, 64), w, generated, False)
    before = len(cluster.started)
    dispatcher.dispatch(cluster, [w])
    return {c.request for v, c in cluster.started[before:] if v == w}


def test_seers_stay_hint_names_what_dispatch_puts_back_first():
    # worker 0 runs 12, worker 1 runs 2; 10 stop on worker 0: its load is 2 again, and
    # the first 8 of them (most generated first) stay before 2 + gap 8 = 10 is reached
    gs = [GroupWork(f"p{i}", 1, 5000.0) for i in range(14)]
    d = SeerDispatcher(gs, 2, PlacementParams(chunk_tokens=64, migrate_gap=8, capacity=32))
    cluster = FakeCluster(2, 32)
    cluster.loads = [12, 2]
    for i in range(14):
        d.state[R(i)] = RequestState.RUNNING
        d.placed[R(i)] = 5000.0
    d.probes.clear()
    d.unstarted_rest = 0
    stopping = [(R(i), 640 + 64 * (i % 5)) for i in range(10)]
    hint = d.stays(cluster, 0, stopping, 0)
    assert len(hint) == 8
    back = boundary(d, cluster, 0, stopping)
    order = [r for r, _ in sorted(stopping, key=lambda s: -s[1])]
    assert set(hint) == set(order[:8]) <= back and d.migrations == 1


def test_histopipes_stay_hint_is_the_prefix_before_the_first_overrun():
    d = make_policy("histopipe", PlacementParams(chunk_tokens=64)).dispatcher(groups(100, 100, 100), 2)
    cluster = FakeCluster(2, 32)
    cluster.loads = [3, 0]
    stopping = [(R(0), 64), (R(1), 1024), (R(2), 64)]  # R(1) overran its prediction
    assert d.stays(cluster, 0, stopping, 0) == [R(0)]
    d.queues = [deque(), deque()]
    assert R(0) in boundary(d, cluster, 0, stopping)


def test_the_migration_gap_scales_with_the_requests_per_worker():
    from pipeline.sched.predictor import LengthPredictor
    from pipeline.sched.settings import PlacementSettings, auto_migrate_gap

    assert [auto_migrate_gap(k) for k in (1, 8, 16, 32, 48, 64, 98, 512)] == [2, 2, 2, 4, 6, 8, 8, 8]
    predictor = LengthPredictor(default=100.0)
    assert PlacementSettings().step_params(predictor, 32, capacity=64).migrate_gap == 4
    assert PlacementSettings(migrate_gap=3).step_params(predictor, 32, capacity=64).migrate_gap == 3
