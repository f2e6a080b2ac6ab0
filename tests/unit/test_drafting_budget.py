"""Draft budgets: the throughput rule's per-request grow/shrink and batch-aware
marginal-benefit cap, against hand-computed cases and a plain one-heap oracle; the tree rule
(pure logic, microseconds)."""

from __future__ import annotations

import pytest

import heapq

from pipeline.costs import CostModel
from pipeline.drafting.budget_throughput import ThroughputBudget, ThroughputConfig

UNIT = CostModel(base_s=1.0, per_token_s=1.0)  # a pass costs 1 + scheduled tokens


def budget(**kw) -> ThroughputBudget:
    return ThroughputBudget(ThroughputConfig(**kw))


def cap(b: ThroughputBudget, req_id) -> int:
    """The request's draft-length cap (its state, made if it has none yet)."""
    return b._get(req_id).cap


def acceptance(b: ThroughputBudget, req_id) -> float:
    """The rule's estimate that a draft token of the request is accepted, given its
    predecessors were: its decayed counts, shrunk towards the rate of all requests."""
    s, c = b._get(req_id), b.config
    return (s.accepted + b.overall_acceptance() * c.prior_weight) / (s.tried + c.prior_weight)


# ---------------------------------------------------------------- per request

def test_cap_doubles_on_full_acceptance_and_halves_on_rejection():
    b = budget(start_len=2, min_len=1, max_len=16)
    caps = [cap(b, "r")]
    for proposed, accepted in [(2, 2), (4, 4), (8, 8), (16, 16), (16, 3), (8, 0), (4, 1),
                               (2, 0), (1, 0), (1, 1)]:
        b.observe("r", proposed, accepted)
        caps.append(cap(b, "r"))
    assert caps == [2, 4, 8, 16, 16, 8, 4, 2, 1, 1, 2]


def test_no_draft_is_no_evidence_and_forget_resets():
    b = budget()
    b.observe("r", 0, 0)
    assert cap(b, "r") == 2 and acceptance(b, "r") == pytest.approx(0.5)
    b.observe("r", 2, 2)
    b.forget("r")
    assert cap(b, "r") == 2


def test_acceptance_estimate_is_shrunk_towards_all_requests():
    b = budget(prior_accept=0.5, prior_weight=2.0, decay=1.0, global_decay=1.0)
    b.observe("a", 4, 4)  # 4 accepted of 4 tried (no rejection seen)
    # overall: (4 + 0.5*2) / (4 + 2) = 5/6; a: (4 + 5/6*2) / (4 + 2) = 17/18
    assert b.overall_acceptance() == pytest.approx(5 / 6)
    assert acceptance(b, "a") == pytest.approx(17 / 18)
    b.observe("b", 4, 1)  # 1 accepted, then a rejection: 2 tried, the rest untested
    # overall: (5 + 1) / (6 + 2) = 0.75; b: (1 + 0.75*2) / (2 + 2) = 0.625
    assert b.overall_acceptance() == pytest.approx(0.75)
    assert acceptance(b, "b") == pytest.approx(0.625)
    assert acceptance(b, "new") == pytest.approx(0.75)


def test_config_checks_the_length_order():
    with pytest.raises(ValueError, match="min_len <= start_len <= max_len"):
        ThroughputConfig(min_len=4, start_len=2)


# ---------------------------------------------------------------- per pass

def test_marginal_benefit_hand_computed_single_sequence():
    # alpha 0.9, one sequence, pass = 1 + tokens. Start E=1, T=2.
    # +0.9   : 0.9*2 = 1.8 > 1*1        -> E=1.9,   T=3
    # +0.81  : 0.81*3 = 2.43 > 1.9      -> E=2.71,  T=4
    # +0.729 : 0.729*4 = 2.916 > 2.71   -> E=3.439, T=5
    # +0.6561: 0.6561*5 = 3.28 < 3.439  -> stop at 3
    b = budget(prior_accept=0.9, max_len=16, start_len=16, cost=UNIT)
    assert b.allocate_ids(["r"], [16]) == [3]


def test_marginal_benefit_stops_at_break_even():
    b = budget(prior_accept=0.5, start_len=8, cost=UNIT)
    assert b.allocate_ids(["r"], [8]) == [0]  # 0.5 * 2 == 1: no gain, no draft


