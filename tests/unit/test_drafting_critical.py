"""The critical-path budget, the calibrated acceptance, the online pass cost and the
remaining-length estimate, against hand-computed cases (pure logic, milliseconds)."""

from __future__ import annotations

import math
import random

import pytest

from pipeline.drafting.calibration import Calibrator, conditional, merge_tables
from pipeline.drafting.budget_critical import (CriticalBudget, CriticalConfig, critical_weights,
                                               paying_prefix)
from pipeline.costs import PassCost
from pipeline.drafting.remaining import LengthSamples, remaining
from pipeline.drafting.suffix_tree import SuffixTree


def cost_from(fn, xs=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)) -> PassCost:
    c = PassCost(refit_every=1)
    for x in xs:
        c.observe(x, fn(x))
    return c


LINEAR = lambda x: 0.005 + 0.0001 * x  # noqa: E731  a compute-bound (CPU-like) pass
FLAT = lambda x: 0.02  # noqa: E731  a memory-bound (GPU-like) pass


def budget(fn, max_len=32) -> CriticalBudget:
    return CriticalBudget(CriticalConfig(max_len=max_len), cost_from(fn))


def tau(b: CriticalBudget, req_id) -> float:
    """The budget's tokens-per-pass estimate of a request (the prior for a new one)."""
    return b._tau.get(req_id, b._tau_all)


def known(estimates):
    """A remaining-length estimate that returns `estimates` ((mean, std) per candidate)."""
    return lambda req_ids: estimates


# ---------------------------------------------------------------- the rule

def test_critical_weights_are_a_softmax_over_remaining_passes():
    assert critical_weights([10, 10], [0, 0]).tolist() == pytest.approx([0.5, 0.5])
    beta = math.sqrt(6) / math.pi  # spread floor 1 pass
    w = critical_weights([3, 2], [0, 0])
    assert w[0] / w[1] == pytest.approx(math.exp(1 / beta))
    # a wider spread makes the ranks less certain
    assert critical_weights([3, 2], [10, 10])[0] < w[0]


def test_paying_prefix_stops_at_the_first_token_below_the_threshold():
    assert paying_prefix([0.9, 0.8, 0.5, 0.6], 0.55) == 2
    assert paying_prefix([], 0.1) == 0


def test_long_request_drafts_and_short_one_does_not():
    # linear cost 5 ms + 0.1 ms/token: m = 0.1 ms; c_tail = c(1 + 8) = 5.9 ms; tau = 2.
    # A: 100 tokens to go = 50 passes, B: 10 = 5 passes -> pi_A ~ 1, pi_B ~ e^-58 ~ 0.
    # v_A = 5.9 / 2 = 2.95 ms: threshold 0.1 / 3.05 = 0.0328; B's threshold ~ 1.
    b = budget(LINEAR, max_len=8)
    asked = b.ask(["A", "B"], [8, 8], 2, known([(100, 0), (10, 0)]))
    assert asked[0] == 8 and asked[1] == 0  # B is not even drafted
    curve = [0.9, 0.8, 0.5, 0.2, 0.03, 0.01]
    assert b.trim([curve, curve]) == [4, 0]


def test_full_batch_drafts_little_and_the_tail_drafts_to_the_cap():
    curve = [0.9 ** j for j in range(1, 33)]
    # tail: one request, pi = 1, v = c(33) / 2 = 4.15 ms, m = 0.1 ms:
    # threshold 0.1 / 4.25 = 0.0235 < 0.9^32 = 0.034 -> the whole 32-token draft
    b = budget(LINEAR)
    b.ask(["r"], [32], 1, known([(200, 20)]))
    assert b.trim([curve]) == [32]
    # full batch: 128 equal requests, pi = 1/128, v = 4.15 / 128 / 2... per request
    # v = 0.0324 ms, threshold 0.1 / 0.1324 = 0.755: 0.9^2 = 0.81 passes, 0.9^3 = 0.729 not
    ids = [f"r{i}" for i in range(128)]
    b.ask(ids, [32] * 128, 128, known([(200, 20)] * 128))
    assert b.trim([curve] * 128) == [2] * 128


