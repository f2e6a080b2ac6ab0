"""What the drafter keeps per prompt: its token ids, its history responses in compact form
(int32 arrays) and, while held, its suffix tree.

A prompt tree holds the full prompt (sequence `PROMPT_SEQ`), every history response
preceded by the prompt's last `max_depth` tokens (so the first response tokens can be
drafted), `copies` times each, and, with siblings on, the live responses of its group
(whose sequence ids the drafter takes from `next_seq`). A tree can be freed at any time
and rebuilt from the prompt and its history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.drafting.suffix_tree import SuffixTree

PROMPT_SEQ = 0  # sequence id of the full prompt in its prompt tree


@dataclass(eq=False)
class HistoryEntry:
    tokens: np.ndarray  # int32
    copies: int
    local_seqs: list[int] = field(default_factory=list)  # in the prompt tree, once built
    global_seqs: list[int] = field(default_factory=list)  # in the drafter's global tree


@dataclass(eq=False)
class PromptState:
    key: str
    prompt_ids: list[int] | None = None  # known once a request of the prompt starts
    history: list[HistoryEntry] = field(default_factory=list)
    tree: SuffixTree | None = None
    next_seq: int = PROMPT_SEQ + 1
    fed: int = -1  # the drafter's LiveSet.version when its group last fed the tree
    # the last draft from this prompt's trees: ((tree version, global tree version),
    # max_tokens, context, draft, source); a sibling with the same context in the same tree
    # state gets the same draft without asking the trees again
    last: tuple | None = None

    def build_tree(self, max_depth: int) -> SuffixTree:
        """The prompt's tree with its prompt and history (built now if not held)."""
        if self.tree is None:
            self.tree, self.last, self.fed = SuffixTree(max_depth), None, -1
            self.tree.extend(PROMPT_SEQ, self.prompt_ids)
            for h in self.history:
                self.insert(h)
        return self.tree

    def insert(self, h: HistoryEntry) -> None:
        """History response in the held tree: prompt tail + response, `copies` times."""
        depth = self.tree.max_depth
        tokens = np.concatenate([np.asarray(self.prompt_ids[-depth:], dtype=np.int32), h.tokens])
        for _ in range(h.copies):
            self.tree.extend(self.next_seq, tokens)
            h.local_seqs.append(self.next_seq)
            self.next_seq += 1

    def remove(self, h: HistoryEntry) -> None:
        """History response out of the held tree (if any)."""
        if self.tree is not None:
            for seq in h.local_seqs:
                self.tree.remove(seq)
        h.local_seqs = []

    def free_tree(self) -> None:
        self.tree, self.last, self.fed = None, None, -1
        for h in self.history:
            h.local_seqs = []


__all__ = ["HistoryEntry", "PROMPT_SEQ", "PromptState"]
