"""The drafter's global tree: one suffix tree over the prompts' history responses (FIFO-
capped at `max_responses` responses and `max_tokens` tokens) and, when live responses are
shared across prompts, the running requests' outputs. The format shared across prompts is
often the predictable part.

Sequences get int32 ids from one wrapping counter. A history response may enter the tree
several times (reward-weighted copies); its owner keeps the list of its sequence ids, and
the cap removes the oldest sequences first, from the tree and from their owner's list.
The token cap keeps the tree's memory (about 250 bytes a token) independent of response
lengths: 10,000 responses of 8k tokens would be 80M tokens, some 20 GB.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

import numpy as np

from pipeline.drafting.live import LiveRequest
from pipeline.drafting.suffix_tree import Draft, SuffixTree


class GlobalTree:
    """History of all prompts plus, optionally, live responses, in one suffix tree."""

    def __init__(self, max_depth: int, max_responses: int, max_tokens: int):
        self.tree = SuffixTree(max_depth)
        self.max_responses = max_responses
        self.max_tokens = max_tokens
        # history seq -> its owner's ids and its tokens, oldest first
        self._fifo: OrderedDict[int, tuple[list[int], int]] = OrderedDict()
        self.history_tokens = 0
        self._next = 0

    def add_history(self, tokens: np.ndarray, copies: int, owner: list[int]) -> None:
        """Insert a history response `copies` times; its sequence ids are appended to
        `owner` (the caller's list, emptied again by `remove` or the cap)."""
        for _ in self.add_history_steps(tokens, copies, owner):
            pass

    def add_history_steps(self, tokens: np.ndarray, copies: int, owner: list[int],
                          chunk: int = 4096):
        """`add_history`, one tree call of at most `chunk` tokens at a time (a generator)."""
        for _ in range(copies):
            seq = self._new_seq()
            self._fifo[seq] = (owner, len(tokens))
            self.history_tokens += len(tokens)
            owner.append(seq)
            for a in range(0, len(tokens), chunk):
                self.tree.extend(seq, tokens[a:a + chunk])
                yield

    def remove(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            self.tree.remove(seq)
            entry = self._fifo.pop(seq, None)
            if entry is not None:
                self.history_tokens -= entry[1]

    def cap(self) -> None:
        """Drop the oldest history sequences beyond `max_responses` or `max_tokens`."""
        while self._fifo and (len(self._fifo) > self.max_responses
                              or self.history_tokens > self.max_tokens):
            seq, (owner, n) = self._fifo.popitem(last=False)
            self.history_tokens -= n
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