def test_flat_cost_drafts_every_request_to_its_draft_length():
    b = budget(FLAT)
    asked = b.ask(["A", "B"], [5, 5], 200, known([(100, 0), (1, 0)]))
    assert asked == [5, 5]
    assert b.trim([[0.5, 0.1, 0.01], [0.9, 0.2]]) == [3, 2]


def test_concave_cost_grants_more_than_its_first_marginal_suggests():
    # knee at 64: 0.5 s at 1 token, 1.0 at 64, then 0.2 s per 64 tokens.
    concave = cost_from(lambda x: 0.5 + 0.5 * (x - 1) / 63 if x <= 64 else 1.0 + 0.2 * (x - 64) / 64)
    b = CriticalBudget(CriticalConfig(max_len=8), concave)
    ids = [f"r{i}" for i in range(60)]
    b.ask(ids, [8] * 60, 60, known([(100, 0)] * 60))
    # first marginal (below the knee) 0.5/63 = 7.9 ms; v = c(9)/60/2 = 4.7 ms:
    # threshold 0.628. Granting 2 each (120 tokens, to 180) averages (c(180)-c(60))/120
    # = 3.3 ms: threshold 0.41, so the third token (0.5) pays too.
    curve = [0.9, 0.7, 0.5, 0.3]
    first = 0.5 / 63
    v = concave.seconds(9) / 60 / 2
    assert paying_prefix(curve, first / (first + v)) == 2
    assert b.trim([curve] * 60) == [3] * 60


def test_unknown_cost_drafts_to_the_cap():
    b = CriticalBudget(CriticalConfig(max_len=4))
    assert b.ask(["a", "b"], [8, 2], 2, known([(5, 1), (50, 1)])) == [4, 2]
    assert b.trim([[0.1, 0.01], []]) == [2, 0]


def test_tau_follows_accepted_tokens():
    b = budget(LINEAR)
    assert tau(b, "r") == pytest.approx(2.0)
    b.observe_draft("r", [0.9] * 4, 4)  # 5 tokens in that pass
    assert tau(b, "r") == pytest.approx(0.7 * 2 + 0.3 * 5)
    b.forget("r")
    assert tau(b, "r") == pytest.approx(tau(b, "new"))


def test_config_checks():
    with pytest.raises(ValueError, match="max_len"):
        CriticalConfig(max_len=0)


# ---------------------------------------------------------------- calibration

def _synthetic_tree() -> SuffixTree:
    """After [1, 2] the tree has seen 3 three times and 4 once; after [2, 3] always 5."""
    t = SuffixTree(8)
    for i, seq in enumerate([[1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 4, 6]]):
        t.extend(i, seq)
    return t


def test_tree_path_probabilities_are_the_count_ratios():
    d = _synthetic_tree().speculate([9, 1, 2], 4, 0.01, 1.0)
    assert d.token_ids[:2] == [3, 5]
    assert conditional(d.probs)[:2] == pytest.approx([0.75, 1.0])


@pytest.mark.parametrize("true_rate", [0.75, 0.3])
def test_calibration_learns_the_observed_rate_of_a_bucket(true_rate):
    d = _synthetic_tree().speculate([9, 1, 2], 1, 0.01, 1.0)
    qs = conditional(d.probs)
    assert qs == pytest.approx([0.75])
    cal, rng = Calibrator(), random.Random(0)
    for _ in range(4000):
        cal.observe(qs, 1 if rng.random() < true_rate else 0)
    assert cal.accept(0.75) == pytest.approx(true_rate, abs=0.03)
    row = [r for r in cal.table() if r.lo <= 0.75 < r.hi][0]
    assert row.predicted == pytest.approx(0.75) and row.tried == 4000
    assert row.observed == pytest.approx(true_rate, abs=0.03)
    # other buckets keep their prior (the identity)
    assert cal.accept(0.97) == pytest.approx(0.97)


