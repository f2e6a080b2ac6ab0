"""Draft chains (`DrafterConfig.chain`, `spec.chain_drafts`): a draft continued past where
one suffix-tree query stops. Pure logic over `pipeline.drafting.suffix_tree`."""

from __future__ import annotations

from pipeline.drafting.inputs import DrafterConfig
from pipeline.drafting.suffix_tree import Draft


def chain_draft(tree, context: list[int], draft: Draft, max_tokens: int,
                cfg: DrafterConfig) -> Draft:
    """`draft` continued past where one query stops (`DrafterConfig.chain`).

    One query drafts at most max_depth - match_len tokens (the tree indexes suffixes of
    max_depth tokens) and at most max_spec_factor * match_len, so drafts stay short even
    where every earlier response continued the same way. Here the tree that served the
    draft is asked again with the draft appended to the context, and again, until the
    cap, an empty answer, or the path probability (carried over: the product of each
    query's) falling below min_path_prob. Drafts only change speed, never samples."""
    if not draft.token_ids:
        return draft
    tokens, probs = list(draft.token_ids), list(draft.probs)
    while len(tokens) < max_tokens:
        carried = probs[-1]
        if carried <= cfg.min_path_prob:
            break
        more = tree.speculate(context + tokens, max_tokens - len(tokens),
                              cfg.min_path_prob / carried, cfg.max_spec_factor,
                              cfg.max_spec_offset)
        if not more.token_ids:
            break
        tokens += more.token_ids
        probs += [carried * q for q in more.probs]
    if len(tokens) == len(draft.token_ids):
        return draft
    return Draft(tokens, probs, sum(probs), draft.match_len)


__all__ = ["chain_draft"]
