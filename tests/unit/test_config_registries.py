"""The config schema restates the names of several registries as `Literal`s (so that
`load_config` refuses a bad name with the list of good ones, before any heavy import). Each
`Literal` must equal the names its registry serves: a name only in the schema would pass
the config check and fail at setup; a name only in the registry could never be chosen."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from pipeline.config import methods
from pipeline.config.schema import SchedConfig, SpecConfig, TrainConfig
from pipeline.drafting import build
from pipeline.errors import UsageError
from pipeline.sched import registry
from pipeline.train import grpo


def allowed(section: type, key: str) -> set[str]:
    """The values the schema allows for `section.key` (a Literal)."""
    hint = typing.get_type_hints(section)[key]
    assert typing.get_origin(hint) is typing.Literal, f"{section.__name__}.{key} is no Literal"
    return set(typing.get_args(hint))


def canonical(table: dict) -> set[str]:
    """A registry's names without aliases (a name whose entry an earlier name already has)."""
    first: dict[int, str] = {}
    for name, entry in table.items():
        first.setdefault(id(entry), name)
    return set(first.values())


def test_sched_policy_is_auto_and_every_policy_training_can_run():
    assert allowed(SchedConfig, "policy") == {registry.AUTO, *registry.training_policy_names()}
    # the others need the true lengths: bench references only
    assert set(registry.POLICIES) - allowed(SchedConfig, "policy") == {"oracle"}


def test_spec_method_is_the_method_registry():
    assert allowed(SpecConfig, "method") == set(methods.REGISTRY)


def test_adv_estimator_is_the_estimator_registry():
    assert allowed(TrainConfig, "adv_estimator") == set(grpo.ADVANTAGE_ESTIMATORS)


def test_loss_agg_mode_is_the_aggregation_registry():
    assert allowed(TrainConfig, "loss_agg_mode") == set(grpo.LOSS_AGGREGATIONS)


def test_kl_type_is_the_kl_registry_without_its_aliases():
    assert grpo.KL_ESTIMATORS["k3"] is grpo.KL_ESTIMATORS["low_var_kl"]  # k3: veRL's other name
    assert allowed(TrainConfig, "kl_type") == canonical(grpo.KL_ESTIMATORS)


def test_canonical_drops_only_aliases():
    def f(): ...

    def g(): ...

    assert canonical({"a": f, "b": g, "c": f}) == {"a", "b"}


def test_spec_budget_is_the_budget_registry():
    assert allowed(SpecConfig, "budget") == set(build.BUDGETS)
    for name, rule in build.BUDGETS.items():  # each name builds its own rule
        assert type(build.make_budget(SpecConfig(budget=name))) is rule


def test_an_unknown_budget_fails_with_one_line():
    """The schema refuses it first; a config built around the schema still gets one line."""
    with pytest.raises(UsageError, match=r"^spec.budget: unknown draft budget 'fast'; use one "
                                         r"of tree, throughput, critical$"):
        build.make_budget(dataclasses.replace(SpecConfig(), budget="fast"))
