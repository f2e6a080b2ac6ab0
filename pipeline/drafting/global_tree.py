"""The drafter's global tree: one suffix tree over every prompt's history responses (FIFO-
capped at `max_responses`) and, when live responses are shared across prompts, the
running requests' outputs. The format shared across prompts is often the predictable part.

Sequences get int32 ids from one wrapping counter. A history response may enter the tree
several times (reward-weighted copies); its owner keeps the list of its sequence ids, and
the cap removes the oldest sequences first, from the tree and from their owner's list.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

import numpy as np

from pipeline.drafting.live import LiveRequest
from pipeline.drafting.suffix_tree import Draft, SuffixTree


class GlobalTree:
    """History of all prompts plus, optionally, live responses, in one suffix tree."""

    def __init__(self, max_depth: int, max_responses: int):
        self.tree = SuffixTree(max_depth)
        self.max_responses = max_responses
        self._fifo: OrderedDict[int, list[int]] = OrderedDict()  # history seq -> its owner's ids
        self._next = 0

    def add_history(self, tokens: np.ndarray, copies: int, owner: list[int]) -> None:
        """Insert a history response `copies` times; its sequence ids are appended to
        `owner` (the caller's list, emptied again by `remove` or the cap)."""
        for _ in range(copies):
            seq = self._new_seq()
            self.tree.extend(seq, tokens)
            self._fifo[seq] = owner
            owner.append(seq)

    def remove(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            self.tree.remove(seq)
            self._fifo.pop(seq, None)

    def cap(self) -> None:
        """Drop the oldest history sequences beyond `max_responses`."""
        while len(self._fifo) > self.max_responses:
            seq, owner = self._fifo.popitem(last=False)
            self.tree.remove(seq)
            owner.remove(seq)

    def flush(self, live: Iterable[LiveRequest]) -> None:
        """Append the tokens these live requests generated since the tree last saw them."""
        for m in live:
            if m.global_seq is None:
                m.global_seq = self._new_seq()
            self.tree.extend(m.global_seq, m.since(m.global_pos))
            m.global_pos = m.end
            m.trim()

    def speculate(self, *args) -> Draft:
        return self.tree.speculate(*args)

    @property
    def num_seqs(self) -> int:
        return self.tree.num_seqs

    def memory_bytes(self) -> int:
        return self.tree.memory_bytes()

    def _new_seq(self) -> int:
        seq = self._next
        self._next = (self._next + 1) & 0x7FFFFFFF
        return seq


__all__ = ["GlobalTree"]
