"""What the drafter keeps per prompt: its token ids, its history responses in compact form
(int32 arrays) and, while held, its suffix tree.

A prompt tree holds the full prompt (sequence `PROMPT_SEQ`), every history response
preceded by the prompt's last `max_depth` tokens (so the first response tokens can be
drafted), `copies` times each, and, with siblings on, the live responses of its group
(`feed`, with sequence ids from `next_seq`). A tree can be freed once its group has ended
and rebuilt from the prompt and its history. Building goes `BUILD_CHUNK` tokens per tree
call (`build_steps`, `insert_steps`), so a background build holds the GIL in short steps;
the tree is the same as one built in one call per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pipeline.drafting.live import LiveRequest, LiveState
from pipeline.drafting.suffix_tree import Draft, SuffixTree

PROMPT_SEQ = 0  # sequence id of the full prompt in its prompt tree
BUILD_CHUNK = 4096  # tokens per tree call while building (a few ms of C++ each)


class LastDraft(NamedTuple):
    """A prompt's last draft from its trees and what it was drafted from: a sibling asking
    with the same context and cap while the trees are unchanged gets the same draft."""

    versions: tuple[int, int, bool]  # (prompt tree version, global tree version, chained)
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
    fed_end: int = -1  # ... and when it last fed running members to their end
    last: LastDraft | None = None  # its trees' last draft (a sibling may reuse it)
    stale: list[int] = field(default_factory=list)  # ended live sequences still in the tree
    parked: bool = False  # freed: only its responses in the global tree are kept

    def build_tree(self, max_depth: int) -> SuffixTree:
        """The prompt's tree with its prompt and history (built now if not held)."""
        for _ in self.build_steps(max_depth):
            pass
        return self.tree

    def build_steps(self, max_depth: int):
        """`build_tree` one tree call at a time (a generator; the tree is `self.tree` from
        the first step on, complete after the last)."""
        if self.tree is not None:
            return
        self.tree, self.last, self.fed, self.fed_end = SuffixTree(max_depth), None, -1, -1
        self.tree.extend(PROMPT_SEQ, self.prompt_ids)
        yield
        for h in self.history:
            yield from self.insert_steps(h)

    def insert(self, h: HistoryEntry) -> None:
        """History response in the held tree: prompt tail + response, `copies` times."""
        for _ in self.insert_steps(h):
            pass

    def insert_steps(self, h: HistoryEntry):
        """`insert`, one tree call of at most `BUILD_CHUNK` tokens at a time."""
        depth = self.tree.max_depth
        tokens = np.concatenate([np.asarray(self.prompt_ids[-depth:], dtype=np.int32), h.tokens])
        for _ in range(h.copies):
            seq = self.next_seq
            h.local_seqs.append(seq)
            self.next_seq += 1
            for a in range(0, len(tokens), BUILD_CHUNK):
                self.tree.extend(seq, tokens[a:a + BUILD_CHUNK])
                yield

    def feed(self, members: list[LiveRequest], version: int, to_end: bool = False) -> None:
        """Give the held tree what its group's members generated since it last got
        anything: running members up to their previous pass (the drafter's module
        docstring says why), finished ones in full. `version` is the live set's
        (`LiveSet.version`): at the same version there is nothing new to take.

        to_end: running members up to their end too — done after a pass, off the critical
        path, it is exactly what the next pass's drafts take (their previous pass then)."""
        if (self.fed_end if to_end else self.fed) == version:
            return
        self.fed, tree = version, self.tree
        if to_end:
            self.fed_end = version
        running = LiveState.RUNNING
        for m in members:
            pos, stop = m.local_pos, m.pending if m.state is running and not to_end else m.end
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

    def remove_stale(self, limit: int | None = None) -> int:
        """Ended live sequences out of the held tree, the oldest first, at most `limit`
        (all when None). Returns the tokens removed."""
        tree, removed = self.tree, 0
        n = len(self.stale) if limit is None else min(limit, len(self.stale))
        for seq in self.stale[:n]:
            if tree is not None:
                removed += tree.length(seq)
                tree.remove(seq)
        del self.stale[:n]
        return removed

    def free_tree(self) -> SuffixTree | None:
        """Forget the tree; returns it (the caller decides where it is destroyed)."""
        tree = self.tree
        self.tree, self.last, self.fed, self.fed_end, self.stale = None, None, -1, -1, []
        for h in self.history:
            h.local_seqs = []
        return tree


__all__ = ["HistoryEntry", "LastDraft", "PROMPT_SEQ", "PromptState"]
