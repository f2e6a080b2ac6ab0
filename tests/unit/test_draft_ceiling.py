"""The oracle drafter's passes (`pipeline.draft_ceiling`) on hand-counted responses."""

import pytest

from pipeline.draft_ceiling import gap_closed, gaps_closed, oracle_passes, step_ceiling

T, F = True, False


def test_no_drafts_is_one_token_a_pass():
    assert oracle_passes([T] * 5, cap=0) == 5
    assert oracle_passes([F] * 7, cap=None) == 7  # nothing the oracle drafts is sampled


def test_a_run_of_hits_is_accepted_up_to_the_cap():
    # prefill emits token 0; one pass accepts tokens 1..9 and the response ends there
    assert oracle_passes([T] * 10, cap=None) == 2
    # cap 4: tokens 1-4 accepted, 5 emitted by the pass; then 6-9 accepted
    assert oracle_passes([T] * 10, cap=4) == 3


def test_a_miss_ends_the_pass_with_its_own_token():
    # pass 2: token 1 accepted, token 2 resampled; pass 3: 3 and 4 accepted, 5 resampled
    assert oracle_passes([T, T, F, T, T, F], cap=8) == 3
    # the first token is the prefill's, whatever its flag
    assert oracle_passes([F, T, T, F], cap=8) == oracle_passes([T, T, T, F], cap=8) == 2


def test_empty_and_single_token_responses():
    assert oracle_passes([], cap=8) == 0
    assert oracle_passes([F], cap=8) == 1


def test_a_step_lasts_as_long_as_its_slowest_response():
    assert step_ceiling([[T] * 10, [F] * 4, [T, F, F]], cap=None) == 4
    assert step_ceiling([], cap=8) == 0


def test_a_negative_cap_is_refused():
    with pytest.raises(ValueError, match="cap"):
        oracle_passes([T, T], cap=-1)


def test_the_gap_closed_is_the_share_of_the_reference_s_lead_over_the_oracle_taken_off():
    # history+group 700 passes, the oracle 300: a method at 600 closes 100 of 400
    assert gap_closed(700, 600, 300) == 0.25
    assert gap_closed(700, 300, 300) == 1.0 and gap_closed(700, 700, 300) == 0.0
    assert gap_closed(700, 800, 300) == -0.25  # worse than the reference
    assert gap_closed(700, 200, 300) == 1.25  # sampled drafts can beat the argmax chain
    assert gap_closed(300, 250, 300) is None and gap_closed(300, 250, 320) is None


def test_gaps_closed_per_method_in_passes_and_on_the_median_step():
    methods = {"none": (1000, 100), "suffix": (800, 70), "history+group": (700, 60),
               "history+group+model": (550, 45)}
    got = gaps_closed(methods, (400, 30))
    assert got == {"suffix": {"passes": round(-100 / 300, 4), "critical_passes": round(-10 / 30, 4)},
                   "history+group+model": {"passes": 0.5, "critical_passes": 0.5}}
    assert gaps_closed({"suffix": (800, 70)}, (400, 30)) == {}  # no reference
