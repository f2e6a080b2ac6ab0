"""The one pass-cost model and the rollout arithmetic (tau, acceptance, bubbles, tails),
against hand-computed values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.costs import (DRAFT_COST, SCHED_COST, CostModel, accept_rate, bubble_ratio, fit,
                            tail_s, tau)


def test_a_pass_costs_base_plus_per_token():
    cost = CostModel(base_s=0.01, per_token_s=0.001)
    assert cost.pass_seconds(100) == pytest.approx(0.11)
    assert cost.pass_s(100) == pytest.approx(0.11)  # one token per request without drafts
    spec = replace(cost, tau=2.0, draft_tokens=3, spec_max_batch=50)
    assert spec.pass_s(10) == pytest.approx(0.01 + 0.001 * 40) and spec.tokens_per_pass(10) == 2.0
    assert spec.pass_s(100) == pytest.approx(0.11) and spec.tokens_per_pass(100) == 1.0


def test_the_two_measured_defaults_differ_as_documented():
    assert (DRAFT_COST.base_s, DRAFT_COST.per_token_s) == (0.0085, 0.000062)
    assert (SCHED_COST.base_s, SCHED_COST.per_token_s) == (0.018, 0.0002)


def test_fit_recovers_a_line_and_falls_back_when_it_cannot():
    samples = [(n, 0.018 + 0.0002 * n) for n in (10, 50, 200, 400)]
    line = fit(samples, DRAFT_COST)
    assert line.base_s == pytest.approx(0.018) and line.per_token_s == pytest.approx(0.0002)
    fallback = CostModel(1.0, 2.0)
    assert fit([(10, 0.1), (10, 0.2)], fallback) is fallback
    assert fit([(10, 0.3), (20, 0.1)], fallback) is fallback  # negative slope


def test_tau_and_acceptance():
    # 3 sequences over 10 decode passes emitted 25 tokens: 2.5 per pass and sequence;
    # 10 of them were each pass's own token, the other 15 accepted drafts out of 30
    assert tau(25, 10) == 2.5 and accept_rate(25, 10, 30) == 0.5
    assert tau(0, 0) == 1.0 and accept_rate(5, 10, 0) == 0.0
    assert accept_rate(8, 10, 4) == 0.0  # never negative


def test_bubble_ratio_is_idle_over_total_worker_seconds():
    assert bubble_ratio([4.0, 2.0], 4.0) == 0.25
    assert bubble_ratio([4.0, 4.0], 4.0) == 0.0
    assert bubble_ratio([1.0], 0.0) == 0.0
    assert bubble_ratio([5.0], 4.0) == 0.0  # clock skew never gives a negative bubble


def test_tail_is_the_time_after_ninety_percent_finished():
    assert tail_s([float(t) for t in range(1, 11)]) == 1.0  # 9th of 10 at 9 s, last at 10 s
    assert tail_s([3.0]) == 0.0
