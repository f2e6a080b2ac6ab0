"""Drafting from history and live siblings: one suffix tree per prompt, plus a global one.

RhymeRL's HistoSpec drafts from the same prompt's responses in earlier epochs; Seer drafts
from the in-flight responses of the same GRPO group. `GroupDrafter` does both, in one
structure, independent of vLLM (the proposer in `pipeline.rollout.proposer` feeds it):

- per prompt (keyed by `prompt_hash` of its token ids, as the history store keys rows),
  one tree holding the full prompt, the prompt's history (the last K epochs' responses,
  each preceded by the prompt's last `max_depth` tokens so the first response tokens can
  be drafted) and, with siblings on, the live responses of its group as they grow;
- per request, when siblings are off, a small tree of its own prompt and output (self
  drafting, as vLLM's suffix method's local tree);
- one global tree over all prompts' history (FIFO-capped) and, optionally, all live
  responses (`pipeline.drafting.global_tree`).

`draft` asks each tree for the most frequent continuation of the longest matching suffix,
cut where the path probability falls below `min_path_prob`, and keeps the best-scoring draft
(score = expected accepted tokens); ties go to the prompt's own tree. The global tree is
asked only when the prompt's own trees offer nothing (`global_fallback`, default): at T = 1
a global draft that outscored the prompt's own displaced better ones (its counts, pooled
over prompts, look sure for patterns this prompt does not follow). Measured on the sort task
at T = 1: 820 passes instead of 858, 9 % fewer draft tokens and about 20 % less drafter
time; at T = 0 the same passes (docs/speculation.md). arctic-inference's cache keeps the
best of both.

Costs. Appending a token to a C++ tree costs microseconds, a whole history hundreds of
them, and in a full batch the budget grants few drafts. So live tokens wait in Python
lists (`pipeline.drafting.live` keeps the running requests and their groups) and enter a tree
only when a request that reads it drafts; a prompt's tree is built when one of its
requests first drafts; `set_history` changes only the responses that changed; a tree is
not asked when the draft in hand cannot be beaten (max_tokens tokens, all at probability 1).
A group feeds its prompt's tree once per change of the live set (`LiveSet.version`), not
once per drafting sibling; and a sibling whose context, cap and trees (`SuffixTree.version`)
are those of the prompt's last draft gets that draft without asking the trees: at T = 0 all
siblings are in the same state, at any temperature their first tokens. Replaying the
drafter calls of real runs (same drafts, call for call): 24 % less drafter time at T = 0,
6-9 % at T = 0.6 and T = 1 (docs/speculation.md, "Siblings share work").

A running response enters its prompt's tree up to the end of its previous pass: the
newest tokens are held back. GRPO siblings start together and advance in near lockstep,
so a sibling's sequence (and the request's own) would end exactly where the drafting
request's context ends; each such sequence adds a count with no continuation to every
matched node and dilutes every draft. Measured on the sort task (T = 1, 128 sequences per
step): holding back the newest tokens of all running members cut rollout time 19 %
against feeding them at once (docs/speculation.md), and the prompt trees served 69 % of
drafts instead of 39 %. A finished sibling enters in full.

Live responses stay in their prompt's tree until the whole group has finished (a finished
sibling still predicts the stragglers), then they are dropped: after the step the loop
feeds them back as history through `set_history`. Trees of prompts with no request in the
current group are kept in LRU order up to `max_cached_prompts` and then freed; their
history stays in compact form (int32 arrays) and the tree is rebuilt on its next draft.
"""

from __future__ import annotations

from collections import OrderedDict
import time
from dataclasses import replace
from typing import Hashable, Sequence

import numpy as np

from pipeline.history.store import prompt_hash
from pipeline.drafting.global_tree import GlobalTree
from pipeline.drafting.inputs import DrafterConfig, HistoryResponse, reward_copies
from pipeline.drafting.live import LiveRequest, LiveSet
from pipeline.drafting.prompt_state import HistoryEntry, LastDraft, PromptState
from pipeline.drafting.remaining import RemainingTracker
from pipeline.drafting.stats import DrafterStats, DrafterTimes, source_shares
from pipeline.drafting.suffix_tree import EMPTY_DRAFT, Draft, SuffixTree