def test_only_tested_tokens_count():
    cal = Calibrator(prior_weight=1.0)
    cal.observe([0.95, 0.95, 0.3, 0.3], 1)  # token 1 accepted, token 2 rejected, 3-4 untested
    rows = {(r.lo, r.hi): r for r in cal.table()}
    assert list(rows) == [(0.95, 0.99)] and rows[(0.95, 0.99)].tried == 2
    assert rows[(0.95, 0.99)].observed == pytest.approx(0.5)
    # cumulative: product of calibrated rates; (1 + 0.95) / 3 for the observed bucket
    assert cal.cumulative([0.95, 0.95])[1] == pytest.approx(((1 + 0.95) / 3) ** 2)
    merged = merge_tables([cal.state(), cal.state()])
    assert merged == [{"lo": 0.95, "hi": 0.99, "tried": 4, "predicted": 0.95, "observed": 0.5}]


# ---------------------------------------------------------------- pass cost

@pytest.mark.parametrize("curve", [LINEAR, FLAT, lambda x: 0.004 * math.sqrt(x) + 0.001])
def test_cost_refits_stay_positive_monotone_and_concave_on_noisy_samples(curve):
    rng = random.Random(1)
    c = PassCost()
    for _ in range(3000):
        x = rng.choice([1, 3, 7, 20, 50, 130, 300, 700, 900])
        t = curve(x) * rng.uniform(0.85, 1.15)
        if rng.random() < 0.02:
            t *= 10  # a GC pause or another process
        c.observe(x, t)
    c.refit()
    xs = [1, 5, 30, 100, 400, 900, 2000]
    ys = [c.seconds(x) for x in xs]
    assert all(y > 0 for y in ys)
    assert ys == sorted(ys)
    slopes = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]
    assert all(s2 <= s1 + 1e-12 for s1, s2 in zip(slopes, slopes[1:]))
    for x in (20, 300, 900):
        assert c.seconds(x) == pytest.approx(curve(x), rel=0.2)
    assert c.marginal(100) >= 0


def test_a_single_pass_gives_a_concave_prior_through_it():
    c = PassCost()
    assert not c.known and c.seconds(10) == 0.0
    c.observe(16, 0.008)
    assert c.seconds(16) == pytest.approx(0.008)
    assert c.seconds(64) == pytest.approx(0.016)  # sqrt(4) x
    c.observe(-1, 0.1)
    c.observe(5, float("nan"))
    assert c.points() == [(16.0, 0.008)]


# ---------------------------------------------------------------- remaining length

def test_remaining_length_is_the_mean_of_the_samples_that_outlive_the_request():
    s = LengthSamples([40, 60, 80, 100])
    mean, std, until = remaining(50, s)
    assert mean == pytest.approx(80 - 50) and std == pytest.approx(math.sqrt(800 / 3))
    assert until == 60
    # past every sample of the prompt: the pool of all prompts decides
    mean, _, _ = remaining(120, s, LengthSamples([50, 150, 170]))
    assert mean == pytest.approx(40)
    # nothing known: as long again as it has run
    assert remaining(30, None, None)[:2] == (30.0, 30.0)
    assert remaining(0, LengthSamples([]))[0] == 8.0


# ---------------------------------------------------------------- measured cost curves

def measured(curve, xs=(4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)) -> CriticalBudget:
    """A budget whose pass cost was learned the way the engine teaches it: decode passes
    reported through `observe_pass` (the pass meter's listener), several per size."""
    b = CriticalBudget(CriticalConfig(max_len=16))
    for _ in range(3):
        for x in xs:
            b.observe_pass(x, curve(x))
    return b


