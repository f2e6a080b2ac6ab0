"""What the drafter reports about itself: its size (`DrafterStats`), which tree served its
drafts (`source_shares`) and where its time went (`DrafterTimes`)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields


@dataclass
class DrafterStats:
    prompts: int = 0  # prompts with history
    trees: int = 0  # prompt trees held
    live_requests: int = 0
    history_responses: int = 0
    history_tokens: int = 0
    tree_bytes: int = 0  # C++ estimate over all trees
    drafts: int = 0
    drafted_tokens: int = 0
    wins: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "own": 0, "global": 0})


def source_shares(counts: dict[str, int]) -> dict[str, float]:
    """Drafts per tree (`GroupDrafter.sources()` or a difference of two) as shares of all
    drafts, rounded to 4 places; all 0.0 when there were none."""
    total = sum(counts.values())
    return {k: round(v / total, 4) if total else 0.0 for k, v in counts.items()}


@dataclass
class DrafterTimes:
    """Seconds the drafter spent, by part (wall time, accumulated):

    live_in: running and finished responses entering the trees their siblings draft from
    (`PromptState.feed`; with siblings off, also a request's own tree), and a prompt's
    tree being built from its history on its first draft; queries: asking the trees for a
    draft (`SuffixTree.speculate`, the shared-draft check, the Python around them);
    group_ends: a finished group's live responses leaving the trees.
    """

    live_in: float = 0.0
    queries: float = 0.0
    group_ends: float = 0.0

    def minus(self, earlier: "DrafterTimes") -> "DrafterTimes":
        """The time spent since `earlier` (a copy taken then)."""
        return self._by_part(earlier, operator.sub)

    def plus(self, other: "DrafterTimes") -> "DrafterTimes":
        return self._by_part(other, operator.add)

    def _by_part(self, other: "DrafterTimes", op) -> "DrafterTimes":
        return DrafterTimes(*(op(getattr(self, f.name), getattr(other, f.name))
                              for f in fields(self)))

    def as_dict(self, digits: int = 4) -> dict[str, float]:
        return {f.name: round(getattr(self, f.name), digits) for f in fields(self)}


__all__ = ["DrafterStats", "DrafterTimes", "source_shares"]
