"""Draft caps by pass size: longer drafts while a pass is thin (memory-bound on a GPU)."""

from __future__ import annotations

import pytest

from pipeline.config.schema import SpecConfig
from pipeline.drafting.pass_caps import PassCaps
from pipeline.rollout.engine_args import engine_model_len
from pipeline.rollout.speculation import engine_draft_tokens


@pytest.mark.parametrize("rows, cap", [(1, 16), (17, 16), (18, 15), (24, 11), (32, 8),
                                       (33, 8), (512, 8), (0, 8)])
def test_a_pass_of_rows_sequences_drafts_up_to_its_token_budget(rows, cap):
    caps = PassCaps(dense=8, thin=16, pass_tokens=296)
    assert caps.cap(rows) == cap
    if 8 < cap < 16:
        assert rows * (1 + cap) <= 296 < rows * (2 + cap)  # the most that fits, no more


def test_thin_caps_off_leave_every_pass_at_the_dense_cap():
    for caps in (PassCaps(8), PassCaps(8, 0, 296), PassCaps(8, 8, 10_000), PassCaps(8, 4, 296)):
        assert [caps.cap(r) for r in (1, 4, 300)] == [8, 8, 8] and caps.most == 8
    assert PassCaps(8, 16, 0).cap(1) == 8  # no pass is thin


def test_the_engine_is_built_for_the_longest_draft_its_method_makes():
    assert engine_draft_tokens(SpecConfig(method="history+group")) == 16
    assert engine_draft_tokens(SpecConfig(method="history", thin_draft_tokens=0)) == 8
    assert engine_draft_tokens(SpecConfig(method="group", num_speculative_tokens=24)) == 24
    assert engine_draft_tokens(SpecConfig(method="suffix")) == 8  # vLLM's own: never more
    assert engine_draft_tokens(SpecConfig(method="none")) == 0
    assert engine_draft_tokens(None) == 0


def test_the_engine_leaves_room_for_the_longest_draft(tmp_path):
    need = 192
    assert engine_model_len(tmp_path, need, SpecConfig(method="history+group")) == need + 33
    assert engine_model_len(tmp_path, need, SpecConfig(method="suffix")) == need + 17


def test_passes_with_more_requests_than_max_draft_rows_draft_nothing():
    """spec.max_draft_rows: on a GPU a full pass that verifies drafts turns compute-bound
    and leaves the CUDA graphs, so above some batch drafting loses
    (`pipeline.gpu_cost.GpuPassModel.break_even_rows`); such passes draft nothing."""
    caps = PassCaps.from_spec(SpecConfig(method="history+group", max_draft_rows=64))
    assert [caps.cap(r) for r in (1, 17, 64, 65, 512)] == [16, 16, 8, 0, 0]
    assert caps.most == 16  # the engine is built as before
    assert PassCaps.from_spec(SpecConfig(method="history+group")).cap(512) == 8


def test_max_draft_rows_is_for_rhymectls_drafters():
    from pipeline.config import load_config
    from pipeline.config.load import ConfigError

    assert load_config(None, ["spec.method=group",
                              "spec.max_draft_rows=64"]).spec.max_draft_rows == 64
    assert load_config(None, ["spec.method=none", "spec.max_draft_rows=64"]).spec.max_draft_rows == 64
    for bad, line in (
            (["spec.method=suffix", "spec.max_draft_rows=64"],
             "spec.max_draft_rows = 64 applies to rhymectl's drafters (history, group, "
             "history+group, history+group+model); vLLM's suffix proposer drafts in every pass: remove it or use "
             "one of them"),
            (["spec.method=group", "spec.max_draft_rows=0"],
             "spec.max_draft_rows = 0 is not allowed; expected a number > 0")):
        with pytest.raises(ConfigError) as err:
            load_config(None, bad)
        assert err.value.problems == [line]


def test_draft_model_settings_without_a_draft_model_are_refused_for_training():
    from pipeline.config import load_config
    from pipeline.config.load import draft_model_problems

    cfg = load_config(None, ["spec.method=history+group", "spec.draft_updates=40"])
    assert draft_model_problems(cfg) == [
        "spec.draft_updates = 40 applies to a draft model (history+group+model), and "
        "spec.method is history+group: remove it or use that method"]
    assert draft_model_problems(load_config(None, ["spec.method=history+group+model",
                                                   "spec.draft_updates=40"])) == []


def test_the_tree_floor_is_refused_where_no_tree_budget_drafts():
    from pipeline.config import ConfigError, load_config

    assert load_config(None, ["spec.method=history+group", "spec.min_accept=0.02"]) \
        .spec.min_accept == 0.02
    for bad in (["spec.method=history+group", "spec.budget=critical", "spec.min_accept=0.02"],
                ["spec.method=suffix", "spec.min_accept=0.02"],
                ["spec.method=none", "spec.min_accept=0.02"]):
        with pytest.raises(ConfigError) as err:
            load_config(None, bad)
        assert len(err.value.problems) == 1
        assert err.value.problems[0].startswith("spec.min_accept = 0.02 cuts the tree budget's")
