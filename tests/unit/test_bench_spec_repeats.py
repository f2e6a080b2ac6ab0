"""`bench spec --repeats`: medians, min-max and vs_suffix over interleaved repeats (pure
arithmetic on hand-made summaries)."""

from __future__ import annotations

import pytest

from pipeline.bench.spec_repeats import aggregate, with_vs_suffix


def rep(none_s, suffix_s, hg_s, identical=None):
    base = {"tau": 1.0, "passes": 100, "drafter_frac": 0.0, "identical": identical}
    return {
        "none": {**base, "rollout_s": none_s, "speedup": 1.0},
        "suffix": {**base, "tau": 3.0, "rollout_s": suffix_s, "speedup": round(none_s / suffix_s, 4),
                   "drafter_frac": 0.08},
        "history+group": {**base, "tau": 2.5, "passes": 70, "rollout_s": hg_s,
                          "speedup": round(none_s / hg_s, 4), "drafter_frac": 0.05},
    }


def test_the_order_rotates_so_every_method_takes_every_position():
    from pipeline.bench.spec_repeats import run_order

    names = ("none", "suffix", "history+group")
    orders = [run_order(names, rep) for rep in range(3)]
    assert orders[0] == list(names)  # one repeat: the order given
    for position in range(3):
        assert sorted(order[position] for order in orders) == sorted(names)
    assert run_order(names, 3) == orders[0] and run_order((), 2) == []


def test_medians_min_max_and_runs_over_three_repeats():
    agg = aggregate([rep(20.0, 16.0, 14.0), rep(24.0, 18.0, 12.0), rep(22.0, 20.0, 18.0)])
    hg = agg["history+group"]
    assert hg["repeats"] == 3
    assert hg["rollout_s"] == 14.0 and hg["rollout_s_runs"] == [14.0, 12.0, 18.0]
    assert (hg["rollout_s_min"], hg["rollout_s_max"]) == (12.0, 18.0)
    # ratios are taken within a repeat, then summarised: 14/16, 12/18, 18/20
    assert hg["vs_suffix_runs"] == pytest.approx([0.875, 0.6667, 0.9], abs=1e-4)
    assert hg["vs_suffix"] == pytest.approx(0.875)
    assert (hg["vs_suffix_min"], hg["vs_suffix_max"]) == pytest.approx((0.6667, 0.9), abs=1e-4)
    # speedups 20/14, 24/12, 22/18: median 1.4286 (not 20/14 of the median times by chance)
    assert hg["speedup"] == pytest.approx(1.4286, abs=1e-4)
    assert hg["speedup_min"] == pytest.approx(22 / 18, abs=1e-4) and hg["speedup_max"] == 2.0
    assert agg["suffix"]["vs_suffix"] == 1.0 and agg["none"]["speedup_runs"] == [1.0] * 3
    assert hg["passes"] == 70 and hg["tau"] == 2.5


def test_even_repeats_take_the_mean_of_the_middle_two():
    agg = aggregate([rep(20.0, 10.0, 10.0), rep(30.0, 10.0, 14.0)])
    assert agg["history+group"]["rollout_s"] == 12.0


def test_identity_holds_only_if_every_repeat_was_identical():
    agg = aggregate([rep(1.0, 1.0, 1.0, identical=True), rep(1.0, 1.0, 1.0, identical=False)])
    assert agg["suffix"]["identical"] is False
    assert aggregate([rep(1.0, 1.0, 1.0)])["suffix"]["identical"] is None


def test_without_suffix_there_is_no_vs_suffix_and_no_repeats_is_an_error():
    one = {k: v for k, v in rep(20.0, 16.0, 14.0).items() if k != "suffix"}
    assert with_vs_suffix(one)["history+group"]["vs_suffix"] is None
    assert aggregate([one])["history+group"]["vs_suffix"] is None
    with pytest.raises(ValueError):
        aggregate([])
