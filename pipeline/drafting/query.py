"""Which draft a running request gets: the trees asked and in what order, the sibling memo,
and where a draft is chained. Pure logic over `pipeline.drafting.suffix_tree`; the
drafter (`pipeline.drafting.drafter`) owns the trees and the requests.

`best` asks the prompt's tree first, then the request's own tree (siblings off, or as
`DrafterConfig.own_tree` says: by default in thin passes), then the
global tree (only where the prompt's trees' best draft scores below
`DrafterConfig.global_below`, by default less than one expected token), and keeps the
best-scoring draft (score = expected accepted tokens; ties go to the prompt's
own tree). A draft of max_tokens tokens all at probability 1 cannot be beaten, so no
further tree is asked for it. GRPO siblings often share their context (all of them at
T = 0, their first tokens at any temperature): a sibling asking with the context, cap and
tree versions of its prompt's last draft gets that draft without asking the trees.

Where chains pay (`DrafterConfig.chain`, `pipeline.drafting.chain`): a chained draft costs
more tree queries, on every pass's critical path, and more verified tokens, most of them
rejected where the path is uncertain. A thin pass (running requests x (1 + cap) at most
`thin_pass_tokens`: memory-bound on a GPU, about the same cost whatever it verifies)
chains every draft; a fuller one only those of the `chain_longest` share of requests
predicted to end last (the step's critical path: generated + predicted remaining tokens,
`pipeline.drafting.remaining`) and of requests whose last draft was accepted whole
(`LiveRequest.sure`). Measured in docs/speculation.md ("Draft chains").
"""

from __future__ import annotations

from itertools import repeat
from typing import Iterable, Mapping

# Context tokens the presumed next token is guessed from: a guess is only checked, never
# drafted, and the tree's match loop costs the square of the context's length.
GUESS_CONTEXT = 8

from pipeline.drafting.chain import chain_draft
from pipeline.drafting.global_tree import GlobalTree
from pipeline.drafting.inputs import DrafterConfig
from pipeline.drafting.live import LiveRequest, LiveSet
from pipeline.drafting.pass_caps import within
from pipeline.drafting.prompt_state import LastDraft, PromptState
from pipeline.drafting.remaining import RemainingTracker
from pipeline.drafting.suffix_tree import Draft, SuffixTree, match_needed