def test_a_flat_measured_curve_drafts_every_request_to_the_cap():
    """A pass that costs the same whatever it verifies (memory-bound decode): every draft
    token with any chance of acceptance pays, in a full batch as in the tail."""
    curve = [0.6 ** j for j in range(1, 17)]
    b = measured(lambda x: 0.02)
    ids = [f"r{i}" for i in range(256)]
    assert b.ask(ids, [16] * 256, 256, known([(500, 50)] * 256)) == [16] * 256
    assert b.trim([curve] * 256) == [16] * 256
    b.ask(["last"], [16], 1, known([(500, 50)]))
    assert b.trim([curve]) == [16]


def test_this_cpus_measured_curve_drafts_little_in_a_full_batch_and_to_the_cap_in_the_tail():
    """DRAFT_COST, the fit over this machine's decode passes (8.5 ms + 0.062 ms per token):
    m = 0.062 ms; tail pass c(17) = 9.55 ms. Tail, one request (pi = 1, tau = 2):
    v = 4.77 ms, threshold 0.062 / 4.84 = 0.0128 < 0.8^16 = 0.028: all 16 tokens. Full
    batch of 256 equal requests: v = 4.77 / 256 = 0.0187 ms; a first token assumed accepted
    at 0.5 pays only if 0.5 (m + v) > m, i.e. v > m: no request is drafted at all. (Were
    they drafted, the threshold 0.062 / 0.0807 = 0.77 would keep 1 token each.)"""
    from pipeline.costs import DRAFT_COST

    curve = [0.8 ** j for j in range(1, 17)]
    b = measured(DRAFT_COST.pass_seconds)
    assert b.ask(["last"], [16], 1, known([(500, 50)])) == [16]
    assert b.trim([curve]) == [16]
    ids = [f"r{i}" for i in range(256)]
    assert b.ask(ids, [16] * 256, 256, known([(500, 50)] * 256)) == [0] * 256
    assert b.trim([curve] * 256) == [1] * 256


# ---------------------------------------------------------------- as a Budget

def test_as_a_budget_it_trims_drafts_and_learns_from_the_kept_part():
    """Both stages through the protocol: `grant` trims each draft by the calibrated
    acceptance of its tree probabilities and keeps them until `observe` says how many
    tokens were accepted."""
    from pipeline.drafting.suffix_tree import EMPTY_DRAFT, Draft

    b = CriticalBudget(CriticalConfig(max_len=4))
    asked_for = []
    assert b.ask(["a", "b", "c"], [4, 4, 0], 3, lambda ids: asked_for.append(ids) or
                 [(10, 1)] * 3) == [4, 4, 0]
    assert asked_for == [["a", "b", "c"]]  # asked even before the pass cost is known
    # unknown cost: every draft is kept whole
    drafts = [Draft([7, 8, 9], [0.9, 0.45, 0.2], 1.55, 3), Draft([5], [1.0], 1.0, 2), EMPTY_DRAFT]
    assert b.grant(drafts) == [3, 1, 0]
    b.observe("a", 3, 1)  # a: token 1 accepted (q = 0.9), token 2 rejected (q = 0.5)
    rows = {(r.lo, r.hi): r for r in b.calibrator.table()}
    assert sum(r.tried for r in rows.values()) == 2
    assert tau(b, "a") == pytest.approx(0.7 * 2 + 0.3 * 2)
    b.observe("a", 3, 1)  # the draft was verified once: nothing is left to learn from
    assert sum(r.tried for r in b.calibrator.table()) == 2
    b.forget("b")  # a request that stopped before its draft was verified
    b.observe("b", 1, 1)
    assert sum(r.tried for r in b.calibrator.table()) == 2
    assert b.calibration() == b.calibrator.state()
    assert not b.fixed_caps


def test_the_pass_cost_is_learned_from_the_passes_the_engine_reports():
    b = CriticalBudget(CriticalConfig(max_len=4))
    assert not b.cost.known
    for x in (4, 8, 16, 32, 64) * 2:
        b.observe_pass(x, 0.01 + 0.001 * x)
    assert b.cost.known
