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
- one global tree over all prompts' history (FIFO-capped) and, with siblings on, all live
  responses: the format shared across prompts is often the predictable part.

`draft` asks each tree for the most frequent continuation of the longest matching suffix,
cut where the path probability falls below `min_path_prob`, and keeps the best-scoring draft
(score = expected accepted tokens), as arctic-inference's cache does for its local and
global trees; ties go to the prompt's own tree.

Live responses stay in their prompt's tree until the whole group has finished (a finished
sibling still predicts the stragglers), then they are dropped: after the step the loop
feeds them back as history through `set_history`. Trees of prompts with no live request
are kept in LRU order up to `max_cached_prompts` and then freed; their history stays in
compact form (int32 arrays) and the tree is rebuilt when the prompt comes back.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Sequence

import numpy as np

from pipeline.history.store import prompt_hash
from pipeline.spec.suffix_tree import EMPTY_DRAFT, Draft, SuffixTree

PROMPT_SEQ = 0  # sequence id of the full prompt in its prompt tree


@dataclass(frozen=True)
class DrafterConfig:
    """What the drafter draws on and how far it drafts.

    max_depth: suffix-tree depth, tokens (vLLM's suffix default is 24);
    min_path_prob: cut a draft before its path probability falls below this;
    max_spec_factor / max_spec_offset: a draft is at most factor * match_len + offset
    tokens (short matches draft little);
    reward_copies: with reward_weighted, the best response of a prompt counts
    1 + reward_copies times and the worst once (linear in between) — RhymeRL's
    reward-aware tree, realised as repeated sequences so the C++ counts carry the weight;
    max_global_responses: history responses kept in the global tree (FIFO).
    """

    use_history: bool = True
    use_siblings: bool = True
    use_global: bool = True
    max_depth: int = 24
    min_path_prob: float = 0.1
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    reward_weighted: bool = False
    reward_copies: int = 2
    max_cached_prompts: int = 4096
    max_global_responses: int = 10000

    @classmethod
    def for_method(cls, method: str, **kwargs) -> "DrafterConfig":
        """`history`, `group` or `history+group` (the `spec.method` names)."""
        sources = {"history": (True, False), "group": (False, True),
                   "history+group": (True, True)}
        if method not in sources:
            raise ValueError(f"no drafter for spec.method {method!r}; "
                             f"expected one of {sorted(sources)}")
        use_history, use_siblings = sources[method]
        return cls(use_history=use_history, use_siblings=use_siblings, **kwargs)


@dataclass(frozen=True)
class HistoryResponse:
    """One earlier response to a prompt; reward is used only with reward_weighted."""

    token_ids: Sequence[int]
    reward: float | None = None


@dataclass
class _Prompt:
    key: str
    prompt_ids: list[int] | None = None  # known once a request of the prompt starts
    history: list[tuple[np.ndarray, int]] = field(default_factory=list)  # (tokens, copies)
    tree: SuffixTree | None = None
    next_seq: int = 1
    live: set[Hashable] = field(default_factory=set)  # running requests
    done: set[Hashable] = field(default_factory=set)  # finished, group still running
    expected: int | None = None  # group size, when the caller announced it
    global_seqs: list[int] = field(default_factory=list)  # its history in the global tree


@dataclass
class _Request:
    req_id: Hashable
    key: str
    local_seq: int | None  # its sequence in the prompt tree (siblings on)
    global_seq: int | None  # its sequence in the global tree (siblings on)
    own: SuffixTree | None  # prompt + own output (siblings off)
    context: list[int]  # last max_depth + 1 tokens of prompt + output
    pending: list[int] = field(default_factory=list)  # newest tokens, not yet in `own`


@dataclass
class DrafterStats:
    prompts: int = 0  # prompts with history
    trees: int = 0  # prompt trees held
    live_requests: int = 0
    history_responses: int = 0
    history_tokens: int = 0
    tree_bytes: int = 0  # C++ estimate over all trees
    drafts: int = 0
    drafted_tokens: int = 0
    wins: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "own": 0, "global": 0})


