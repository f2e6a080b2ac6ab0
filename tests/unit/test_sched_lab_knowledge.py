"""Knowledge levels: the predictions a policy is given, from history to every response's
true length."""

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
from sched_lab.knowledge import LEVELS, with_knowledge  # noqa: E402

GROUPS = [GroupWork("a", 3, 50.0, True, (10, 20, 90)), GroupWork("b", 2, 7.0, False, (40, 60))]


def test_history_is_unchanged():
    assert with_knowledge(GROUPS, "history") == GROUPS


def test_group_levels_predict_the_group_mean_and_max():
    mean = with_knowledge(GROUPS, "group-mean")
    assert [g.predicted for g in mean] == [40.0, 50.0]
    assert [g.predicted for g in with_knowledge(GROUPS, "group-max")] == [90.0, 60.0]
    # the groups themselves stay: same ids, sizes and true lengths; all now "known"
    assert [(g.prompt_id, g.n, g.lengths, g.known) for g in mean] == \
        [("a", 3, (10, 20, 90), True), ("b", 2, (40, 60), True)]


def test_response_level_splits_every_group_at_its_true_lengths():
    split = with_knowledge(GROUPS, "response")
    assert [(g.prompt_id, g.n, g.predicted, g.lengths) for g in split] == [
        ("a/0", 1, 10.0, (10,)), ("a/1", 1, 20.0, (20,)), ("a/2", 1, 90.0, (90,)),
        ("b/0", 1, 40.0, (40,)), ("b/1", 1, 60.0, (60,))]


def test_bad_level_or_missing_lengths():
    with pytest.raises(ValueError, match="choose from history"):
        with_knowledge(GROUPS, "perfect")
    with pytest.raises(ValueError, match="group 'c' has none"):
        with_knowledge([GroupWork("c", 2, 5.0)], "group-max")
    assert LEVELS[0] == "history" and LEVELS[-1] == "response"


def test_only_response_knowledge_singles_out_an_outlier_for_tier_two():
    # Eight groups predicted alike; one response of one group runs 10x longer. Per group
    # the outlier's group looks long (group-max), but its short siblings come along onto
    # the reserve; per response, tier 2 gives the outlier a reserved worker of its own.
    cost = CostModel(base_s=0.01, per_token_s=0.01)
    lengths = [(400, 40, 40, 40)] + [(40, 40, 40, 40)] * 7
    groups = [GroupWork(f"p{i}", 4, 40.0, True, ls) for i, ls in enumerate(lengths)]
    config = SimConfig(workers=4, prompt_tokens=0, cost=cost)
    params = PlacementParams(cost=cost, tier2_workers_frac=0.25, tier2_max_seqs=1)
    runs = {level: simulate_events(make_policy("tier2", params), with_knowledge(groups, level),
                                   config).makespan_s for level in LEVELS}
    assert runs["response"] < runs["group-max"] <= runs["history"]
    # alone on its worker, the outlier takes 400 passes of one token each
    assert runs["response"] == pytest.approx(400 * (0.01 + 0.01), rel=0.05)