def test_full_batch_gets_little_speculation_and_the_tail_much():
    slow = CostModel(base_s=0.018, per_token_s=0.0002)  # 18 ms + 0.2 ms/token
    cfg = dict(prior_accept=0.7, max_len=16, start_len=16, cost=slow)
    b = budget(**cfg)
    full = [(k, 16) for k in range(256)]
    # E/T = 256 / 69.2 ms: a token pays only if alpha^j > 0.2 * 256 / 69.2 = 0.74
    assert sum(allocate(b, full)) == 0
    tail = [(k, 16) for k in range(4)]
    assert allocate(budget(**cfg), tail) == [6, 6, 6, 6]
    # One sequence (ms): E=1, T=18.2; token j pays while 0.7^j * T > 0.2 * E:
    # j=1 12.74 > 0.20, ..., j=9 0.0404*19.8 = 0.80 > 0.64 (E=3.24), j=10 0.565 < 0.648
    assert allocate(budget(**cfg), [("x", 16)]) == [9]
    assert _greedy_reference(0.7, 1, 16, slow) == 9


def allocate(b: ThroughputBudget, candidates, **kw) -> list[int]:
    """`allocate_ids` for (request id, available tokens) pairs."""
    return b.allocate_ids([c[0] for c in candidates], [c[1] for c in candidates], **kw)


def _greedy_reference(alpha: float, n: int, cap: int, cost: CostModel) -> int:
    """The marginal-benefit rule for one sequence, written out directly."""
    expected, seconds, k = float(n), cost.pass_seconds(n), 0
    while k < cap:
        gain = alpha ** (k + 1)
        if (expected + gain) / (seconds + cost.per_token_s) <= expected / seconds:
            break
        expected, seconds, k = expected + gain, seconds + cost.per_token_s, k + 1
    return k


def test_tokens_go_to_the_requests_most_likely_to_accept():
    b = budget(start_len=4, cost=UNIT, decay=1.0, prior_weight=0.001)
    for _ in range(3):
        b.observe("good", 4, 4)
        b.observe("bad", 4, 0)
    b._get("good").cap = b._get("bad").cap = 4
    alloc = allocate(b, [("bad", 4), ("good", 4)], batch_size=2)
    assert alloc[0] == 0 and alloc[1] > 0


def test_allocation_respects_cap_and_available_tokens():
    b = budget(prior_accept=0.99, start_len=2, cost=CostModel(1.0, 0.001))
    assert allocate(b, [("a", 8), ("b", 1), ("c", 0)]) == [2, 1, 0]


def test_batch_unaware_mode_returns_the_caps():
    b = budget(prior_accept=0.1, start_len=4, batch_aware=False)
    assert allocate(b, [(k, 8) for k in range(300)]) == [4] * 300


# ---------------------------------------------------------------- from the config tree

def test_spec_config_maps_to_drafter_and_budget():
    from pipeline.config.schema import SpecConfig
    from pipeline.drafting.build import drafter_config

    spec = SpecConfig(method="history+group", num_speculative_tokens=1, min_path_prob=0.3,
                      reward_weighted=True, max_cached_prompts=7, max_spec_factor=0.5,
                      thin_draft_tokens=0)
    d = drafter_config(spec)
    assert (d.use_history, d.use_siblings, d.min_path_prob, d.reward_weighted,
            d.max_cached_prompts, d.max_spec_factor) == (True, True, 0.3, True, 7, 0.5)
    b = ThroughputBudget.from_spec(spec).config
    assert (b.max_len, b.start_len, b.min_len) == (1, 1, 1)
    b = ThroughputBudget.from_spec(SpecConfig(num_speculative_tokens=8)).config
    assert (b.max_len, b.start_len, b.min_len) == (16, 2, 1)  # thin passes draft up to 16
    with pytest.raises(ValueError, match="expected one of"):
        drafter_config(SpecConfig(method="ngram"))


