"""From the validated `spec` config section to the drafter's settings and the draft budget.

`BUDGETS` is the registry of draft-length rules by the name `spec.budget` gives them; each
rule is a `pipeline.drafting.budget_api.Budget` in a module of its own.
"""

from __future__ import annotations

from pipeline.config.schema import SpecConfig
from pipeline.drafting.budget_api import Budget
from pipeline.drafting.budget_critical import CriticalBudget
from pipeline.drafting.budget_throughput import ThroughputBudget
from pipeline.drafting.budget_tree import TreeBudget
from pipeline.drafting.inputs import DrafterConfig
from pipeline.errors import UsageError

BUDGETS: dict[str, type[Budget]] = {
    "tree": TreeBudget,
    "throughput": ThroughputBudget,
    "critical": CriticalBudget,
}


def drafter_config(spec: SpecConfig) -> DrafterConfig:
    """Raises ValueError for methods GroupDrafter does not serve (none, ngram, suffix)."""
    return DrafterConfig.for_method(spec.method, min_path_prob=spec.min_path_prob,
                                    max_spec_factor=spec.spec_factor(),
                                    reward_weighted=spec.reward_weighted,
                                    max_cached_prompts=spec.max_cached_prompts,
                                    chain=spec.chain_drafts, own_tree=spec.own_tree,
                                    thin_pass_tokens=spec.thin_pass_tokens,
                                    **({} if spec.global_below is None
                                       else {"global_below": spec.global_below}))


def make_budget(spec: SpecConfig) -> Budget:
    """The draft budget `spec.budget` names (the rules are described in docs/speculation.md,
    "Draft length")."""
    rule = BUDGETS.get(spec.budget)
    if rule is None:
        raise UsageError(f"spec.budget: unknown draft budget {spec.budget!r}; use one of "
                         f"{', '.join(BUDGETS)}")
    return rule.from_spec(spec)


__all__ = ["BUDGETS", "drafter_config", "make_budget"]