class DraftChooser:
    """The draft of one request from its trees, and which requests of a pass chain."""

    def __init__(self, config: DrafterConfig, global_tree: GlobalTree, live: LiveSet,
                 remaining: RemainingTracker):
        self.config = config
        self._global = global_tree
        self._live = live
        self._remaining = remaining

    def thin(self, caps: list[int]) -> bool:
        """Whether a pass with these caps is thin: running requests x (1 + the largest
        cap) at most `thin_pass_tokens`."""
        return within(len(self._live.running), max(caps, default=0), self.config.thin_pass_tokens)

    def chain_always(self, reqs: list[LiveRequest], caps: list[int],
                     prompts: Mapping[str, PromptState], thin: bool) -> Iterable[bool]:
        """Per request of this pass: chain its draft whatever its last draft's fate (a
        thin pass, or a request predicted to end last)."""
        if not self.config.chain:
            return repeat(False)
        if thin:
            return repeat(True)
        return self.longest(reqs, prompts)

    def longest(self, reqs: list[LiveRequest], prompts: Mapping[str, PromptState]) -> list[bool]:
        """Which of these requests are predicted to end last: the `chain_longest` share
        with the longest predicted responses (generated + predicted remaining tokens;
        ties included)."""
        n = round(self.config.chain_longest * len(reqs))
        if n <= 0:
            return [False] * len(reqs)
        items = [(r.req_id, r.key, r.end - len(prompts[r.key].prompt_ids)) for r in reqs]
        totals = [g + m for (_, _, g), (m, _) in
                  zip(items, self._remaining.estimate_many(items))]
        cut = sorted(totals)[len(totals) - n]
        return [t >= cut for t in totals]

    def best(self, req: LiveRequest, p: PromptState, tree: SuffixTree, max_tokens: int,
             context: list[int], chain: bool, own: bool) -> tuple[Draft, str]:
        """The best-scoring draft of the request's trees for `context`, and the tree that
        served it ("prompt", "own" or "global"). chain: a draft that stops short of its
        cap is chained (with `DrafterConfig.chain`); own: the request's own tree is asked."""
        cfg, global_tree = self.config, self._global
        chain = cfg.chain and chain
        # siblings share a draft while its trees are all in the key (not their own)
        memo = cfg.use_siblings and not cfg.global_live and not own
        if memo:
            last, versions = p.last, (tree.version, global_tree.tree.version, chain)
            if last is not None and last.versions == versions \
                    and last.max_tokens == max_tokens and last.context == context:
                return last.draft, last.source
        # the first query needs no longer match than a full-length draft; a chain's own
        # queries (`chain_draft`) keep the whole context, where the drafted tokens it ends
        # in are matched with all the context there is
        asked = context[-(match_needed(max_tokens, cfg.max_spec_factor, cfg.max_spec_offset,
                                       cfg.max_depth) + 1):]
        args = (asked, max_tokens, cfg.min_path_prob, cfg.max_spec_factor,
                cfg.max_spec_offset)
        best, source = tree.speculate(*args), "prompt"
        if own and req.own is not None and best.score < max_tokens:
            d = req.own.speculate(*args)
            if d.score > best.score:
                best, source = d, "own"
        if cfg.use_global and (not best.token_ids or best.score < cfg.global_below):
            if cfg.global_live:
                global_tree.flush(self._live.take_unsent())
            if best.score < max_tokens and global_tree.num_seqs:
                d = global_tree.speculate(*args)
                if d.score > best.score:
                    best, source = d, "global"
        if chain and best.token_ids and len(best.token_ids) < max_tokens:
            tree_of = {"prompt": tree, "own": req.own, "global": global_tree}
            best = chain_draft(tree_of[source], context, best, max_tokens, cfg)
        if memo:
            p.last = LastDraft(versions, max_tokens, context, best, source)
        return best, source


    def versions(self, req: LiveRequest, tree: SuffixTree) -> tuple[int, int, int]:
        """What a draft depends on besides context and cap: the versions of its trees."""
        return (tree.version, self._global.tree.version,
                -1 if req.own is None else req.own.version)

    def presumed(self, req: LiveRequest, tree: SuffixTree, cap: int, context: list[int],
                 chain: bool, own: bool) -> tuple[Draft, str] | None:
        """The (draft, source) `presume_steps` worked out for this request, if it was
        worked out for this cap, context, chaining, own-tree rule and trees' versions."""
        pre = req.presumed
        if pre is None or pre[0] != cap or pre[5] != chain or pre[6] != own \
                or pre[2] != context or pre[1] != self.versions(req, tree):
            return None
        return pre[3], pre[4]

    def presume_steps(self, running: Iterable[LiveRequest], prompts: Mapping[str, PromptState],
                      own: bool):
        """Each running request's next draft worked out for the outcome its trees expect —
        its last draft accepted whole, then their most likely next token — at the same
        cap (`GroupDrafter.after_pass(presume=True)`), one request a step, the surest
        drafts first (the ones most likely accepted whole, and asked of long matches: the
        costliest queries); requests that got no draft last. Kept in `req.presumed` with
        the chain flag it was worked out for: a presumed draft is served only where a
        fresh query would chain the same way and ask the own trees as `own` says (the last
        pass's rule), so it is always the draft that query gives."""
        cfg = self.config
        args = (1, 0.0, cfg.max_spec_factor, cfg.max_spec_offset)
        order = sorted((r for r in running if r.sent is not None), key=lambda r: -r.sent[2])
        for req in order:
            tokens, cap, _ = req.sent
            p = prompts[req.key]
            tree = p.tree
            if tree is None:
                continue
            context = req.tokens[-req.keep:] + tokens  # all of the draft accepted
            guess = tree.speculate(context[-GUESS_CONTEXT:], *args)
            if not guess.token_ids and own and req.own is not None:
                guess = req.own.speculate(context[-GUESS_CONTEXT:], *args)
            if guess.token_ids:
                context = (context + guess.token_ids)[-req.keep:]  # and the next token
                # whether the next pass chains this draft: its last draft accepted whole
                # makes it `sure` when that draft had tokens; a pass that chains every draft
                # (thin, or the request among the longest) is known only then, so the flag
                # is checked against the pass's own before the presumed draft is used
                chain = bool(tokens)
                best, source = self.best(req, p, tree, cap, context, chain, own)
                req.presumed = (cap, self.versions(req, tree), context, best, source, chain,
                                own)
            yield


__all__ = ["DraftChooser", "GUESS_CONTEXT"]
