"""The prompts `GroupDrafter` holds: each one's state (`PromptState`: history, tree), the
trees built (in LRU order), the global tree, and what leaves them off the critical path.

- History. `history_steps` makes a list of responses a prompt's history, changing only the
  responses that changed (same tokens, same weight: kept in the trees); the newest enter
  the global tree up to `global_tokens_per_prompt` tokens a prompt. History is kept in
  compact form (int32 arrays); a prompt's tree is built when one of its requests first
  drafts (`tree_of`) or ahead, for the next step (`prepare_steps`).
- Memory. Trees of prompts with no request in the current group are kept in LRU order up to
  `max_cached_prompts` and then freed (`evict`); `prepare_steps` frees every prompt but
  the next step's (`retain_steps`), keeping only what the global tree holds of it.
- Ended groups. The live sequences of a group that ended are marked stale
  (`end_group`) and leave the prompt tree a little at a time (`janitor_steps`, after a
  pass) or all at once (`cleanup_steps`, after a step; and before a new request of the
  prompt starts, `remove_stale`). Their global sequences go at once: other prompts draft
  from that tree. Freed trees are destroyed a step at a time (`bury`): tens of ms for a
  large tree.

The `*_steps` methods are generators: `pipeline.drafting.background` runs them a step at a
time in its thread (holding the GIL only in short steps), and the drafter runs them to the
end inline where it must. Pure logic over `pipeline.drafting.suffix_tree`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Mapping, Sequence

import numpy as np

from pipeline.drafting.global_tree import GlobalTree
from pipeline.drafting.inputs import DrafterConfig, HistoryResponse, reward_copies
from pipeline.drafting.live import LiveRequest, LiveSet
from pipeline.drafting.prompt_state import HistoryEntry, PromptState
from pipeline.drafting.stats import DrafterTimes
from pipeline.drafting.suffix_tree import SuffixTree
from pipeline.history.lengths import LengthEvidence

HistoryLookup = Callable[[list[str]], Mapping[str, Sequence[HistoryResponse]]]


class PromptTable:
    """Prompt states by key (`prompt_hash`), their trees and the global tree."""

    def __init__(self, config: DrafterConfig, live: LiveSet, lengths: LengthEvidence,
                 times: DrafterTimes):
        self.config = config
        self.prompts: dict[str, PromptState] = {}
        self.trees: OrderedDict[str, None] = OrderedDict()  # prompts with a tree, LRU first
        self.global_tree = GlobalTree(config.max_depth, config.max_global_responses,
                                      config.max_global_tokens)
        self.stale: OrderedDict[str, None] = OrderedDict()  # prompts with ended sequences
        self.graveyard: list[SuffixTree] = []  # freed trees, destroyed off the critical path
        self._live = live
        self._lengths = lengths
        self._times = times

    # -- prompts and trees ------------------------------------------------------------
    def get(self, key: str) -> PromptState:
        """The prompt's state (made empty if new)."""
        p = self.prompts.get(key)
        if p is None:
            p = self.prompts[key] = PromptState(key)
        return p

    def tree_of(self, p: PromptState) -> SuffixTree:
        """The prompt's tree, built now if not held; it becomes the most recently used."""
        if p.tree is None:
            p.build_tree(self.config.max_depth)
            self.trees[p.key] = None
            self.evict()
        self.trees.move_to_end(p.key)
        return p.tree

    def evict(self) -> None:
        """Free LRU trees beyond the cap; prompts with requests in their group stay."""
        excess = len(self.trees) - self.config.max_cached_prompts
        for key in list(self.trees):
            if excess <= 0:
                break
            p = self.prompts[key]
            if self._live.members(key):
                continue
            self.stale.pop(key, None)
            self.graveyard.append(p.free_tree())
            del self.trees[key]
            excess -= 1

    # -- history ----------------------------------------------------------------------
    def history_steps(self, key: str, responses: Sequence[HistoryResponse]):
        """Make `responses` the prompt's history (see the module docstring)."""
        # Lengths are evidence for the budget whether or not the tokens are drafted from.
        per_epoch: dict[int, list[int]] = {}
        for r in responses:
            per_epoch.setdefault(r.epoch, []).append(len(r.token_ids))
        self._lengths.set_history(key, per_epoch)
        if not self.config.use_history:
            return
        p = self.get(key)
        copies = reward_copies(responses, self.config)
        old: dict[tuple[bytes, int], list[HistoryEntry]] = {}
        for h in p.history:
            old.setdefault((h.tokens.tobytes(), h.copies), []).append(h)
        history, new = [], set()
        for r, c in zip(responses, copies):
            tokens = np.asarray(r.token_ids, dtype=np.int32)
            kept = old.get((tokens.tobytes(), c))
            if kept:
                history.append(kept.pop())
            else:
                history.append(HistoryEntry(tokens, c))
                new.add(id(history[-1]))
        # the newest responses enter the global tree, up to the prompt's quota of tokens
        quota, to_global = self.config.global_tokens_per_prompt, set()
        for h in reversed(history):
            if h.global_seqs or (id(h) in new and len(h.tokens) <= quota):
                quota -= len(h.tokens)
                to_global.add(id(h))
        for h in history:
            if id(h) not in new:
                continue  # held already
            if p.tree is not None:
                yield from p.insert_steps(h)
            if self.config.use_global and id(h) in to_global:
                yield from self.global_tree.add_history_steps(h.tokens, h.copies, h.global_seqs)
        for stale in old.values():  # (after the inserts, as the recorded runs did)
            for h in stale:
                self._remove_history(p, h)
        p.history = history
        self.global_tree.cap()

    def prepare_steps(self, keys: list[str], retained: set[str], history: HistoryLookup):
        """Free every prompt but `retained` (and those with live requests), then load the
        history `history(keys)` returns for `keys` and build their trees."""
        yield from self.retain_steps(retained)
        found = history(keys) if keys else {}
        yield
        depth = self.config.max_depth
        for key in keys:
            if key in found:
                yield from self.history_steps(key, found[key])
            p = self.prompts[key]
            if p.tree is None and self.config.use_history:
                yield from p.build_steps(depth)
                self.trees[key] = None
        self.evict()
        yield from self.bury()

    def park_history_steps(self, keys: list[str], history: HistoryLookup):
        """History of prompts not held (a step's own, remembered after `prepare_steps`
        freed them): only the share that enters the global tree is kept, as freeing would
        keep it, so that prompts without history of their own draft from it before these
        come back (in a run's first epoch, every prompt). Held prompts are left alone."""
        if not (self.config.use_global and self.config.use_history):
            return
        keys = [k for k in keys if k not in self.prompts or self.prompts[k].parked]
        found = history(keys) if keys else {}
        yield
        for key in keys:
            if key not in found:
                continue
            yield from self.history_steps(key, found[key])
            p = self.prompts[key]
            p.history = [h for h in p.history if h.global_seqs]  # the rest: in the history window
            p.parked = True
            if not p.history:
                del self.prompts[key]

    def retain_steps(self, keep: set[str]):
        """Free every prompt but `keep` and those with live requests: its tree, and its
        history but the responses the global tree holds (bounded by that tree's cap;
        kept so that the prompt's next load finds them there, not twice)."""
        for key in [k for k in self.prompts if k not in keep and not self._live.members(k)]:
            p = self.prompts[key]
            self.trees.pop(key, None)
            self.stale.pop(key, None)
            tree = p.free_tree()
            p.history = [h for h in p.history if h.global_seqs]
            p.parked = True
            if not p.history:
                del self.prompts[key]
            yield
            del tree  # destroyed here, in this (background) step
            yield
        for key in keep:
            p = self.prompts.get(key)
            if p is not None:
                p.parked = False

    def _remove_history(self, p: PromptState, h: HistoryEntry) -> None:
        p.remove(h)
        self.global_tree.remove(h.global_seqs)
        h.global_seqs = []

    # -- live sequences ---------------------------------------------------------------
    def drop_sequences(self, p: PromptState, m: LiveRequest) -> None:
        """A request that left its group: its live sequences leave the trees."""
        if m.local_seq is not None and p.tree is not None:
            p.tree.remove(m.local_seq)
        if m.global_seq is not None:
            self.global_tree.remove((m.global_seq,))

    def end_group(self, key: str, members: list[LiveRequest]) -> None:
        """The group's live sequences are marked stale: they leave the prompt tree in the
        background (no request of the prompt drafts until a new one starts, which removes
        them first). Their global sequences (global_live) go at once."""
        if members:
            self._lengths.end_group(key)
        t0 = time.perf_counter()
        p = self.prompts[key]
        for m in members:
            if m.local_seq is not None and p.tree is not None:
                p.stale.append(m.local_seq)
            if m.global_seq is not None:
                self.global_tree.remove((m.global_seq,))
        if p.stale:
            self.stale[key] = None
        self._times.group_ends += time.perf_counter() - t0

    def remove_stale(self, p: PromptState) -> None:
        """All of the prompt's ended sequences out now (a new group is starting)."""
        t0 = time.perf_counter()
        p.remove_stale()
        self.stale.pop(p.key, None)
        self._times.group_ends += time.perf_counter() - t0

    def janitor_steps(self, tokens: int):
        """Ended sequences out, oldest prompt first, until about `tokens` tokens left."""
        while self.stale and tokens > 0:
            p = self.prompts.get(next(iter(self.stale)))
            t0 = time.perf_counter()
            tokens -= p.remove_stale(limit=1) if p is not None else 0
            self._times.group_ends += time.perf_counter() - t0
            if p is None or not p.stale:
                self.stale.popitem(last=False)
            yield

    def cleanup_steps(self):
        """Every ended sequence out, every freed tree destroyed (after a step)."""
        while self.stale:
            key, _ = self.stale.popitem(last=False)
            p = self.prompts.get(key)
            while p is not None and p.stale:
                t0 = time.perf_counter()
                p.remove_stale(limit=1)
                self._times.group_ends += time.perf_counter() - t0
                yield
        yield from self.bury()

    def bury(self):
        """Destroy the freed trees, one a step."""
        while self.graveyard:
            tree = self.graveyard.pop()
            del tree  # the C++ tree is destroyed here
            yield

    # -- reading ----------------------------------------------------------------------
    def history_prompts(self) -> int:
        """Prompts with history held (freed ones excepted)."""
        return sum(1 for p in self.prompts.values() if p.history and not p.parked)

    def memory_bytes(self, own_trees: Sequence[SuffixTree] = ()) -> int:
        """The held trees' estimate of their memory (plus `own_trees`) and the global
        tree's."""
        trees = [self.prompts[k].tree for k in self.trees] + list(own_trees)
        return sum(t.memory_bytes() for t in trees) + self.global_tree.memory_bytes()


__all__ = ["HistoryLookup", "PromptTable"]
