"""Draft chains (`DrafterConfig.chain`): a draft that one suffix-tree query cuts short where
the tree's depth ends is continued from the same tree, with the path probability carried
over (pure logic on the real C++ tree, no engine)."""

from __future__ import annotations

from pipeline.drafting.chain import chain_draft
from pipeline.drafting.inputs import DrafterConfig
from pipeline.drafting.suffix_tree import SuffixTree

CFG = DrafterConfig(max_depth=8, min_path_prob=0.1, max_spec_factor=1.0)


def one_query(tree, context, cap, cfg=CFG):
    return tree.speculate(context, cap, cfg.min_path_prob, cfg.max_spec_factor,
                          cfg.max_spec_offset)


def test_a_response_seen_before_is_drafted_past_the_trees_depth():
    tree = SuffixTree(CFG.max_depth)
    tree.extend(0, list(range(100, 160)))
    context = list(range(100, 110))
    first = one_query(tree, context, 24)
    assert 0 < len(first) < 8  # one query: at most max_depth - match_len tokens
    chained = chain_draft(tree, context, first, 24, CFG)
    assert chained.token_ids == list(range(110, 134))  # the cap, all of it the old response
    assert chained.probs == [1.0] * 24 and chained.score == 24.0
    assert chained.match_len == first.match_len
    # never past the cap, and a draft already at the cap comes back as it was
    assert chain_draft(tree, context, first, len(first), CFG) is first


def test_the_carried_path_probability_stops_the_chain():
    tree = SuffixTree(CFG.max_depth)
    stem = list(range(200, 212))
    for i, tail in enumerate(([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6, 7], [9, 9, 9, 9])):
        tree.extend(i, stem + tail)  # four responses, one stem; they part after it
    context = stem[:6]
    first = one_query(tree, context, 32)
    chained = chain_draft(tree, context, first, 32, CFG)
    assert chained.token_ids[:6] == stem[6:]
    probs = chained.probs
    assert all(a >= b for a, b in zip(probs, probs[1:]))  # non-increasing along the path
    assert probs[-1] >= CFG.min_path_prob
    # where three of four go on with 1, 2 and then split, the draft follows the majority
    # as long as the carried probability allows
    assert chained.token_ids[6:8] == [1, 2]
    strict = DrafterConfig(max_depth=8, min_path_prob=0.7, max_spec_factor=1.0)
    short = chain_draft(tree, context, one_query(tree, context, 32, strict), 32, strict)
    assert len(short) < len(chained) and short.probs[-1] >= 0.7


def test_an_empty_draft_stays_empty_and_the_config_can_turn_chains_off():
    from pipeline.config.schema import SpecConfig
    from pipeline.drafting.build import drafter_config

    tree = SuffixTree(CFG.max_depth)
    tree.extend(0, [1, 2, 3])
    empty = one_query(tree, [7, 8, 9], 8)
    assert not empty.token_ids and chain_draft(tree, [7, 8, 9], empty, 8, CFG) is empty
    assert drafter_config(SpecConfig(method="history+group")).chain is True
    assert drafter_config(SpecConfig(method="history+group", chain_drafts=False)).chain is False