@pytest.mark.parametrize("rows", [1, 128, 1024])
def test_tree_budget_grants_every_request_its_cap_at_any_batch_size(rows):
    """The default `tree` budget: each request may draft what the proposer makes available
    (the pass's cap, `PassCaps`, at most the engine's: thin_draft_tokens) in every pass,
    whatever was rejected before; the drafter's path-probability cut decides the length."""
    from pipeline.config.schema import SpecConfig
    from pipeline.drafting.build import make_budget

    spec = SpecConfig(method="history+group", num_speculative_tokens=8)
    assert spec.budget == "tree"
    b = make_budget(spec)
    ids = list(range(rows))
    available = [8, 3, 0, 20] * (rows // 4) if rows >= 4 else [8]
    assert b.max_len == 16
    assert b.ask(ids[:len(available)], available, len(available), no_lengths) == \
        [min(a, 16) for a in available]
    b.observe(0, 8, 0)  # a fully rejected draft does not shrink the cap
    assert b.ask([0], [8], rows, no_lengths) == [8]
    # the throughput budget, by contrast, grants a full batch little
    throughput = make_budget(SpecConfig(method="history+group", budget="throughput"))
    if rows >= 128:
        assert sum(throughput.ask(ids, [8] * rows, rows, no_lengths)) < 8 * rows


def no_lengths(req_ids):
    raise AssertionError("this budget does not read remaining lengths")


def test_rules_that_size_drafts_up_front_keep_them_whole():
    from pipeline.drafting.budget_tree import TreeBudget
    from pipeline.drafting.suffix_tree import EMPTY_DRAFT, Draft

    drafts = [Draft([5, 6, 7], [0.9, 0.5, 0.2], 1.6, 4), EMPTY_DRAFT, Draft([1], [1.0], 1.0, 2)]
    for b in (TreeBudget(8), budget()):
        assert b.grant(drafts) == [3, 0, 1]
        assert b.calibration() is None
        b.observe_pass(100, 0.01)  # no pass-cost model: nothing to learn


# ---------------------------------------------------------------- fast path

@pytest.mark.parametrize("seed", range(6))
def test_fast_allocation_equals_the_reference(seed):
    """`allocate_ids` skips requests whose first token cannot pay; it must grant exactly
    what the plain one-heap computation grants, in full batches and in the tail."""
    import random

    rng = random.Random(seed)
    for trial in range(150):
        cost = CostModel(rng.choice([0.001, 0.006, 0.018]), rng.choice([0.0001, 0.0002, 0.001]))
        b = budget(start_len=rng.choice([1, 2, 4]), max_len=8, cost=cost,
                   prior_accept=rng.choice([0.3, 0.5, 0.8, 0.95]),
                   prior_weight=rng.choice([0.5, 2.0]))
        n = rng.choice([1, 3, 12, 40, 256])
        ids = [f"r{i}" for i in range(n)]
        for r in rng.sample(ids, rng.randint(0, n)):  # some requests have evidence
            for _ in range(rng.randint(1, 4)):
                k = rng.randint(1, 8)
                b.observe(r, k, rng.choice([k, rng.randint(0, k)]))
        available = [rng.choice([0, 1, 8, 8, 8]) for _ in ids]
        batch = n + rng.choice([0, 0, 5])
        fast = b.allocate_ids(ids, available, batch_size=batch)
        assert fast == reference_allocation(b, ids, available, batch), trial


def reference_allocation(b: ThroughputBudget, req_ids, available, batch_size) -> list[int]:
    """`allocate_ids` written out directly: every request in one max-heap over its next
    token's acceptance probability alpha ** (k + 1), popped while the token pays."""
    c = b.config
    limits = [max(0, min(a, cap(b, r))) for r, a in zip(req_ids, available)]
    alloc = [0] * len(limits)
    alphas = [acceptance(b, r) for r in req_ids]
    heap = [(-a, i) for i, (a, k) in enumerate(zip(alphas, limits)) if k > 0 and a > 0]
    heapq.heapify(heap)
    expected = float(batch_size)
    seconds = c.cost.pass_seconds(batch_size)
    while heap:
        neg_gain, i = heap[0]
        gain = -neg_gain
        if gain * seconds <= c.cost.per_token_s * expected:
            break
        heapq.heappop(heap)
        alloc[i] += 1
        expected += gain
        seconds += c.cost.per_token_s
        if alloc[i] < limits[i]:
            heapq.heappush(heap, (-(gain * alphas[i]), i))
    return alloc


def test_fast_allocation_without_batch_awareness_returns_the_caps():
    b = budget(start_len=2, batch_aware=False)
    b.observe("a", 2, 2)  # cap 4
    assert b.allocate_ids(["a", "b", "c"], [8, 8, 1]) == [4, 2, 1]
    assert b.allocate_ids([], []) == []


def test_a_run_of_rejections_never_shuts_speculation_off_for_good():
    """After many rejected drafts (say, a step of prompts without history) a new request
    still gets a draft where one would pay at the exploration floor, so acceptance can be
    measured again when drafts improve."""
    b = budget(prior_accept=0.7, max_len=8, start_len=4)
    for i in range(2000):
        b.observe(f"old{i}", 4, 0)
    assert b.overall_acceptance() == pytest.approx(0.3)
    assert sum(allocate(b, [(k, 4) for k in range(8)])) > 0


# ---------------------------------------------------------------- tree rule's floor

def _tree_pass(b, drafts):
    """One pass of the tree rule: ask for every candidate, then grant their drafts."""
    ids = [f"r{i}" for i in range(len(drafts))]
    b.ask(ids, [8] * len(ids), len(ids), no_lengths)
    return ids, b.grant(drafts)


def test_the_tree_floor_learns_that_the_trees_draft_badly_and_drafts_less():
    """min_accept: a draft is cut where its calibrated acceptance so far falls below the
    floor. While nothing is verified the calibration is the path probabilities
    themselves; once drafts of sure-looking paths are rejected, the same drafts are cut to
    one token; once they are accepted whole again, they are kept whole."""
    from pipeline.drafting.budget_tree import TreeBudget
    from pipeline.drafting.suffix_tree import Draft

    sure = Draft([5, 6, 7, 8], [0.99, 0.98, 0.97, 0.96], 3.9, 6)
    b = TreeBudget(8, min_accept=0.1)
    ids, kept = _tree_pass(b, [sure])
    assert kept == [4]
    for _ in range(60):  # every token of these drafts rejected
        ids, kept = _tree_pass(b, [sure])
        b.observe(ids[0], kept[0], 0)
    assert _tree_pass(b, [sure])[1] == [1]
    for _ in range(200):  # now accepted whole
        ids, kept = _tree_pass(b, [sure])
        b.observe(ids[0], kept[0], kept[0])
    assert _tree_pass(b, [sure])[1] == [4]


def test_without_a_floor_the_tree_rule_learns_nothing():
    from pipeline.drafting.budget_tree import TreeBudget
    from pipeline.drafting.suffix_tree import Draft

    b = TreeBudget(8)
    sure = Draft([5, 6, 7], [0.99, 0.98, 0.97], 2.9, 6)
    for _ in range(30):
        ids, kept = _tree_pass(b, [sure])
        b.observe(ids[0], kept[0], 0)
    assert _tree_pass(b, [sure])[1] == [3]
    assert b.state() is None and b.calibration() is None


def test_the_tree_floors_calibration_survives_a_checkpoint():
    import json

    from pipeline.drafting.budget_tree import TreeBudget
    from pipeline.drafting.suffix_tree import Draft

    drafts = [Draft([1, 2, 3, 4, 5], [0.9, 0.6, 0.5, 0.3, 0.2], 2.5, 5),
              Draft([7, 8], [0.95, 0.4], 1.35, 3)]
    b = TreeBudget(8, min_accept=0.05)
    for i in range(40):
        ids, kept = _tree_pass(b, drafts)
        for j, (r, k) in enumerate(zip(ids, kept)):
            b.observe(r, k, (i + j) % 3 and 1)
    restored = TreeBudget(8, min_accept=0.05)
    restored.load_state(json.loads(json.dumps(b.state())))
    assert _tree_pass(restored, drafts)[1] == _tree_pass(b, drafts)[1] != [5, 2]


def test_a_tree_floor_outside_zero_to_one_is_refused():
    from pipeline.drafting.budget_tree import TreeBudget

    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="min_accept"):
            TreeBudget(8, min_accept=bad)
