"""Drafting from history and live siblings: one suffix tree per prompt, plus a global one.

RhymeRL's HistoSpec drafts from the same prompt's responses in earlier epochs; Seer drafts
from the in-flight responses of the same GRPO group. `GroupDrafter` does both, in one
structure, independent of vLLM (the proposer in `pipeline.rollout.proposer` feeds it):

- per prompt (keyed by `prompt_hash` of its token ids, as the history store keys rows),
  one tree holding the full prompt, the prompt's history (the last K epochs' responses,
  each preceded by the prompt's last `max_depth` tokens so the first response tokens can
  be drafted) and, with siblings on, the live responses of its group as they grow;
- per request, a small tree of its own prompt and output (self drafting, as vLLM's
  suffix method's local tree): with siblings off always; with siblings on as
  `DrafterConfig.own_tree` has it, by default only in thin passes
  (`pipeline.drafting.own_trees`);
- one global tree over all prompts' history (FIFO-capped) and, optionally, all live
  responses (`pipeline.drafting.global_tree`).

`draft` asks the trees for the best-scoring continuation of the request's context
(`pipeline.drafting.query`: which trees, in what order, and where a draft is chained). The
global tree is asked only where the prompt's own trees offer little (a best draft expected
to yield less than one token, `global_below`): at T = 1 a global draft that outscored a
good one of the prompt's displaced it (docs/speculation.md).

Costs. Live tokens wait in Python lists and enter a tree only when a request that reads it
drafts; a running response enters its prompt's tree up to the end of its previous pass (the
newest tokens held back, since GRPO siblings advance in lockstep); live responses leave
when their whole group has finished; what only the next pass needs runs in a background
thread while the GPU computes (`pipeline.drafting.background`: drafts are the same as
inline). Why each of these, with what it measured: docs/architecture.md, "The drafter's
costs".
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Hashable, Iterable, Sequence

from pipeline.history.lengths import LengthEvidence
from pipeline.history.store import prompt_hash
from pipeline.drafting.background import OPTIONAL, Background
from pipeline.drafting.inputs import DrafterConfig, HistoryResponse
from pipeline.drafting.live import LiveRequest, LiveSet
from pipeline.drafting.own_trees import OwnTrees
from pipeline.drafting.prompt_table import HistoryLookup, PromptTable
from pipeline.drafting.query import DraftChooser
from pipeline.drafting.remaining import RemainingTracker
from pipeline.drafting.stats import DrafterStats, DrafterTimes, source_shares
from pipeline.drafting.suffix_tree import EMPTY_DRAFT, Draft

JANITOR_TOKENS = 16384  # ended-sequence tokens removed per pass, off the critical path


class GroupDrafter:
    """History + sibling + self drafting for the requests of one rollout engine."""

    def __init__(self, config: DrafterConfig = DrafterConfig()):
        self.config = config
        self._live = LiveSet(config.max_depth, config.use_siblings,
                             config.use_global and config.global_live,
                             own=config.own_tree != "never")
        self._own = OwnTrees(config, self._live)
        self._drafts = 0
        self._drafted_tokens = 0
        self._wins = {"prompt": 0, "own": 0, "global": 0}
        self.lengths = LengthEvidence()  # the prompts' history and finished siblings' lengths
        self._times = DrafterTimes()
        self._table = PromptTable(config, self._live, self.lengths, self._times)
        self._prompts = self._table.prompts  # the same dict: read on every draft
        self._global = self._table.global_tree
        self._remaining = RemainingTracker(self.lengths)
        self._choose = DraftChooser(config, self._global, self._live, self._remaining)
        self._bg = Background(config.background)
        self.presumed_hits = 0  # drafts served from `after_pass(presume=True)`'s work

    # -- history ----------------------------------------------------------------------
    def set_history(self, key: str, responses: Sequence[HistoryResponse]) -> None:
        """Make `responses` the history of prompt `key` (its `prompt_hash`): responses
        already held (same tokens, same weight) stay in the trees, the others change."""
        self._bg.wait()
        for _ in self._table.history_steps(key, responses):
            pass

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
            p = self._table.get(key)
            if p.prompt_ids is None:
                p.prompt_ids = [int(t) for t in ids]
        retained = set(keys) | set(keep)
        self._bg.submit(lambda: self._table.prepare_steps(list(dict.fromkeys(keys)), retained,
                                                          history))

    def park_history(self, keys: Sequence[str], history: HistoryLookup) -> None:
        """Prompts `keys` (not held) got new history: its newest responses enter the
        global tree, in the background (`PromptTable.park_history_steps`)."""
        self._bg.wait()
        keys = list(dict.fromkeys(keys))
        self._bg.submit(lambda: self._table.park_history_steps(keys, history))

    def history_prompts(self) -> int:
        """Prompts the drafter holds history for (freed ones excepted)."""
        self._bg.wait()
        return self._table.history_prompts()

    # -- live requests ----------------------------------------------------------------
    def expect_group(self, prompt_ids: Sequence[int], n: int) -> None:
        """Announce that `n` requests of this prompt form one group (optional: without it
        a group ends when none of its requests runs, too early if siblings still wait)."""
        self._bg.wait()
        key = prompt_hash(prompt_ids)
        self._table.get(key)
        self._live.expect(key, n)

    def start(self, req_id: Hashable, prompt_ids: Sequence[int],
              output_ids: Sequence[int] = ()) -> str:
        """Register a running request (or a resumed one, with its output so far); returns
        the prompt key."""
        self._bg.wait()
        if req_id in self._live.running:
            raise ValueError(f"request {req_id!r} is already running")
        key = prompt_hash(prompt_ids)
        table = self._table
        p = table.get(key)
        if p.prompt_ids is None:
            p.prompt_ids = [int(t) for t in prompt_ids]
        if p.stale:  # a new group: the last one's sequences leave first
            table.remove_stale(p)
        _, replaced = self._live.start(req_id, key, p.prompt_ids,
                                       [int(t) for t in output_ids])
        for old in replaced:  # resumed after preemption
            table.drop_sequences(p, old)
        if p.tree is not None:
            table.trees.move_to_end(key)
        return key

    def append(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        """Tokens the request just generated."""
        self.append_many((req_id,), (token_ids,))

    def append_many(self, req_ids: Sequence[Hashable],
                    token_ids: Sequence[Sequence[int]]) -> None:
        """`append` for each (request, tokens) pair, in order: one pass's output (lists
        taken as they are, other sequences converted). The shared trees get the tokens at
        once (a sibling one pass ahead must be visible), the request's own tree a pass
        late: a sequence ending exactly at the matched suffix would dilute every draft."""
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
            self._table.end_group(req.key, self._live.finish(req_id))

    def end_step(self) -> None:
        """Drop every live response (the step is over; history comes back via set_history).
        The ended sequences leave the trees in the background."""
        self._bg.wait()
        for req_id in list(self._live.running):
            self.finish(req_id)
        for key in self._prompts:
            if self._live.members(key):
                self._table.end_group(key, self._live.end_group(key))
        self._table.evict()
        self._bg.submit(self._table.cleanup_steps)

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
        """A pass's drafts are out: what the next pass's drafts need — the pass's tokens
        in the trees, ended sequences out — starts now, in the background (inline with
        `config.background` off). presume: then, as time allows, each running request's
        next draft is worked out for the outcome the trees expect (its draft accepted
        whole, then their likeliest token) at the same cap; a request whose context, cap
        and trees are those at the next pass gets it without asking the trees. Drafts
        are the same either way; the next pass's wait cuts this part short."""
        self._bg.submit(lambda: self._after_pass_steps(presume))

    def settle(self) -> float:
        """Wait for the background work; returns the seconds waited."""
        return self._bg.wait()

    def _drafts_of(self, reqs: list[LiveRequest], caps: list[int]) -> list[Draft]:
        """Drafts of running requests (caps > 0). First every tree they read gets what it
        lacks (a prompt's group once per change of the live set), then each is drafted:
        feeding one prompt's tree changes no other's drafts, so this is draft by draft."""
        prompts, live = self._prompts, self._live
        choose = self._choose
        t0 = time.perf_counter()
        thin = choose.thin(caps)
        own = self._own.asked(thin, caps)
        version = live.version
        for req in reqs:
            p = prompts[req.key]
            if p.tree is None:
                self._table.tree_of(p)
            if p.fed != version:
                p.feed(live.members(p.key), version)
            if own:
                self._own.feed(req)
        t1 = time.perf_counter()
        out = []
        wins = self._wins
        for req, cap, always in zip(reqs, caps, choose.chain_always(reqs, caps, prompts, thin)):
            p = prompts[req.key]
            tree = p.tree
            context = req.context()
            chain = bool(always or req.sure())
            pre = req.presumed and choose.presumed(req, tree, cap, context, chain, own)
            if pre:
                best, source = pre  # worked out after the last pass, trees unchanged
                self.presumed_hits += 1
            else:
                best, source = choose.best(req, p, tree, cap, context, chain, own)
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

    # -- background jobs --------------------------------------------------------------
    def _after_pass_steps(self, presume: bool):
        live, prompts = self._live, self._prompts
        version = live.version
        for key, members in live.groups():
            p = prompts[key]
            if p.tree is not None and members:
                p.feed(members, version, to_end=True)
                yield
        yield from self._own.after_pass_steps()
        if self.config.global_live:
            self._global.flush(live.take_unsent())
            yield
        yield from self._table.janitor_steps(JANITOR_TOKENS)
        yield from self._table.bury()
        if presume:
            yield OPTIONAL
            yield from self._choose.presume_steps(live.running.values(), prompts,
                                                  self._own.last_pass[0])

    # -- stats ------------------------------------------------------------------------
    def stats(self) -> DrafterStats:
        self._bg.wait()
        own = [r.own for r in self._live.running.values() if r.own is not None]
        hist = [h.tokens for p in self._prompts.values() for h in p.history]
        return DrafterStats(
            prompts=sum(1 for p in self._prompts.values() if p.history),
            trees=len(self._table.trees), live_requests=len(self._live.running),
            history_responses=len(hist), history_tokens=int(sum(len(h) for h in hist)),
            tree_bytes=self._table.memory_bytes(own),
            drafts=self._drafts, drafted_tokens=self._drafted_tokens, wins=dict(self._wins))

    def times(self) -> DrafterTimes:
        """Where the drafter's time went since it was made (a copy)."""
        self._bg.wait()
        return replace(self._times)

    @property
    def background_cpu_s(self) -> float:
        """CPU seconds of the work done off the critical path (inline with `background`
        off) since the drafter was made: after-pass feeding and removals, builds, frees;
        the thread's CPU time (a busy machine's wall time holds others' turns), no wait."""
        return self._bg.busy_cpu_s

    def close(self) -> None:
        """Finish the background work and end its thread (the drafter still works, inline)."""
        self._bg.close()

    def sources(self) -> dict[str, int]:
        """Drafts each tree has served so far: prompt, own, global."""
        return dict(self._wins)


__all__ = ["DrafterStats", "DrafterTimes", "GroupDrafter", "source_shares"]
