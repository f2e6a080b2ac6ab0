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


def full_batch(**kw) -> DrafterConfig:
    """A drafter that takes every pass as a full one and no request as the step's last
    (chains only on sure paths)."""
    return DrafterConfig(max_depth=8, min_path_prob=0.1, max_spec_factor=1.0,
                         use_global=False, thin_pass_tokens=0, chain_longest=0.0, **kw)


def test_in_a_full_batch_only_a_request_whose_last_draft_was_accepted_whole_chains():
    from pipeline.drafting.drafter import GroupDrafter
    from pipeline.history.store import prompt_hash
    from pipeline.drafting.inputs import HistoryResponse

    prompt, old = [90, 91, 92, 93], list(range(100, 160))
    d = GroupDrafter(full_batch())
    d.set_history(prompt_hash(prompt), [HistoryResponse(old)])
    d.start("r0", prompt, old[:10])
    first = d.draft("r0", 24)  # no draft before it: one query, cut by the tree's depth
    assert first.token_ids == old[10:14]
    d.append("r0", old[10:15])  # all four accepted, and the target's next token
    assert d.draft("r0", 24).token_ids == old[15:39]  # a sure path: chained to the cap
    d.append("r0", old[15:17] + [old[30]])  # two accepted, then the target went elsewhere
    again = d.draft("r0", 24)
    assert again.token_ids == old[31:32]  # one query again: a 1-token match drafts 1 token
    # the same request and context with chains off: never longer
    off = GroupDrafter(full_batch(chain=False))
    off.set_history(prompt_hash(prompt), [HistoryResponse(old)])
    off.start("r0", prompt, old[:10])
    off.draft("r0", 24)
    off.append("r0", old[10:15])
    assert off.draft("r0", 24).token_ids == old[15:19]


def test_a_draft_a_budget_trimmed_is_judged_on_what_was_proposed():
    from pipeline.drafting.drafter import GroupDrafter
    from pipeline.history.store import prompt_hash
    from pipeline.drafting.inputs import HistoryResponse

    prompt, old = [90, 91, 92, 93], list(range(100, 160))
    d = GroupDrafter(full_batch())
    d.set_history(prompt_hash(prompt), [HistoryResponse(old)])
    d.start("r0", prompt, old[:10])
    assert d.draft("r0", 24).token_ids == old[10:14]
    d.cut("r0", 2)  # the budget proposed two of the four
    d.append("r0", old[10:13])  # both accepted, and the target's next token
    assert d.draft("r0", 24).token_ids == old[13:37]  # accepted whole: chained


def test_a_thin_pass_chains_every_draft():
    from pipeline.drafting.drafter import GroupDrafter
    from pipeline.history.store import prompt_hash
    from pipeline.drafting.inputs import HistoryResponse

    prompt, old = [90, 91, 92, 93], list(range(100, 160))
    # one running request asking for 24 tokens: a pass of 25 tokens, at most 25 is thin
    for limit, chained in ((25, True), (24, False)):
        d = GroupDrafter(DrafterConfig(max_depth=8, min_path_prob=0.1, max_spec_factor=1.0,
                                       use_global=False, thin_pass_tokens=limit,
                                       chain_longest=0.0))
        d.set_history(prompt_hash(prompt), [HistoryResponse(old)])
        d.start("r0", prompt, old[:10])
        first = d.draft("r0", 24).token_ids  # no draft before it
        assert first == (old[10:34] if chained else old[10:14])
    from pipeline.config.schema import SpecConfig
    from pipeline.drafting.build import drafter_config
    spec = SpecConfig(method="history+group", thin_pass_tokens=0)
    assert drafter_config(spec).thin_pass_tokens == 0


def test_in_a_full_batch_the_requests_predicted_to_end_last_chain_every_draft():
    from pipeline.drafting.drafter import GroupDrafter
    from pipeline.history.store import prompt_hash
    from pipeline.drafting.inputs import HistoryResponse

    short, long_ = [80, 81, 82, 83], [90, 91, 92, 93]
    old = list(range(100, 160))
    d = GroupDrafter(DrafterConfig(max_depth=8, min_path_prob=0.1, max_spec_factor=1.0,
                                   use_global=False, thin_pass_tokens=0, chain_longest=0.5))
    # the same response tokens, but one prompt's history ran 60 tokens, the other's 12
    d.set_history(prompt_hash(long_), [HistoryResponse(old)])
    d.set_history(prompt_hash(short), [HistoryResponse(old[:12])])
    d.start("long", long_, old[:6])
    d.start("short", short, old[:6])
    drafts = dict(zip(("long", "short"), d.draft_many(["long", "short"], [24, 24])))
    assert drafts["long"].token_ids == old[6:30]  # predicted to end last: chained
    assert drafts["short"].token_ids == old[6:10]  # one query: cut by the tree's depth
