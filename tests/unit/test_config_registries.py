"""The config schema restates the names of several registries as `Literal`s (so that
`load_config` refuses a bad name with the list of good ones, before any heavy import). Each
`Literal` must equal the names its registry serves: a name only in the schema would pass
the config check and fail at setup; a name only in the registry could never be chosen."""

from __future__ import annotations

import ast
import inspect
import typing

from pipeline.config import methods
from pipeline.config.schema import SchedConfig, SpecConfig, TrainConfig
from pipeline.drafting import build
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


def test_spec_budget_is_every_budget_make_budget_builds():
    """make_budget is an if-chain whose last line takes every other name: each allowed name
    must reach its own budget, and every name the chain tests for must be allowed."""
    names = allowed(SpecConfig, "budget")
    built = {name: type(build.make_budget(SpecConfig(budget=name))) for name in names}
    assert len(set(built.values())) == len(names), built  # no name falls through by mistake
    tested = {node.comparators[0].value
              for node in ast.walk(ast.parse(inspect.getsource(build.make_budget)))
              if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute)
              and node.left.attr == "budget" and isinstance(node.comparators[0], ast.Constant)}
    assert tested and tested <= names
    assert len(names - tested) == 1  # the fall-through branch's name

