"""From the validated `spec` config section to the drafter and budget settings."""

from __future__ import annotations

from pipeline.config.schema import SpecConfig
from pipeline.costs import DRAFT_COST, CostModel
from pipeline.drafting.budget import BudgetConfig, DraftBudget, TreeBudget
from pipeline.drafting.critical import CriticalBudget, CriticalConfig
from pipeline.drafting.inputs import DrafterConfig


def drafter_config(spec: SpecConfig) -> DrafterConfig:
    """Raises ValueError for methods GroupDrafter does not serve (none, ngram, suffix)."""
    return DrafterConfig.for_method(spec.method, min_path_prob=spec.min_path_prob,
                                    max_spec_factor=spec.spec_factor(),
                                    reward_weighted=spec.reward_weighted,
                                    max_cached_prompts=spec.max_cached_prompts)


def budget_config(spec: SpecConfig, cost: CostModel = DRAFT_COST) -> BudgetConfig:
    """`spec.num_speculative_tokens` caps every request's draft; the budget starts below."""
    max_len = spec.num_speculative_tokens
    return BudgetConfig(max_len=max_len, start_len=min(2, max_len), min_len=1, cost=cost)


def make_budget(spec: SpecConfig) -> DraftBudget | CriticalBudget | TreeBudget:
    """`spec.budget`: drafts as long as the trees support (`tree`), the critical-path
    budget (online cost, calibrated acceptance) or the per-pass throughput one."""
    if spec.budget == "critical":
        return CriticalBudget(CriticalConfig(max_len=spec.num_speculative_tokens))
    if spec.budget == "tree":
        return TreeBudget(spec.num_speculative_tokens)
    return DraftBudget(budget_config(spec))


__all__ = ["budget_config", "drafter_config", "make_budget"]
