"""The `tree` draft budget (`spec.budget: tree`, the default): every request may draft up to
the pass's cap (`pipeline.drafting.pass_caps`: more while the pass is thin, at most
`max_len`), whatever was rejected before; the
drafter's own cut (path probability >= min_path_prob, at most the matched length) decides
each draft's length, as vLLM's SuffixDecoding does. It keeps no state. Pure logic, no vLLM.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from pipeline.config.schema import SpecConfig
from pipeline.drafting.budget_api import Budget, Remaining
from pipeline.drafting.pass_caps import PassCaps


class TreeBudget(Budget):
    """Every candidate is asked for min(available, max_len) tokens and keeps its draft."""

    fixed_caps = True  # the next drafts can be worked out ahead

    def __init__(self, max_len: int):
        if max_len < 1:
            raise ValueError(f"need max_len >= 1, got {max_len}")
        self.max_len = max_len

    @classmethod
    def from_spec(cls, spec: SpecConfig) -> TreeBudget:
        return cls(PassCaps.from_spec(spec).most)

    def ask(self, req_ids: Sequence[Hashable], available: Sequence[int], rows: int,
            remaining: Remaining) -> list[int]:
        k = self.max_len
        return [max(0, min(a, k)) for a in available]


__all__ = ["TreeBudget"]
