"""The one module that touches arctic-inference: a thin wrapper over its C++ suffix tree.

`arctic_inference.suffix_decoding._C.SuffixTree` (the tree behind vLLM's `suffix` method)
holds many token sequences, each under an int32 sequence id, and indexes every suffix of
each up to `max_depth` tokens. `speculate` finds, for every suffix length of the context
that occurs in the tree, the most frequent continuation (always following the child with
the highest count) and stops where the path probability — the product of
count(child) / count(parent) along the path — falls below `min_path_prob`; it returns the
best of those drafts by score, the sum of the per-token path probabilities, i.e. the
expected number of accepted tokens if the tree's frequencies were the target's. Read in
`arctic_inference/csrc/suffix_decoding/suffix_tree.cc` (`speculate`, `_speculate_path`).

The wrapper hands the C++ side contiguous int32 arrays (its zero-copy overloads) and turns
its `Draft` into a plain dataclass, so the rest of `pipeline.drafting` never sees arctic types.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from arctic_inference.suffix_decoding._C import SuffixTree as _CSuffixTree

TokenIds = Sequence[int] | np.ndarray


class Draft:
    """A speculated continuation.

    token_ids: drafted tokens, in order; probs[i]: path probability of token_ids[:i+1]
    under the tree's counts (non-increasing, in (0, 1]); score: sum(probs), the expected
    number of accepted tokens; match_len: tokens of the context that matched. Treated as
    immutable (a plain slotted class: made once per drafted request and pass, where a
    frozen dataclass's setattr calls cost as much as the C++ query).
    """

    __slots__ = ("token_ids", "probs", "score", "match_len")

    def __init__(self, token_ids: list[int] | None = None, probs: list[float] | None = None,
                 score: float = 0.0, match_len: int = 0):
        self.token_ids = [] if token_ids is None else token_ids
        self.probs = [] if probs is None else probs
        self.score = score
        self.match_len = match_len

    def __len__(self) -> int:
        return len(self.token_ids)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Draft):
            return NotImplemented
        return (self.token_ids, self.probs, self.score, self.match_len) == \
            (other.token_ids, other.probs, other.score, other.match_len)

    __hash__ = None

    def __repr__(self) -> str:
        return (f"Draft(token_ids={self.token_ids}, probs={self.probs}, score={self.score}, "
                f"match_len={self.match_len})")


EMPTY_DRAFT = Draft()


def as_int32(tokens: TokenIds) -> np.ndarray:
    """Contiguous, writable 1-D int32 view or copy, as the C++ overloads require (nanobind
    refuses read-only arrays, such as views of Arrow buffers)."""
    arr = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
    return arr if arr.flags.writeable else arr.copy()


def match_needed(max_tokens: int, max_spec_factor: float, max_spec_offset: float,
                 max_depth: int) -> int:
    """The longest suffix match worth asking for a draft of `max_tokens` tokens.

    A match of m tokens drafts at most min(max_tokens, factor * m + offset) tokens, and at
    most max_depth - m (a tree holds suffixes of max_depth tokens). So matches longer than
    the shortest one that allows max_tokens draft no more tokens; they may only score a
    shorter continuation higher. Every match is walked from the root, so a query costs
    about the square of its context's length: a draft needs only the newest
    `match_needed(...) + 1` context tokens (`pipeline.drafting.query`).
    """
    if max_spec_factor <= 0:
        return max_depth
    m = math.ceil((max_tokens - max_spec_offset) / max_spec_factor - 1e-6)
    return max(1, min(max_depth, m))


class SuffixTree:
    """Sequences under int ids; `speculate` drafts from all of them at once.

    Sequence ids are non-negative int32; `extend` on an unknown id starts that sequence.
    """

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self._tree = _CSuffixTree(max_depth)
        self._lengths: dict[int, int] = {}
        self.version = 0  # bumped by every change: equal versions, equal drafts

    def extend(self, seq_id: int, tokens: TokenIds) -> None:
        """Append tokens to sequence `seq_id` (created if new)."""
        n = len(tokens)
        self._lengths[seq_id] = self._lengths.get(seq_id, 0) + n
        if not n:
            return
        self.version += 1
        if isinstance(tokens, np.ndarray):
            self._tree.extend_ndarray(seq_id, as_int32(tokens))
        else:  # short Python lists convert faster than an ndarray round trip
            self._tree.extend(seq_id, tokens)

    def remove(self, seq_id: int) -> None:
        """Forget sequence `seq_id`; unknown ids are ignored."""
        if self._lengths.pop(seq_id, None) is not None:
            self.version += 1
            self._tree.remove(seq_id)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._lengths

    def length(self, seq_id: int) -> int:
        """Tokens sequence `seq_id` holds (0 for an unknown id)."""
        return self._lengths.get(seq_id, 0)

    @property
    def num_seqs(self) -> int:
        return len(self._lengths)

    def memory_bytes(self) -> int:
        """The C++ side's own estimate of its memory use."""
        return int(self._tree.estimate_memory())

    def speculate(self, context: TokenIds, max_tokens: int, min_path_prob: float,
                  max_spec_factor: float, max_spec_offset: float = 0.0) -> Draft:
        """Most frequent continuation of the best-matching suffix of `context`.

        The draft holds at most min(max_tokens, max_spec_factor * match_len +
        max_spec_offset) tokens and stops before the path probability drops below
        `min_path_prob`. Suffixes of 1 .. max_depth tokens are matched; the C++ side
        never matches the whole context it is given, so a context of fewer than 2 tokens
        drafts nothing.
        """
        if max_tokens <= 0 or not self._lengths:
            return EMPTY_DRAFT
        # The C++ loop matches suffixes of length 1 .. len(context) - 1; one extra token
        # lets suffixes of the full tree depth match.
        ctx = context[-(self.max_depth + 1):]
        if isinstance(ctx, np.ndarray):
            d = self._tree.speculate_ndarray(as_int32(ctx), int(max_tokens),
                                             float(max_spec_factor), float(max_spec_offset),
                                             float(min_path_prob), False)
        else:
            d = self._tree.speculate(ctx, max_tokens, max_spec_factor, max_spec_offset,
                                     min_path_prob, False)
        tokens = d.token_ids  # (a new list at every read)
        if not tokens:
            return EMPTY_DRAFT
        return Draft(tokens, d.probs, d.score, d.match_len)


__all__ = ["Draft", "EMPTY_DRAFT", "SuffixTree", "as_int32", "match_needed"]
