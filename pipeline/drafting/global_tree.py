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
        self._fifo: OrderedDict[int, tuple[list[int], np.ndarray]] = OrderedDict()
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
            self._fifo[seq] = (owner, tokens)
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
                self.history_tokens -= len(entry[1])

    def cap(self) -> None:
        """Drop the oldest history sequences beyond `max_responses` or `max_tokens`."""
        while self._fifo and (len(self._fifo) > self.max_responses
                              or self.history_tokens > self.max_tokens):
            seq, (owner, tokens) = self._fifo.popitem(last=False)
            self.history_tokens -= len(tokens)
            self.tree.remove(seq)
            owner.remove(seq)

    def history(self) -> list[tuple[list[int], np.ndarray]]:
        """The history sequences held, oldest first: (owner's id list, tokens)."""
        return list(self._fifo.values())

    def rebuild(self, history: Iterable[tuple[list[int], np.ndarray]] | None = None) -> None:
        """A new tree holding the history sequences alone, inserted oldest first: `history`
        ((owner, tokens), oldest first; each gets a new id, appended to its owner's list),
        or the ones held (their ids kept). A suffix tree breaks ties between children of
        equal count by the order its counts changed in, so a tree that saw removals can
        draft otherwise than one built from what it holds; rebuilt trees draft alike
        whatever came before (live sequences must have left: none is running)."""
        old, self.tree = self.tree, SuffixTree(self.tree.max_depth)
        self.tree.version = old.version + 1  # memoised drafts of the old tree never match
        if history is not None:
            self._fifo.clear()
            self.history_tokens = 0
            for owner, tokens in history:
                seq = self._new_seq()
                self._fifo[seq] = (owner, tokens)
                self.history_tokens += len(tokens)
                owner.append(seq)
        for seq, (_, tokens) in self._fifo.items():
            self.tree.extend(seq, tokens)

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
