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

`draft` asks the trees for the best-scoring continuation of the request's context
(`pipeline.drafting.query`: which trees, in what order, and where a draft is chained). The
global tree is asked only when the prompt's own trees offer nothing (`global_fallback`,
default): at T = 1 a global draft that outscored the prompt's own displaced better ones
(docs/speculation.md).

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

Off the critical path. vLLM calls the proposer between two target passes, the GPU idle;
what only the next pass's drafts need can run while the GPU computes it
(`pipeline.drafting.background`, one thread, jobs in order, every public method waiting
for them first, so drafts are the same as inline). After a pass (`after_pass`) the groups'
running members enter their trees up to their end — at the next call that is exactly the
held-back part, so the drafts' own feeding finds nothing left to do — and a few ended
sequences leave the trees (`JANITOR_TOKENS` a pass: an ended group's prompt no longer
drafts, so its sequences may go slowly; a new request of that prompt removes the rest
first). `prepare` builds the next step's trees ahead and frees the others'. Freed trees
are destroyed in the background too (tens of ms for a large tree).
"""

from __future__ import annotations

from collections import OrderedDict
import time
from dataclasses import replace
from typing import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

from pipeline.history.lengths import LengthEvidence
from pipeline.history.store import prompt_hash
from pipeline.drafting.background import OPTIONAL, Background
from pipeline.drafting.global_tree import GlobalTree
from pipeline.drafting.inputs import DrafterConfig, HistoryResponse, reward_copies
from pipeline.drafting.live import LiveRequest, LiveSet
from pipeline.drafting.prompt_state import HistoryEntry, PromptState
from pipeline.drafting.query import DraftChooser
from pipeline.drafting.remaining import RemainingTracker
from pipeline.drafting.stats import DrafterStats, DrafterTimes, source_shares
from pipeline.drafting.suffix_tree import EMPTY_DRAFT, Draft, SuffixTree

JANITOR_TOKENS = 16384  # ended-sequence tokens removed per pass, off the critical path
# Context tokens the presumed next token is guessed from: a guess is only checked, never
# drafted, and the tree's match loop costs the square of the context's length.
GUESS_CONTEXT = 8
HistoryLookup = Callable[[list[str]], Mapping[str, Sequence[HistoryResponse]]]


class GroupDrafter:
    """History + sibling + self drafting for the requests of one rollout engine."""

    def __init__(self, config: DrafterConfig = DrafterConfig()):
        self.config = config
        self._prompts: dict[str, PromptState] = {}
        self._trees: OrderedDict[str, None] = OrderedDict()  # prompts with a tree, LRU first
        self._live = LiveSet(config.max_depth, config.use_siblings,
                             config.use_global and config.global_live)
        self._global = GlobalTree(config.max_depth, config.max_global_responses,
                                  config.max_global_tokens)
        self._drafts = 0
        self._drafted_tokens = 0
        self._wins = {"prompt": 0, "own": 0, "global": 0}
        self.lengths = LengthEvidence()  # the prompts' history and finished siblings' lengths
        self._remaining = RemainingTracker(self.lengths)
        self._choose = DraftChooser(config, self._global, self._live, self._remaining)
        self._times = DrafterTimes()
        self._bg = Background(config.background)
        self._stale: OrderedDict[str, None] = OrderedDict()  # prompts with ended sequences
        self._graveyard: list[SuffixTree] = []  # freed trees, destroyed off the critical path
        self.presumed_hits = 0  # drafts served from `after_pass(presume=True)`'s work

    # -- history ----------------------------------------------------------------------
    def set_history(self, key: str, responses: Sequence[HistoryResponse]) -> None:
        """Make `responses` the history of prompt `key` (its `prompt_hash`).

        Responses already held (same tokens, same weight) stay in the trees; only the
        others are removed or inserted.
        """
        self._bg.wait()
        for _ in self._history_steps(key, responses):
            pass

    def _history_steps(self, key: str, responses: Sequence[HistoryResponse]):
        # Lengths are evidence for the budget whether or not the tokens are drafted from.
        per_epoch: dict[int, list[int]] = {}
        for r in responses:
            per_epoch.setdefault(r.epoch, []).append(len(r.token_ids))
        self.lengths.set_history(key, per_epoch)
        if not self.config.use_history:
            return
        p = self._prompt(key)
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
                yield from self._global.add_history_steps(h.tokens, h.copies, h.global_seqs)
        for stale in old.values():  # (after the inserts, as the recorded runs did)
            for h in stale:
                self._remove_history(p, h)
        p.history = history
        self._global.cap()

    def prepare(self, prompts: Sequence[Sequence[int]], history: HistoryLookup,
                keep: Iterable[str] = ()) -> None:
        """Make `prompts` (token ids; the next rollout's) the prompts the drafter holds, in
        the background: every other prompt's tree and history are freed (but those of
        `keep` and of prompts with live requests), then `history(keys)` is asked for these
        prompts' responses (prompt key -> oldest first; a prompt it leaves out keeps what
        it has) and each one's tree is built. Every public method waits for it first."""
        self._bg.wait()
        keys = [prompt_hash(ids) for ids in prompts]
        for key, ids in zip(keys, prompts):
            p = self._prompt(key)
            if p.prompt_ids is None:
                p.prompt_ids = [int(t) for t in ids]
        retained = set(keys) | set(keep)
        self._bg.submit(lambda: self._prepare_steps(list(dict.fromkeys(keys)), retained, history))

    def _prepare_steps(self, keys: list[str], retained: set[str], history: HistoryLookup):
        yield from self._retain_steps(retained)
        found = history(keys) if keys else {}
        yield
        depth = self.config.max_depth
        for key in keys:
            if key in found:
                yield from self._history_steps(key, found[key])
            p = self._prompts[key]
            if p.tree is None and self.config.use_history:
                yield from p.build_steps(depth)
                self._trees[key] = None
        self._evict()
        yield from self._bury()

    def _retain_steps(self, keep: set[str]):
        """Free every prompt but `keep` and those with live requests: its tree, and its
        history but the responses the global tree holds (bounded by that tree's cap;
        kept so that the prompt's next load finds them there, not twice)."""
        for key in [k for k in self._prompts if k not in keep and not self._live.members(k)]:
            p = self._prompts[key]
            self._trees.pop(key, None)
            self._stale.pop(key, None)
            tree = p.free_tree()
            p.history = [h for h in p.history if h.global_seqs]
            p.parked = True
            if not p.history:
                del self._prompts[key]
            yield
            del tree  # destroyed here, in this (background) step
            yield
        for key in keep:
            p = self._prompts.get(key)
            if p is not None:
                p.parked = False

    def history_prompts(self) -> int:
        """Prompts the drafter holds history for (freed ones excepted)."""
        self._bg.wait()
        return sum(1 for p in self._prompts.values() if p.history and not p.parked)

    def held_prompts(self) -> list[str]:
        """Keys of the prompts the drafter holds state for."""
        self._bg.wait()
        return list(self._prompts)

    # -- live requests ----------------------------------------------------------------
    def expect_group(self, prompt_ids: Sequence[int], n: int) -> None:
        """Announce that `n` requests of this prompt form one group (optional).

        Without it a group ends when none of its requests is running, which can be too
        early if some siblings are still waiting for a slot.
        """
        self._bg.wait()
        key = prompt_hash(prompt_ids)
        self._prompt(key)
        self._live.expect(key, n)

    def start(self, req_id: Hashable, prompt_ids: Sequence[int],
              output_ids: Sequence[int] = ()) -> str:
        """Register a running request (or a resumed one, with its output so far).

        Returns the prompt key.
        """
        self._bg.wait()
        if req_id in self._live.running:
            raise ValueError(f"request {req_id!r} is already running")
        key = prompt_hash(prompt_ids)
        p = self._prompt(key)
        if p.prompt_ids is None:
            p.prompt_ids = [int(t) for t in prompt_ids]
        if p.stale:  # a new group: the last one's sequences leave first
            self._remove_stale(p)
        _, replaced = self._live.start(req_id, key, p.prompt_ids,
                                       [int(t) for t in output_ids])
        for old in replaced:  # resumed after preemption
            self._drop_sequences(p, old)
        if p.tree is not None:
            self._trees.move_to_end(key)
        return key

    def append(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        """Tokens the request just generated."""
        self.append_many((req_id,), (token_ids,))

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
        self._bg.wait()
        self._live.append_many(req_ids, token_ids)

    def ends(self, req_ids: Sequence[Hashable]) -> list[int]:
        """Tokens the drafter holds for each request (prompt + output); -1 for one not
        running."""
        self._bg.wait()
        return self._live.ends(req_ids)

    def resync(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        """The request's tokens (prompt + output) are `token_ids`, not what the drafter
        recorded (the engine skipped a pass's update): its output is replaced, as on a
        resume after preemption, without counting as a finished length."""
        self._bg.wait()
        req = self._live.running.get(req_id)
        if req is None:
            return
        prompt_ids = self._prompts[req.key].prompt_ids
        self._live.withdraw(req_id)
        self._remaining.forget(req_id)
        self.start(req_id, prompt_ids, token_ids[len(prompt_ids):])

    def finish(self, req_id: Hashable) -> None:
        """The request stopped (finished, aborted or preempted)."""
        self._bg.wait()
        req = self._live.running.get(req_id)
        if req is not None:
            # (a preempted request counts as finished here: rare, and only a length sample)
            self.lengths.finished(req.key, req.end - len(self._prompts[req.key].prompt_ids))
            self._remaining.forget(req_id)
            self._end_group(req.key, self._live.finish(req_id))

    def end_step(self) -> None:
        """Drop every live response (the step is over; history comes back via set_history).
        The ended sequences leave the trees in the background."""
        self._bg.wait()
        for req_id in list(self._live.running):
            self.finish(req_id)
        for key in self._prompts:
            if self._live.members(key):
                self._end_group(key, self._live.end_group(key))
        self._evict()
        self._bg.submit(self._cleanup_steps)

    def remaining(self, req_ids: Sequence[Hashable]) -> list[tuple[float, float]]:
        """(mean, std) predicted remaining output tokens of each running request, from
        its prompt's history lengths and finished siblings (`pipeline.drafting.remaining`)."""
        self._bg.wait()
        running, prompts = self._live.running, self._prompts
        items = []
        for r in req_ids:
            req = running[r]
            items.append((r, req.key, req.base + len(req.tokens) - len(prompts[req.key].prompt_ids)))
        return self._remaining.estimate_many(items)

    def running(self) -> list[Hashable]:
        return list(self._live.running)

    # -- drafting ---------------------------------------------------------------------
    def draft(self, req_id: Hashable, max_tokens: int) -> Draft:
        """Best draft of at most `max_tokens` tokens for a running request."""
        self._bg.wait()
        req = self._live.running.get(req_id)
        if req is None or max_tokens <= 0:
            return EMPTY_DRAFT
        return self._drafts_of([req], [max_tokens])[0]

    def draft_many(self, req_ids: Sequence[Hashable], caps: Sequence[int]) -> list[Draft]:
        """`draft(r, k)` for each (request, cap) pair (EMPTY_DRAFT where k is 0): one
        pass's drafts in one call, the same as one `draft` after the other."""
        self._bg.wait()
        running = self._live.running
        reqs = [running.get(r) if k > 0 else None for r, k in zip(req_ids, caps)]
        asked = [(req, k) for req, k in zip(reqs, caps) if req is not None]
        drafts = iter(self._drafts_of([r for r, _ in asked], [k for _, k in asked]))
        return [EMPTY_DRAFT if req is None else next(drafts) for req in reqs]

    def cut(self, req_id: Hashable, k: int) -> None:
        """Only the first `k` tokens of the request's last draft were proposed (a budget
        trimmed it): whether that draft is accepted whole is judged on those."""
        self._bg.wait()
        req = self._live.running.get(req_id)
        if req is not None and req.sent is not None:
            tokens, cap, _ = req.sent
            req.sent = (tokens[:k], cap, 0.0)

    def after_pass(self, presume: bool = False) -> None:
        """A pass's drafts are out: what the next pass's drafts need and these did not —
        the pass's tokens in the trees, ended sequences out — starts now, in the
        background (inline with `config.background` off).

        presume: then, as time allows, each running request's next draft is worked out
        for the outcome the trees expect — its draft accepted whole, then their most
        likely next token — at the same cap (for budgets whose caps do not move). At the
        next pass a request whose context, cap and trees are those gets it without asking
        the trees; any other asks them as before. Drafts are the same either way; a wait
        for the background (the next pass) cuts this part short."""
        self._bg.submit(lambda: self._after_pass_steps(presume))

    def settle(self) -> float:
        """Wait for the background work; returns the seconds waited."""
        return self._bg.wait()

    def _drafts_of(self, reqs: list[LiveRequest], caps: list[int]) -> list[Draft]:
        """Drafts of running requests (caps > 0). First every tree they read gets what it
        lacks (a prompt's group once per change of the live set), then each is drafted:
        feeding one prompt's tree changes no other's drafts, so this is draft by draft."""
        prompts, live, cfg = self._prompts, self._live, self.config
        t0 = time.perf_counter()
        version = live.version
        for req in reqs:
            p = prompts[req.key]
            if p.tree is None:
                self._prompt_tree(p)
            if p.fed != version:
                p.feed(live.members(p.key), version)
            if not cfg.use_siblings:
                self._feed_own(req)
        t1 = time.perf_counter()
        out = []
        wins, global_tree = self._wins, self._global.tree
        choose = self._choose
        for req, cap, always in zip(reqs, caps, choose.chain_always(reqs, caps, prompts)):
            p = prompts[req.key]
            tree = p.tree
            context = req.context()
            pre = req.presumed
            if pre is not None and pre[0] == cap and pre[2] == context and \
                    pre[1] == (tree.version, global_tree.version,
                               -1 if req.own is None else req.own.version):
                best, source = pre[3], pre[4]  # worked out after the last pass, trees unchanged
                self.presumed_hits += 1
            else:
                best, source = choose.best(req, p, tree, cap, context, always or req.sure())
            req.sent, req.presumed = (best.token_ids, cap, best.score), None
            if best.token_ids:
                self._drafts += 1
                self._drafted_tokens += len(best.token_ids)
                wins[source] += 1
            out.append(best)
        times = self._times
        times.live_in += t1 - t0
        times.queries += time.perf_counter() - t1
        return out

    def _versions(self, req: LiveRequest, tree: SuffixTree) -> tuple[int, int, int]:
        """What a draft depends on besides context and cap: the versions of its trees."""
        return (tree.version, self._global.tree.version,
                -1 if req.own is None else req.own.version)

    def _feed_own(self, req: LiveRequest, to_end: bool = False) -> None:
        """Siblings off: the request's own tree (made on its first draft) gets its tokens
        up to its previous pass (to its end with to_end, after a pass)."""
        if req.own is None:
            if to_end:
                return
            req.own = SuffixTree(self.config.max_depth)
        stop = req.end if to_end else req.pending
        if req.own_pos < stop:
            req.own.extend(0, req.since(req.own_pos, stop))
            req.own_pos = stop
            req.trim()

    # -- background jobs --------------------------------------------------------------
    def _after_pass_steps(self, presume: bool):
        live, prompts = self._live, self._prompts
        version = live.version
        for key, members in live.groups():
            p = prompts[key]
            if p.tree is not None and members:
                p.feed(members, version, to_end=True)
                yield
        if not self.config.use_siblings:
            for req in live.running.values():
                self._feed_own(req, to_end=True)
            yield
        if self.config.global_live:
            self._global.flush(live.take_unsent())
            yield
        budget = JANITOR_TOKENS
        while self._stale and budget > 0:
            p = prompts.get(next(iter(self._stale)))
            t0 = time.perf_counter()
            budget -= p.remove_stale(limit=1) if p is not None else 0
            self._times.group_ends += time.perf_counter() - t0
            if p is None or not p.stale:
                self._stale.popitem(last=False)
            yield
        yield from self._bury()
        if presume:
            yield OPTIONAL
            yield from self._presume_steps()

    def _presume_steps(self):
        """`after_pass`'s presumed drafts, one request a step, the surest drafts first
        (the ones most likely accepted whole, and asked of long matches: the costliest
        queries); requests that got no draft last."""
        cfg, prompts = self.config, self._prompts
        args = (1, 0.0, cfg.max_spec_factor, cfg.max_spec_offset)
        order = sorted((r for r in self._live.running.values() if r.sent is not None),
                       key=lambda r: -r.sent[2])
        for req in order:
            tokens, cap, _ = req.sent
            p = prompts[req.key]
            tree = p.tree
            if tree is None:
                continue
            context = req.tokens[-req.keep:] + tokens  # all of the draft accepted
            guess = tree.speculate(context[-GUESS_CONTEXT:], *args)
            if not guess.token_ids and req.own is not None:
                guess = req.own.speculate(context[-GUESS_CONTEXT:], *args)
            if guess.token_ids:
                context = (context + guess.token_ids)[-req.keep:]  # and the next token
                best, source = self._choose.best(req, p, tree, cap, context, True)
                req.presumed = (cap, self._versions(req, tree), context, best, source)
            yield

    def _cleanup_steps(self):
        """Every ended sequence out, every freed tree destroyed (after a step)."""
        while self._stale:
            key, _ = self._stale.popitem(last=False)
            p = self._prompts.get(key)
            while p is not None and p.stale:
                t0 = time.perf_counter()
                p.remove_stale(limit=1)
                self._times.group_ends += time.perf_counter() - t0
                yield
        yield from self._bury()

    def _bury(self):
        while self._graveyard:
            tree = self._graveyard.pop()
            del tree  # the C++ tree is destroyed here
            yield

    # -- stats ------------------------------------------------------------------------
    def stats(self) -> DrafterStats:
        self._bg.wait()
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
        self._bg.wait()
        return replace(self._times)

    def background_seconds(self) -> float:
        """Seconds of work done off the critical path (or inline, `background` off) since
        the drafter was made: after-pass feeding and removals, builds, frees."""
        self._bg.wait()
        return self._bg.busy_s

    @property
    def background_busy_s(self) -> float:
        """`background_seconds()` without waiting (the running job not yet counted)."""
        return self._bg.busy_s

    @property
    def background_cpu_s(self) -> float:
        """The CPU time of that work (its thread's: on a busy machine the wall time also
        holds other threads' and processes' turns), without waiting."""
        return self._bg.busy_cpu_s

    def close(self) -> None:
        """Finish the background work and end its thread (the drafter still works, inline)."""
        self._bg.close()

    def sources(self) -> dict[str, int]:
        """Drafts each tree has served so far: prompt, own, global."""
        return dict(self._wins)

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

    def _remove_stale(self, p: PromptState) -> None:
        t0 = time.perf_counter()
        p.remove_stale()
        self._stale.pop(p.key, None)
        self._times.group_ends += time.perf_counter() - t0

    def _end_group(self, key: str, members: list[LiveRequest]) -> None:
        """The group's live sequences are marked stale: they leave the prompt tree in the
        background (no request of the prompt drafts until a new one starts, which removes
        them first). Their global sequences (global_live) go at once: other prompts draft
        from that tree."""
        if members:
            self.lengths.end_group(key)
        t0 = time.perf_counter()
        p = self._prompts[key]
        for m in members:
            if m.local_seq is not None and p.tree is not None:
                p.stale.append(m.local_seq)
            if m.global_seq is not None:
                self._global.remove((m.global_seq,))
        if p.stale:
            self._stale[key] = None
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
            self._stale.pop(key, None)
            self._graveyard.append(p.free_tree())
            del self._trees[key]
            excess -= 1


__all__ = ["DrafterStats", "DrafterTimes", "GroupDrafter", "source_shares"]
