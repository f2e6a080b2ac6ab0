"""bench e2e's statistics on synthetic data: a known difference is detected, a null case
is not, the false-positive rate holds at 5 % when runs differ, and the speedup arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.bench.compare import amdahl_bound, compare_heldout, ratio_summary


def arm(rng, mu: float, seeds: int, prompts: np.ndarray, run_sd: float, noise_sd: float):
    """[seeds][prompts] per-prompt mean@k: shared prompt effects + a run effect + noise."""
    return [list(np.clip(mu + prompts + rng.normal(0, run_sd) +
                         rng.normal(0, noise_sd, prompts.size), 0, 1)) for _ in range(seeds)]


def prompt_effects(rng, n: int = 256):
    return rng.normal(0, 0.2, n)  # difficulty varies far more than anything else


def test_a_known_difference_is_detected():
    rng = np.random.default_rng(1)
    prompts = prompt_effects(rng)
    base = arm(rng, 0.55, 4, prompts, run_sd=0.01, noise_sd=0.1)
    acc = arm(rng, 0.62, 4, prompts, run_sd=0.01, noise_sd=0.1)
    out = compare_heldout(base, acc)
    assert out["p"] < 0.01
    assert out["ci95"][0] > 0 and out["ci95"][0] < 0.07 < out["ci95"][1]
    assert out["mean"] == pytest.approx(0.07, abs=0.02)
    assert out["runs"] == [4, 4] and out["prompts"] == 256 and out["method"].startswith("welch")


def test_a_null_case_is_not_detected():
    rng = np.random.default_rng(2)
    prompts = prompt_effects(rng)
    base = arm(rng, 0.6, 3, prompts, run_sd=0.01, noise_sd=0.1)
    acc = arm(rng, 0.6, 3, prompts, run_sd=0.01, noise_sd=0.1)
    out = compare_heldout(base, acc)
    assert out["p"] > 0.05 and out["ci95"][0] < 0 < out["ci95"][1]


def test_false_positives_stay_near_5_percent_when_runs_differ():
    """Run effects that a test over seeds x prompts as independent values would ignore:
    with them, that naive test rejects far more than 5 % of null cases; ours does not."""
    from scipy import stats

    rng = np.random.default_rng(3)
    ours = naive = 0
    trials = 300
    for _ in range(trials):
        prompts = prompt_effects(rng, 64)
        base = arm(rng, 0.6, 3, prompts, run_sd=0.03, noise_sd=0.1)
        acc = arm(rng, 0.6, 3, prompts, run_sd=0.03, noise_sd=0.1)
        ours += compare_heldout(base, acc)["p"] < 0.05
        d = np.array(acc).mean(0) - np.array(base).mean(0)
        naive += stats.ttest_1samp(d, 0).pvalue < 0.05
    assert 0.01 <= ours / trials <= 0.10
    assert naive / trials > 0.3


def test_one_run_per_arm_falls_back_to_prompt_pairs():
    rng = np.random.default_rng(4)
    prompts = prompt_effects(rng)
    base = arm(rng, 0.5, 1, prompts, run_sd=0.0, noise_sd=0.05)
    acc = arm(rng, 0.55, 1, prompts, run_sd=0.0, noise_sd=0.05)
    out = compare_heldout(base, acc)
    assert out["method"].startswith("paired") and out["p"] < 0.001
    assert out["ci95"][0] < 0.05 < out["ci95"][1]


def test_identical_arms_give_zero_difference_and_p_one():
    runs = [[0.1, 0.5, 0.9], [0.2, 0.4, 0.8]]
    out = compare_heldout(runs, [list(r) for r in runs])
    assert out["mean"] == 0 and out["p"] == pytest.approx(1.0)


def test_runs_must_score_the_same_prompts():
    with pytest.raises(ValueError, match="same held-out prompts"):
        compare_heldout([[0.1, 0.2]], [[0.1, 0.2, 0.3]])
    with pytest.raises(ValueError, match="at least one run"):
        compare_heldout([], [[0.1]])


def test_ratio_summary_and_amdahl():
    assert ratio_summary([1.1, 0.9, 1.3]) == {"median": 1.1, "min": 0.9, "max": 1.3}
    assert ratio_summary([]) == {"median": None, "min": None, "max": None}
    assert amdahl_bound(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert amdahl_bound(1.0, 1.6) == pytest.approx(1.6)
    assert amdahl_bound(0.0, 10.0) == 1.0
    assert amdahl_bound(0.4, 1.0) == 1.0
    with pytest.raises(ValueError):
        amdahl_bound(0.5, 0.0)
