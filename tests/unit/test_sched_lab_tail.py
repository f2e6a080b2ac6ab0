"""Tail batching, simulated: over-provision, keep the first complete groups, defer the rest."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.costs import CostModel
from pipeline.sched.events import simulate_events
from pipeline.sched.registry import make_policy
from pipeline.sched.simulator import SimConfig
from pipeline.sched.settings import PlacementParams
from pipeline.sched.types import GroupWork

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # as the scripts run
from sched_lab.tail import TailBatching, simulate_tail  # noqa: E402

ONE_S_PASS = CostModel(base_s=1.0, per_token_s=0.0)


def prompts(*lengths):
    return [GroupWork(f"p{i}", 1, float(x), True, (x,)) for i, x in enumerate(lengths)]


def run(tail, steps=3, lengths=(10, 2, 3, 4, 5, 6)):
    config = SimConfig(workers=2, prompt_tokens=0, cost=ONE_S_PASS)
    policy = make_policy("static", PlacementParams(cost=ONE_S_PASS))
    return simulate_tail(prompts(*lengths), 2, steps, policy, config, simulate_events, tail)


def test_without_tail_batching_each_step_waits_for_its_groups():
    reports = run(None)
    # steps take prompts (10, 2), (3, 4), (5, 6): one per worker, 1 s a pass
    assert [r.step_s for r in reports] == [10.0, 4.0, 6.0]
    assert all(r.deferred == 0 and r.trained == 2 and r.waits == [0, 0] for r in reports)


def test_the_long_prompt_is_deferred_then_pinned():
    reports = run(TailBatching(overprovision=0.5, max_waits=1))
    # step 0 launches 10, 2, 3 and trains on 2 and 3 (done at 2 s and 3 s); 10 is dropped
    assert (reports[0].launched, reports[0].trained, reports[0].deferred) == (3, 2, 1)
    assert reports[0].step_s == pytest.approx(3.0) and reports[0].waits == [0, 0]
    # step 1 launches 10 (deferred once: pinned now), 4, 5: the step waits for 10
    assert reports[1].step_s == pytest.approx(10.0) and reports[1].deferred == 1
    assert sorted(reports[1].waits) == [0, 1]
    # nothing of a dropped group that had not finished counts as wasted work
    assert reports[0].wasted_tokens == 0


def test_bad_knobs():
    with pytest.raises(ValueError, match="overprovision must be >= 0"):
        TailBatching(overprovision=-0.1)
    with pytest.raises(ValueError, match="max_waits must be >= 0"):
        TailBatching(max_waits=-1)


def test_bucketed_steps_batch_the_predicted_long_prompts_together():
    # 4 prompts a window (2 steps of 2), longest first: (10, 5), (3, 2) then (9, 8), (7, 6)
    lengths = (10, 2, 3, 5, 6, 7, 8, 9)
    reports = run(TailBatching(overprovision=0.0, bucket_steps=2), steps=4, lengths=lengths)
    assert [r.step_s for r in reports] == [10.0, 3.0, 9.0, 7.0]  # 29 s, against 10+5+7+9
    assert [r.step_s for r in run(None, steps=4, lengths=lengths)] == [10.0, 5.0, 7.0, 9.0]
    assert all(r.deferred == 0 for r in reports)
    with pytest.raises(ValueError, match="bucket_steps must be >= 1"):
        TailBatching(bucket_steps=0)
