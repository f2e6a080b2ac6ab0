"""How much context a draft query asks the tree (`suffix_tree.match_needed`): matches
longer than a full-length draft needs are not asked (pure logic on the real C++ tree)."""

from __future__ import annotations

import pytest

from pipeline.drafting.suffix_tree import SuffixTree, match_needed


@pytest.mark.parametrize("cap,factor,offset,want", [
    (8, 0.5, 0.0, 16),    # the drafter's default: a 16-token match drafts 8
    (16, 0.5, 0.0, 24),   # a thin pass's 16 would need 32: the tree's depth
    (8, 1.0, 0.0, 8),     # vLLM's factor
    (8, 0.5, 2.0, 12),    # an offset lowers it
    (1, 0.5, 0.0, 2),
    (7, 0.3, 0.0, 24),    # 7 / 0.3 = 23.3: 24
    (6, 0.3, 0.0, 20),    # exactly 20 (no rounding up past it)
    (8, 0.0, 0.0, 24),    # no factor: every match
])
def test_the_match_a_full_length_draft_needs(cap, factor, offset, want):
    assert match_needed(cap, factor, offset, max_depth=24) == want


def test_a_trimmed_context_still_drafts_to_the_cap():
    tree = SuffixTree(24)
    tree.extend(0, list(range(100, 200)))
    context = list(range(100, 140))
    need = match_needed(8, 0.5, 0.0, 24)
    full = tree.speculate(context, 8, 0.1, 0.5)
    trimmed = tree.speculate(context[-(need + 1):], 8, 0.1, 0.5)
    assert trimmed.token_ids == full.token_ids == list(range(140, 148))
    # one token fewer and the longest match can no longer draft the whole cap
    short = tree.speculate(context[-need:], 8, 0.1, 0.5)
    assert len(short.token_ids) == 7
