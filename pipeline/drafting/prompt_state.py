"""What the drafter keeps per prompt: its token ids, its history responses in compact form
(int32 arrays) and, while held, its suffix tree.

A prompt tree holds the full prompt (sequence `PROMPT_SEQ`), every history response
preceded by the prompt's last `max_depth` tokens (so the first response tokens can be
drafted), `copies` times each, and, with siblings on, the live responses of its group
(`feed`, with sequence ids from `next_seq`). A tree can be freed once its group has ended
and rebuilt from the prompt and its history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pipeline.drafting.live import LiveRequest, LiveState
from pipeline.drafting.suffix_tree import Draft, SuffixTree

PROMPT_SEQ = 0  # sequence id of the full prompt in its prompt tree


class LastDraft(NamedTuple):
    """A prompt's last draft from its trees and what it was drafted from: a sibling asking
    with the same context and cap while the trees are unchanged gets the same draft."""

    versions: tuple[int, int]  # (prompt tree version, global tree version)
    max_tokens: int
    context: list[int]
    draft: Draft
    source: str  # the tree that served it


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
    last: LastDraft | None = None  # its trees' last draft (a sibling may reuse it)

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

    def feed(self, members: list[LiveRequest], version: int) -> None:
        """Give the held tree what its group's members generated since it last got
        anything: running members up to their previous pass (the drafter's module
        docstring says why), finished ones in full. `version` is the live set's
        (`LiveSet.version`): at the same version there is nothing new to take."""
        if self.fed == version:
            return
        self.fed, tree = version, self.tree
        for m in members:
            pos, stop = m.local_pos, m.pending if m.state is LiveState.RUNNING else m.end
            if pos is not None and pos < stop:
                if m.local_seq is None:
                    m.local_seq, self.next_seq = self.next_seq, self.next_seq + 1
                tree.extend(m.local_seq, m.since(pos, stop))
                m.local_pos = stop
                m.trim()

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


__all__ = ["HistoryEntry", "LastDraft", "PROMPT_SEQ", "PromptState"]