class GroupDrafter:
    """History + sibling + self drafting for the requests of one rollout engine."""

    def __init__(self, config: DrafterConfig = DrafterConfig()):
        self.config = config
        self._prompts: dict[str, PromptState] = {}
        self._trees: OrderedDict[str, None] = OrderedDict()  # prompts with a tree, LRU first
        self._live = LiveSet(config.max_depth, config.use_siblings,
                             config.use_global and config.global_live)
        self._global = GlobalTree(config.max_depth, config.max_global_responses)
        self._drafts = 0
        self._drafted_tokens = 0
        self._wins = {"prompt": 0, "own": 0, "global": 0}
        self.lengths = RemainingTracker()  # length evidence: history + finished siblings
        self._times = DrafterTimes()

    # -- history ----------------------------------------------------------------------
    def set_history(self, key: str, responses: Sequence[HistoryResponse]) -> None:
        """Make `responses` the history of prompt `key` (its `prompt_hash`).

        Responses already held (same tokens, same weight) stay in the trees; only the
        others are removed or inserted.
        """
        # Lengths are evidence for the budget whether or not the tokens are drafted from.
        self.lengths.set_history(key, [len(r.token_ids) for r in responses])
        if not self.config.use_history:
            return
        p = self._prompt(key)
        copies = reward_copies(responses, self.config)
        old: dict[tuple[bytes, int], list[HistoryEntry]] = {}
        for h in p.history:
            old.setdefault((h.tokens.tobytes(), h.copies), []).append(h)
        history = []
        for r, c in zip(responses, copies):
            tokens = np.asarray(r.token_ids, dtype=np.int32)
            kept = old.get((tokens.tobytes(), c))
            history.append(kept.pop() if kept else self._add_history(p, tokens, c))
        for stale in old.values():
            for h in stale:
                self._remove_history(p, h)
        p.history = history
        self._global.cap()

    def history_of(self, key: str) -> list[list[int]]:
        p = self._prompts.get(key)
        return [] if p is None else [h.tokens.tolist() for h in p.history]

    # -- live requests ----------------------------------------------------------------
    def expect_group(self, prompt_ids: Sequence[int], n: int) -> None:
        """Announce that `n` requests of this prompt form one group (optional).

        Without it a group ends when none of its requests is running, which can be too
        early if some siblings are still waiting for a slot.
        """
        key = prompt_hash(prompt_ids)
        self._prompt(key)
        self._live.expect(key, n)

    def start(self, req_id: Hashable, prompt_ids: Sequence[int],
              output_ids: Sequence[int] = ()) -> str:
        """Register a running request (or a resumed one, with its output so far).

        Returns the prompt key.
        """
        if req_id in self._live.running:
            raise ValueError(f"request {req_id!r} is already running")
        key = prompt_hash(prompt_ids)
        p = self._prompt(key)
        if p.prompt_ids is None:
            p.prompt_ids = [int(t) for t in prompt_ids]
        _, replaced = self._live.start(req_id, key, p.prompt_ids,
                                       [int(t) for t in output_ids])
        for old in replaced:  # resumed after preemption
            self._drop_sequences(p, old)
        if p.tree is not None:
            self._trees.move_to_end(key)
        return key

    def append(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        """Tokens the request just generated."""
        self._live.append_many((req_id,), (token_ids,))

    def append_many(self, req_ids: Sequence[Hashable],
                    token_ids: Sequence[Sequence[int]]) -> None:
        """`append` for each (request, tokens) pair, in order: one pass's output.

        Lists are taken as they are (vLLM's hold Python ints); other sequences are
        converted. The shared trees will get the tokens at once (a sibling one pass ahead
        must be visible), the request's own tree a pass late: the context always ends
        where the request's own sequence ends, and a sequence ending exactly at the
        matched suffix adds a count with no continuation, diluting every draft (vLLM's
        local tree has this effect).
        """
        self._live.append_many(req_ids, token_ids)

    def finish(self, req_id: Hashable) -> None:
        """The request stopped (finished, aborted or preempted)."""
        req = self._live.running.get(req_id)
        if req is not None:
            # (a preempted request counts as finished here: rare, and only a length sample)
            self.lengths.finished(req.key, req.end - len(self._prompts[req.key].prompt_ids))
            self.lengths.forget(req_id)
            self._end_group(req.key, self._live.finish(req_id))

    def end_step(self) -> None:
        """Drop every live response (the step is over; history comes back via set_history)."""
        for req_id in list(self._live.running):
            self.finish(req_id)
        for key in self._prompts:
            if self._live.members(key):
                self._end_group(key, self._live.end_group(key))
        self._evict()

    def remaining(self, req_ids: Sequence[Hashable]) -> list[tuple[float, float]]:
        """(mean, std) predicted remaining output tokens of each running request, from
        its prompt's history lengths and finished siblings (`pipeline.drafting.remaining`)."""
        running, prompts = self._live.running, self._prompts
        items = []
        for r in req_ids:
            req = running[r]
            items.append((r, req.key, req.base + len(req.tokens) - len(prompts[req.key].prompt_ids)))
        return self.lengths.estimate_many(items)

    def running(self) -> list[Hashable]:
        return list(self._live.running)

    # -- drafting ---------------------------------------------------------------------
    def draft(self, req_id: Hashable, max_tokens: int) -> Draft:
        """Best draft of at most `max_tokens` tokens for a running request."""
        req = self._live.running.get(req_id)
        if req is None or max_tokens <= 0:
            return EMPTY_DRAFT
        p = self._prompts[req.key]
        t0 = time.perf_counter()
        tree = self._prompt_tree(p)
        p.feed(self._live.members(p.key), self._live.version)
        if not self.config.use_siblings:
            self._feed_own(req)
        t1 = time.perf_counter()
        best, source = self._query(req, p, tree, max_tokens)
        times = self._times
        times.live_in += t1 - t0
        times.queries += time.perf_counter() - t1
        return self._count(best, source)

    def _feed_own(self, req: LiveRequest) -> None:
        """Siblings off: the request's own tree (made on its first draft) gets its tokens
        up to its previous pass."""
        if req.own is None:
            req.own = SuffixTree(self.config.max_depth)
        if req.own_pos < req.pending:
            req.own.extend(0, req.since(req.own_pos, req.pending))
            req.own_pos = req.pending
            req.trim()

    def _query(self, req: LiveRequest, p: PromptState, tree: SuffixTree,
               max_tokens: int) -> tuple[Draft, str]:
        """The best-scoring draft of the request's trees, and the tree that served it."""
        cfg = self.config
        context = req.context()
        memo = cfg.use_siblings and not cfg.global_live  # the trees are all in the key
        if memo:
            last, versions = p.last, (tree.version, self._global.tree.version)
            if last is not None and last.versions == versions \
                    and last.max_tokens == max_tokens and last.context == context:
                # a sibling in the same state (GRPO siblings often share their context:
                # all of them at T = 0, the first tokens at any temperature)
                return last.draft, last.source
        args = (context, max_tokens, cfg.min_path_prob, cfg.max_spec_factor,
                cfg.max_spec_offset)
        best, source = tree.speculate(*args), "prompt"
        # A draft scores at most one per token: one of max_tokens tokens all at
        # probability 1 cannot be beaten (a tree wins only with a higher score).
        if req.own is not None and best.score < max_tokens:
            d = req.own.speculate(*args)
            if d.score > best.score:
                best, source = d, "own"
        if cfg.use_global and (not cfg.global_fallback or not best.token_ids):
            self._global.flush(self._live.take_unsent())
            if best.score < max_tokens and self._global.num_seqs:
                d = self._global.speculate(*args)
                if d.score > best.score:
                    best, source = d, "global"
        if memo:
            p.last = LastDraft(versions, max_tokens, context, best, source)
        return best, source

    def _count(self, best: Draft, source: str) -> Draft:
        if best.token_ids:
            self._drafts += 1
            self._drafted_tokens += len(best.token_ids)
            self._wins[source] += 1
        return best

    def stats(self) -> DrafterStats:
        trees = [self._prompts[k].tree for k in self._trees]
        trees += [r.own for r in self._live.running.values() if r.own is not None]
        hist = [h.tokens for p in self._prompts.values() for h in p.history]
        return DrafterStats(
            prompts=sum(1 for p in self._prompts.values() if p.history),
            trees=len(self._trees), live_requests=len(self._live.running),
            history_responses=len(hist), history_tokens=int(sum(len(h) for h in hist)),
            tree_bytes=sum(t.memory_bytes() for t in trees) + self._global.memory_bytes(),
            drafts=self._drafts, drafted_tokens=self._drafted_tokens, wins=dict(self._wins))

    def times(self) -> DrafterTimes:
        """Where the drafter's time went since it was made (a copy)."""
        return replace(self._times)

    def sources(self) -> dict[str, int]:
        """Drafts each tree has served so far: prompt, own, global."""
        return dict(self._wins)

    def cached_prompts(self) -> list[str]:
        """Keys of prompts whose tree is held, least recently used first."""
        return list(self._trees)

    # -- internals --------------------------------------------------------------------
    def _prompt(self, key: str) -> PromptState:
        p = self._prompts.get(key)
        if p is None:
            p = self._prompts[key] = PromptState(key)
        return p

    def _prompt_tree(self, p: PromptState) -> SuffixTree:
        if p.tree is None:
            p.build_tree(self.config.max_depth)
            self._trees[p.key] = None
            self._evict()
        self._trees.move_to_end(p.key)
        return p.tree

    def _add_history(self, p: PromptState, tokens: np.ndarray, copies: int) -> HistoryEntry:
        h = HistoryEntry(tokens, copies)
        if p.tree is not None:
            p.insert(h)
        if self.config.use_global:
            self._global.add_history(tokens, copies, h.global_seqs)
        return h

    def _remove_history(self, p: PromptState, h: HistoryEntry) -> None:
        p.remove(h)
        self._global.remove(h.global_seqs)
        h.global_seqs = []

    def _drop_sequences(self, p: PromptState, m: LiveRequest) -> None:
        """A request that left its group: its live sequences leave the trees."""
        if m.local_seq is not None and p.tree is not None:
            p.tree.remove(m.local_seq)
        if m.global_seq is not None:
            self._global.remove((m.global_seq,))

    def _end_group(self, key: str, members: list[LiveRequest]) -> None:
        if members:
            self.lengths.end_group(key)
        t0 = time.perf_counter()
        p = self._prompts[key]
        for m in members:
            self._drop_sequences(p, m)
        self._times.group_ends += time.perf_counter() - t0

    def _evict(self) -> None:
        """Free LRU trees beyond the cap; prompts with requests in their group stay."""
        excess = len(self._trees) - self.config.max_cached_prompts
        for key in list(self._trees):
            if excess <= 0:
                break
            p = self._prompts[key]
            if self._live.members(key):
                continue
            p.free_tree()
            del self._trees[key]
            excess -= 1


__all__ = ["DrafterStats", "DrafterTimes", "GroupDrafter", "source_shares"]