class GroupDrafter:
    """History + sibling + self drafting for the requests of one rollout engine."""

    def __init__(self, config: DrafterConfig = DrafterConfig()):
        self.config = config
        self._prompts: dict[str, _Prompt] = {}
        self._trees: OrderedDict[str, None] = OrderedDict()  # prompt keys with a tree, LRU first
        self._requests: dict[Hashable, _Request] = {}
        self._finished_live: dict[str, list[_Request]] = {}  # finished, group still running
        self._global = SuffixTree(config.max_depth)
        self._global_fifo: OrderedDict[int, str] = OrderedDict()  # history seq -> prompt key
        self._next_global = 0
        self._drafts = 0
        self._drafted_tokens = 0
        self._wins = {"prompt": 0, "own": 0, "global": 0}

    # -- history ----------------------------------------------------------------------
    def set_history(self, key: str, responses: Sequence[HistoryResponse]) -> None:
        """Replace the history of prompt `key` (its `prompt_hash`) with `responses`."""
        if not self.config.use_history:
            return
        p = self._prompts.setdefault(key, _Prompt(key))
        copies = _reward_copies(responses, self.config) if responses else []
        p.history = [(np.asarray(r.token_ids, dtype=np.int32), c)
                     for r, c in zip(responses, copies)]
        self._replace_global_history(p)
        if p.tree is not None:
            self._rebuild_history_seqs(p)

    def history_of(self, key: str) -> list[list[int]]:
        p = self._prompts.get(key)
        return [] if p is None else [h.tolist() for h, _ in p.history]

    # -- live requests ----------------------------------------------------------------
    def expect_group(self, prompt_ids: Sequence[int], n: int) -> None:
        """Announce that `n` requests of this prompt belong to one group (optional).

        Without it a group ends when none of its requests is running, which can be too
        early if some siblings are still waiting for a slot.
        """
        key = prompt_hash(prompt_ids)
        self._prompts.setdefault(key, _Prompt(key)).expected = n

    def start(self, req_id: Hashable, prompt_ids: Sequence[int],
              output_ids: Sequence[int] = ()) -> str:
        """Register a running request (or a resumed one, with its output so far).

        Returns the prompt key.
        """
        if req_id in self._requests:
            raise ValueError(f"request {req_id!r} is already running")
        cfg = self.config
        key = prompt_hash(prompt_ids)
        p = self._prompts.setdefault(key, _Prompt(key))
        if p.prompt_ids is None:
            p.prompt_ids = [int(t) for t in prompt_ids]
        self._touch_tree(p)
        if req_id in p.done:  # resumed after preemption: its old sequence goes
            p.done.discard(req_id)
            stale = [r for r in self._finished_live.get(key, []) if r.req_id == req_id]
            for r in stale:
                self._finished_live[key].remove(r)
                self._drop_live_seqs(p, r)
        p.live.add(req_id)
        output = [int(t) for t in output_ids]
        req = _Request(req_id, key, None, None, None,
                       (p.prompt_ids + output)[-(cfg.max_depth + 1):])
        if cfg.use_siblings:
            req.local_seq = p.next_seq
            p.next_seq += 1
            p.tree.extend(req.local_seq, p.prompt_ids[-cfg.max_depth:] + output)
            if cfg.use_global:
                req.global_seq = self._new_global_seq()
                self._global.extend(req.global_seq, output)
        else:
            req.own = SuffixTree(cfg.max_depth)
            req.own.extend(0, p.prompt_ids + output[:-1])
            req.pending = output[-1:]
        self._requests[req_id] = req
        self._evict()
        return key

    def append(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        """Tokens the request just generated."""
        if not len(token_ids):
            return
        req = self._requests[req_id]
        toks = [int(t) for t in token_ids]
        if req.local_seq is not None:
            self._prompts[req.key].tree.extend(req.local_seq, toks)
        if req.global_seq is not None:
            self._global.extend(req.global_seq, toks)
        if req.own is not None:
            self._flush_own(req)
            req.pending = toks
        ctx = req.context
        ctx.extend(toks)
        if len(ctx) > self.config.max_depth + 1:
            del ctx[: len(ctx) - self.config.max_depth - 1]

    @staticmethod
    def _flush_own(req: _Request) -> None:
        """Insert the held-back newest tokens into the request's own tree.

        The context always ends where the request's own sequence ends, and a sequence
        ending exactly at the matched suffix adds a count with no continuation, diluting
        every draft (vLLM's local tree has this effect). No one else reads the own tree,
        so its newest tokens wait one pass. The shared trees get tokens at once: a sibling
        one pass ahead must be visible, and holding tokens back there would make it end
        exactly where this request's context ends.
        """
        if req.pending:
            req.own.extend(0, req.pending)
            req.pending = []

    def finish(self, req_id: Hashable) -> None:
        """The request stopped (finished, aborted or preempted)."""
        req = self._requests.pop(req_id, None)
        if req is None:
            return
        p = self._prompts[req.key]
        p.live.discard(req_id)
        p.done.add(req_id)
        self._finished_live.setdefault(p.key, []).append(req)
        if not p.live and (p.expected is None or len(p.done) >= p.expected):
            self._end_group(p)

    def end_step(self) -> None:
        """Drop every live response (the step is over; history comes back via set_history)."""
        for req_id in list(self._requests):
            self.finish(req_id)
        for p in self._prompts.values():
            if p.live or p.done:
                p.live.clear()
                self._end_group(p)
        self._evict()

    def running(self) -> list[Hashable]:
        return list(self._requests)

    # -- drafting ---------------------------------------------------------------------
    def draft(self, req_id: Hashable, max_tokens: int) -> Draft:
        """Best draft of at most `max_tokens` tokens for a running request."""
        req = self._requests.get(req_id)
        if req is None or max_tokens <= 0:
            return EMPTY_DRAFT
        cfg = self.config
        args = (req.context, max_tokens, cfg.min_path_prob, cfg.max_spec_factor,
                cfg.max_spec_offset)
        best, source = self._prompts[req.key].tree.speculate(*args), "prompt"
        if req.own is not None:
            d = req.own.speculate(*args)
            if d.score > best.score:
                best, source = d, "own"
        if cfg.use_global and self._global.num_seqs:
            d = self._global.speculate(*args)
            if d.score > best.score:
                best, source = d, "global"
        if best.token_ids:
            self._drafts += 1
            self._drafted_tokens += len(best.token_ids)
            self._wins[source] += 1
        return best

    def stats(self) -> DrafterStats:
        trees = [self._prompts[k].tree for k in self._trees]
        own = [r.own for r in self._requests.values() if r.own is not None]
        hist = [h for p in self._prompts.values() for h, _ in p.history]
        return DrafterStats(
            prompts=sum(1 for p in self._prompts.values() if p.history),
            trees=len(trees), live_requests=len(self._requests),
            history_responses=len(hist), history_tokens=int(sum(len(h) for h in hist)),
            tree_bytes=sum(t.memory_bytes() for t in trees + own) + self._global.memory_bytes(),
            drafts=self._drafts, drafted_tokens=self._drafted_tokens, wins=dict(self._wins))

    def cached_prompts(self) -> list[str]:
        """Keys of prompts whose tree is held, least recently used first."""
        return list(self._trees)

    # -- internals --------------------------------------------------------------------
    def _end_group(self, p: _Prompt) -> None:
        for req in self._finished_live.pop(p.key, []):
            self._drop_live_seqs(p, req)
        p.done.clear()
        p.expected = None

    def _drop_live_seqs(self, p: _Prompt, req: _Request) -> None:
        if req.local_seq is not None and p.tree is not None:
            p.tree.remove(req.local_seq)
        if req.global_seq is not None:
            self._global.remove(req.global_seq)

    def _touch_tree(self, p: _Prompt) -> None:
        if p.tree is None:
            p.tree = SuffixTree(self.config.max_depth)
            p.tree.extend(PROMPT_SEQ, p.prompt_ids)
            p.next_seq = PROMPT_SEQ + 1
            self._rebuild_history_seqs(p)
        self._trees[p.key] = None
        self._trees.move_to_end(p.key)

    def _rebuild_history_seqs(self, p: _Prompt) -> None:
        """(Re)insert the history sequences: prompt tail + response, `copies` times each."""
        tree = p.tree
        live = {r.local_seq for r in self._requests.values() if r.key == p.key}
        live |= {r.local_seq for r in self._finished_live.get(p.key, [])}
        for seq in tree.seq_ids():
            if seq != PROMPT_SEQ and seq not in live:
                tree.remove(seq)
        tail = np.asarray(p.prompt_ids[-self.config.max_depth:], dtype=np.int32)
        for tokens, copies in p.history:
            seq_tokens = np.concatenate([tail, tokens])
            for _ in range(copies):
                tree.extend(p.next_seq, seq_tokens)
                p.next_seq += 1

    def _replace_global_history(self, p: _Prompt) -> None:
        for seq in p.global_seqs:
            self._global.remove(seq)
            self._global_fifo.pop(seq, None)
        p.global_seqs = []
        if not self.config.use_global:
            return
        for tokens, copies in p.history:
            for _ in range(copies):
                seq = self._new_global_seq()
                self._global.extend(seq, tokens)
                self._global_fifo[seq] = p.key
                p.global_seqs.append(seq)
        while len(self._global_fifo) > self.config.max_global_responses:
            seq, key = self._global_fifo.popitem(last=False)
            self._global.remove(seq)
            self._prompts[key].global_seqs.remove(seq)

    def _new_global_seq(self) -> int:
        seq = self._next_global
        self._next_global = (self._next_global + 1) & 0x7FFFFFFF
        return seq

    def _evict(self) -> None:
        """Free LRU trees beyond the cap; prompts with live or pending requests stay."""
        excess = len(self._trees) - self.config.max_cached_prompts
        if excess <= 0:
            return
        for key in list(self._trees):
            if excess <= 0:
                break
            p = self._prompts[key]
            if p.live or p.done:
                continue
            p.tree = None
            del self._trees[key]
            excess -= 1


def _reward_copies(responses: Sequence[HistoryResponse], cfg: DrafterConfig) -> list[int]:
    """How many times each history response enters the trees (1 unless reward-weighted)."""
    rewards = [r.reward for r in responses]
    if not cfg.reward_weighted or any(r is None for r in rewards):
        return [1] * len(responses)
    lo, hi = min(rewards), max(rewards)
    if hi <= lo:
        return [1] * len(responses)
    return [1 + int(round(cfg.reward_copies * (r - lo) / (hi - lo))) for r in rewards]


def history_from_records(records: Iterable) -> dict[str, list[HistoryResponse]]:
    """Group history-store `RolloutRecord`s by prompt hash, as `set_history` takes them."""
    out: dict[str, list[HistoryResponse]] = {}
    for rec in records:
        out.setdefault(rec.prompt_hash, []).append(
            HistoryResponse(list(rec.response_ids), float(rec.reward)))
    return out


__all__ = ["DrafterConfig", "DrafterStats", "GroupDrafter", "HistoryResponse",
           "history_from_records"]
