"""The `tree` draft budget (`spec.budget: tree`, the default): every request may draft up to
the pass's cap (`pipeline.drafting.pass_caps`: more while the pass is thin, at most
`max_len`), whatever was rejected before; the drafter's own cut (path probability >=
min_path_prob, at most the matched length) decides each draft's length, as vLLM's
SuffixDecoding does.

With `spec.min_accept` > 0 it also learns where the trees draft badly: each draft is cut
where its calibrated probability of being accepted so far (the product of the calibrated
rates of its tokens' path probabilities, `pipeline.drafting.calibration`, learnt from this
run's verified drafts) falls below min_accept, keeping at least one token so that the
evidence keeps coming. On text the trees rarely match (a real model at T = 1) that cuts
most draft tokens; where they match, little. Its calibration is saved with checkpoints.
Pure logic, no vLLM.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from pipeline.config.schema import SpecConfig
from pipeline.drafting.budget_api import Budget, Remaining
from pipeline.drafting.calibration import Calibrator, conditional, restore_state
from pipeline.drafting.pass_caps import PassCaps


class TreeBudget(Budget):
    """Every candidate is asked for min(available, max_len) tokens and keeps its draft (cut
    at min_accept's calibrated floor when that is set)."""

    fixed_caps = True  # the next drafts can be worked out ahead (a cut trims them after)

    def __init__(self, max_len: int, min_accept: float = 0.0):
        if max_len < 1:
            raise ValueError(f"need max_len >= 1, got {max_len}")
        if not 0 <= min_accept < 1:
            raise ValueError(f"need min_accept in [0, 1), got {min_accept}")
        self.max_len = max_len
        self.min_accept = float(min_accept)
        self.calibrator = Calibrator()
        self._asked: list[Hashable] = []
        self._kept: dict[Hashable, list[float]] = {}  # per request: its kept draft's q's

    @classmethod
    def from_spec(cls, spec: SpecConfig) -> TreeBudget:
        return cls(PassCaps.from_spec(spec).most, spec.min_accept)

    def ask(self, req_ids: Sequence[Hashable], available: Sequence[int], rows: int,
            remaining: Remaining) -> list[int]:
        k = self.max_len
        if self.min_accept:  # grant cuts per request; without a floor nothing is kept
            self._asked = list(req_ids)
        return [max(0, min(a, k)) for a in available]

    def grant(self, drafts) -> list[int]:
        if not self.min_accept:
            return [len(d.token_ids) for d in drafts]
        kept = []
        for req_id, d in zip(self._asked, drafts):
            if not d.token_ids:
                kept.append(0)
                continue
            qs = conditional(d.probs)
            n = sum(1 for g in self.calibrator.cumulative(qs) if g >= self.min_accept)
            n = max(1, n)  # cumulative is non-increasing: the first n pass the floor
            self._kept[req_id] = qs[:n]
            kept.append(n)
        return kept

    def observe(self, req_id: Hashable, proposed: int, accepted: int) -> None:
        qs = self._kept.pop(req_id, None)
        if qs:
            self.calibrator.observe(qs, accepted)

    def forget(self, req_id: Hashable) -> None:
        self._kept.pop(req_id, None)

    def calibration(self) -> dict | None:
        return self.calibrator.state() if self.min_accept else None

    def state(self) -> dict | None:
        return {"calibration": self.calibrator.state()} if self.min_accept else None

    def load_state(self, state: dict) -> None:
        restore_state(self.calibrator, state["calibration"])


__all__ = ["TreeBudget"]
