"""How many draft tokens a request may get in one target pass: more while the pass is thin.

A GPU runs a decode pass memory-bound up to a few hundred scheduled tokens (296 for a 7B
policy on an H100, `pipeline.costs`): there a pass costs about the same whatever it
verifies, and the step's last requests, which set its length, run in such passes. So
while running requests x (1 + cap) stays within `pass_tokens`, a request may draft up to
pass_tokens // rows - 1 tokens, never fewer than `dense` (`spec.num_speculative_tokens`,
the cap of a full pass) nor more than `thin` (`spec.thin_draft_tokens`, what the vLLM
engine is built for). A pass of more than `max_rows` requests (`spec.max_draft_rows`)
drafts nothing: there verifying drafts costs a GPU more than it saves
(`pipeline.gpu_cost`). Pure logic.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.schema import SpecConfig


def within(rows: int, cap: int, pass_tokens: int) -> bool:
    """Whether a pass of `rows` sequences drafting up to `cap` tokens each schedules at most
    `pass_tokens` tokens (rows x (1 + cap)): with `spec.thin_pass_tokens`, a thin pass."""
    return rows * (1 + cap) <= pass_tokens


@dataclass(frozen=True)
class PassCaps:
    """dense: draft tokens per request in a full pass; thin: the most in a thin pass (at
    most dense: never more); pass_tokens: the scheduled tokens up to which a pass is thin."""

    dense: int
    thin: int = 0
    pass_tokens: int = 0
    max_rows: int | None = None  # spec.max_draft_rows: a larger pass drafts nothing

    @classmethod
    def from_spec(cls, spec: SpecConfig) -> PassCaps:
        return cls(spec.num_speculative_tokens, spec.thin_draft_tokens, spec.thin_pass_tokens,
                   spec.max_draft_rows)

    @property
    def most(self) -> int:
        """The most draft tokens any request gets in one pass (the engine's cap)."""
        return max(self.dense, self.thin)

    def cap(self, rows: int) -> int:
        """Draft tokens each request may get in a pass of `rows` sequences."""
        if self.max_rows is not None and rows > self.max_rows:
            return 0
        if self.thin <= self.dense or rows <= 0:
            return self.dense
        return min(self.thin, max(self.dense, self.pass_tokens // rows - 1))


__all__ = ["PassCaps", "within"]
