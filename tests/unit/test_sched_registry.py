"""A run's placement: `sched.policy` resolved once for its rollout workers, its settings
from the `sched` section (the schema's defaults), and the per-worker share of a policy
that runs locally (static: veRL's contiguous split)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.config import load_config
from pipeline.config.schema import SchedConfig
from pipeline.errors import UsageError
from pipeline.loop.batches import shard
from pipeline.sched.predictor import LengthPredictor
from pipeline.sched.registry import RolloutPlacement
from pipeline.sched.settings import PlacementParams, PlacementSettings


def placement(policy: str, workers: int) -> RolloutPlacement:
    return RolloutPlacement.from_config(replace(SchedConfig(), policy=policy), workers)


@pytest.mark.parametrize("policy, workers, name, coordinated", [
    ("auto", 4, "seer", True), ("auto", 1, "static", False), ("static", 4, "static", False),
    ("histopipe", 4, "histopipe", True), ("tier2", 2, "tier2", True),
    ("histopipe", 1, "static", False), ("seer", 1, "static", False)])
def test_the_policy_is_resolved_for_the_workers(policy, workers, name, coordinated):
    p = placement(policy, workers)
    assert (p.name, p.coordinated) == (name, coordinated)


def test_a_reference_policy_or_an_unknown_one_is_refused():
    with pytest.raises(UsageError) as exc:
        placement("oracle", 1)  # refused even where one worker would run it as static
    assert str(exc.value) == (
        "sched.policy oracle needs every response's length in advance, which training does "
        "not have (it is a reference for `rhymectl bench sched`); choose from auto, static, "
        "histopipe, tier2, seer")
    with pytest.raises(UsageError, match="^unknown placement policy 'fifo'; choose from "):
        placement("fifo", 4)


def test_the_settings_come_from_the_sched_section_and_default_to_its_defaults():
    cfg = load_config(None, ["sched.chunk_tokens=128", "sched.migrate_gap=3",
                             "sched.tier2_workers_frac=0.25", "sched.tier2_max_seqs=2"])
    assert RolloutPlacement.from_config(cfg.sched, 4).settings == PlacementSettings(
        chunk_tokens=128, migrate_gap=3, tier2_workers_frac=0.25, tier2_max_seqs=2)
    assert PlacementSettings() == PlacementSettings.from_config(SchedConfig())
    # a step's parameters from the default settings on the bench's default step
    step = PlacementSettings().step_params(LengthPredictor(), SchedConfig().sim_requests_per_worker,
                                           capacity=PlacementParams().capacity)
    assert step == PlacementParams()


@pytest.mark.parametrize("batch, workers", [(4, 1), (4, 2), (8, 4), (12, 3), (16, 8)])
def test_a_static_share_is_the_contiguous_split(batch, workers):
    static = placement("static", workers)
    for n in (1, 3):
        for w in range(workers):
            assert static.share(batch, n, w, workers) == shard(list(range(batch)), w, workers)


def test_a_share_exists_only_for_whole_groups_of_a_local_policy():
    with pytest.raises(ValueError, match="splits a group over the workers"):
        placement("static", 2).share(3, 2, 0, 2)  # 6 requests in 2 shares of 3
    with pytest.raises(ValueError, match="hands work out through a coordinator"):
        placement("seer", 2).share(4, 2, 0, 2)
