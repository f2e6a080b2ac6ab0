"""The drafter (history + live siblings + self, per-prompt and global trees): pure logic on
arctic-inference's C++ suffix tree, milliseconds."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.history.store import RolloutRecord, prompt_hash
from pipeline.drafting.drafter import GroupDrafter, source_shares
from pipeline.drafting.inputs import (GLOBAL_BELOW, DrafterConfig, HistoryResponse,
                                     history_from_records)
from pipeline.drafting.suffix_tree import SuffixTree

P = [90, 91, 92, 93]  # a prompt
Q = [80, 81, 82, 83]  # another prompt
R = [70, 71, 72, 73]


def drafter(**kw) -> GroupDrafter:
    kw.setdefault("max_spec_factor", 8.0)  # let short matches draft far in these small cases
    kw.setdefault("chain", False)  # one query per draft (chains: test_drafting_chain.py)
    return GroupDrafter(DrafterConfig(**kw))


def hist(*responses, rewards=None):
    rewards = rewards or [None] * len(responses)
    return [HistoryResponse(list(r), w) for r, w in zip(responses, rewards)]


def history_of(d: GroupDrafter, key: str) -> list[list[int]]:
    """The token ids of the history the drafter holds for prompt `key` (its state)."""
    d.settle()
    p = d._prompts.get(key)
    return [] if p is None else [h.tokens.tolist() for h in p.history]


def cached_prompts(d: GroupDrafter) -> list[str]:
    """Keys of the prompts whose tree the drafter holds, least recently used first."""
    d.settle()
    return list(d._table.trees)


# ---------------------------------------------------------------- suffix tree wrapper

def test_suffix_tree_wrapper_counts_and_cut():
    t = SuffixTree(8)
    t.extend(1, [1, 2, 3, 4])
    t.extend(2, [1, 2, 3, 5])
    t.extend(3, [1, 2, 3, 5])
    d = t.speculate([9, 1, 2], 8, 0.1, max_spec_factor=8.0)
    assert d.token_ids == [3, 5] and d.probs == pytest.approx([1.0, 2 / 3])
    assert d.score == pytest.approx(5 / 3) and d.match_len == 2
    assert t.speculate([9, 1, 2], 8, 0.7, max_spec_factor=8.0).token_ids == [3]
    t.remove(2)
    t.remove(3)
    t.remove(42)  # unknown ids are ignored
    assert t.speculate([9, 1, 2], 8, 0.1, max_spec_factor=8.0).token_ids == [3, 4]
    assert t.num_seqs == 1 and t.memory_bytes() > 0


# ---------------------------------------------------------------- history

def test_prompt_with_history_drafts_its_earlier_continuation():
    d = drafter(use_siblings=False, use_global=False)
    d.set_history(prompt_hash(P), hist([1, 2, 3, 4, 5, 6, 7, 8]))
    d.start("r0", P, [1])  # prefill sampled token 1
    draft = d.draft("r0", 5)
    assert draft.token_ids == [2, 3, 4, 5, 6] and draft.probs == pytest.approx([1.0] * 5)
    d.append("r0", [2, 3, 4])
    assert d.draft("r0", 16).token_ids == [5, 6, 7, 8]


def test_first_response_token_is_drafted_from_the_prompt_tail():
    d = drafter(use_siblings=False, use_global=False)
    d.set_history(prompt_hash(P), hist([1, 2, 3]))
    d.start("r0", P + [5, 6], [])  # another prompt: the history belongs to P only
    assert d.draft("r0", 4).token_ids == []
    d.start("r1", P, [])
    assert d.draft("r1", 4).token_ids == [1, 2, 3]


def test_history_is_keyed_by_prompt_and_replaced_not_appended():
    d = drafter(use_siblings=False, use_global=False)
    d.set_history(prompt_hash(P), hist([1, 2, 3, 4]))
    d.set_history(prompt_hash(Q), hist([1, 2, 7, 7]))
    d.start("p", P, [1])
    d.start("q", Q, [1])
    assert d.draft("p", 8).token_ids == [2, 3, 4]
    assert d.draft("q", 8).token_ids == [2, 7, 7]
    d.set_history(prompt_hash(P), hist([1, 2, 9, 9]))  # refreshed after a step
    assert d.draft("p", 8).token_ids == [2, 9, 9]
    assert history_of(d, prompt_hash(P)) == [[1, 2, 9, 9]]


def test_history_refresh_keeps_unchanged_responses_in_the_tree():
    d = drafter(use_siblings=False)
    d.set_history(prompt_hash(P), hist([1, 2, 3, 4], [1, 2, 3, 5]))
    d.start("r", P, [1, 2])
    assert d.draft("r", 8).probs == pytest.approx([1.0, 0.5])
    before = d.stats().tree_bytes
    d.set_history(prompt_hash(P), hist([1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 3, 4]))
    draft = d.draft("r", 8)
    assert draft.token_ids == [3, 5] and draft.probs == pytest.approx([1.0, 2 / 3])
    assert history_of(d, prompt_hash(P)) == [[1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 3, 4]]
    d.set_history(prompt_hash(P), hist([1, 2, 3, 4]))
    assert d.draft("r", 8).probs == pytest.approx([1.0, 1.0])
    assert d.stats().tree_bytes <= before


def test_history_from_store_records():
    recs = [RolloutRecord("p0", prompt_hash(P), 0, 0, 0, k, [1, 2, k], 3, "stop", float(k), 0.1)
            for k in range(2)]
    by_key = history_from_records(recs)
    assert list(by_key) == [prompt_hash(P)]
    assert [(h.token_ids, h.reward) for h in by_key[prompt_hash(P)]] == [([1, 2, 0], 0.0),
                                                                        ([1, 2, 1], 1.0)]


# ---------------------------------------------------------------- siblings

def test_sibling_tokens_are_drafted_and_dropped_when_the_group_ends():
    d = drafter(use_history=False, use_global=False)
    d.start("a", P, [1])
    d.append("a", [2, 3, 4, 5])
    d.start("b", P, [1])
    assert d.draft("b", 8).token_ids == []  # a's newest pass is held back
    d.append("a", [6])
    assert d.draft("b", 8).token_ids == [2, 3, 4, 5]
    d.finish("a")  # finished: in the tree whole while its group runs
    assert d.draft("b", 8).token_ids == [2, 3, 4, 5, 6]
    d.finish("b")  # group over: live responses dropped
    d.start("c", P, [1])
    assert d.draft("c", 8).token_ids == []


def test_a_live_sequence_holds_the_output_only():
    # The prompt is in its tree already (and, with history, before every history
    # response): a sibling's copy would cost tree work per token and add only counts.
    d = drafter(use_global=False)
    d.set_history(prompt_hash(P), [HistoryResponse([1, 2, 3, 4])])
    d.start("a", P, [1])
    d.append("a", [2])
    d.append("a", [3])
    d.start("b", P, [1])
    d.append("b", [2])
    assert d.draft("b", 2).token_ids == [3, 4]
    tree = d._prompts[prompt_hash(P)].tree
    a_seq = d._live.running["a"].local_seq
    assert tree.length(a_seq) == 2  # 1 2 (3 held back), no prompt tokens


def test_the_drafter_times_its_parts():
    from pipeline.drafting.stats import DrafterTimes

    d = drafter(use_global=False)
    assert d.times() == DrafterTimes()
    d.start("a", P, [1])
    d.append("a", [2])
    d.append("a", [3])
    d.start("b", P, [1])
    d.append("b", [2])
    d.draft("b", 2)
    t = d.times()
    assert t.live_in > 0 and t.queries > 0 and t.group_ends == 0
    t.live_in = -1.0  # a copy
    assert d.times().live_in > 0
    d.end_step()  # the group ends: its live sequences leave the tree
    later = d.times()
    assert later.group_ends > 0 and later.minus(d.times()) == DrafterTimes()
    assert later.minus(DrafterTimes(live_in=later.live_in)).live_in == 0
    assert DrafterTimes(1, 2, 3).plus(DrafterTimes(1, 1, 1)) == DrafterTimes(2, 3, 4)


def test_announced_group_keeps_finished_siblings_until_all_finished():
    d = drafter(use_history=False, use_global=False)
    d.expect_group(P, 3)
    d.start("a", P, [1, 2, 3, 4])
    d.finish("a")  # no sibling running, but the group has 3 members
    d.start("b", P, [1])
    assert d.draft("b", 8).token_ids == [2, 3, 4]
    d.finish("b")
    d.start("c", P, [1])
    assert d.draft("c", 8).token_ids == [2, 3, 4]
    d.finish("c")
    d.start("d", P, [1])  # the group of three is over
    assert d.draft("d", 8).token_ids == []


def test_siblings_of_other_prompts_are_not_in_the_prompt_tree():
    d = drafter(use_history=False, use_global=False)
    d.start("a", P, [1, 2, 3, 4])
    d.append("a", [5])
    d.start("q", Q, [1])
    assert d.draft("q", 8).token_ids == []


def test_preempted_request_resumes_with_its_output():
    d = drafter(use_history=False, use_global=False)
    d.start("a", P, [1, 2, 3])
    d.start("b", P, [1])
    d.finish("a")  # preempted
    d.start("a", P, [1, 2, 3, 4])  # resumed with its output so far
    d.append("a", [5])
    # a enters up to its previous pass (1 2 3 4); were its pre-preemption sequence
    # (1 2 3) still there, it would add a branch ending after 3: [1, 1, 0.5]
    draft = d.draft("b", 8)
    assert draft.token_ids == [2, 3, 4] and draft.probs == pytest.approx([1.0] * 3)
    with pytest.raises(ValueError, match="already running"):
        d.start("a", P, [])


# ---------------------------------------------------------------- self drafting

@pytest.mark.parametrize("method", ["history", "group", "history+group"])
def test_self_drafting_with_empty_history(method):
    d = GroupDrafter(DrafterConfig.for_method(method, max_spec_factor=8.0, chain=False))
    d.start("r", P, [5, 6, 7, 8, 5, 6])  # the output repeats itself
    d.append("r", [7])
    assert d.draft("r", 8).token_ids[:2] == [8, 5]
    d.start("s", [4, 1, 2, 3, 4, 1], [2])  # copying from the prompt
    assert d.draft("s", 2).token_ids == [3, 4]


def test_own_newest_tokens_do_not_dilute_the_own_tree():
    # The context always ends where the request's own sequence ends; holding the newest
    # tokens back keeps that end from counting as a continuation-less branch.
    d = drafter(use_siblings=False, use_global=False)
    d.start("r", P, [1, 2, 3, 1, 2, 3, 1])
    d.append("r", [2])
    draft = d.draft("r", 8)
    assert draft.token_ids[:2] == [3, 1] and draft.probs[:2] == pytest.approx([1.0, 1.0])


def test_running_siblings_enter_the_tree_up_to_their_previous_pass():
    """A running sibling's newest tokens are held back (it would end where the drafting
    request's context ends: a count with no continuation); a finished one enters whole."""
    d = drafter(use_history=False, use_global=False)
    d.start("a", P, [1])
    d.start("b", P, [])
    d.append("a", [2])
    d.append("a", [3])  # a: 1 2 | 3 (the last pass held back)
    d.append("b", [1])  # b: its own sequence held back to the prompt
    draft = d.draft("b", 4)
    assert draft.token_ids == [2] and draft.probs == pytest.approx([1.0])  # no dilution
    d.finish("a")
    assert d.draft("b", 4).token_ids == [2, 3]


def test_for_method_rejects_unknown_names():
    with pytest.raises(ValueError, match="expected one of"):
        DrafterConfig.for_method("ngram")


# ---------------------------------------------------------------- global vs local

def test_global_tree_drafts_a_format_shared_across_prompts():
    d = drafter(use_siblings=False)
    for k, prompt in enumerate([Q, R]):
        d.set_history(prompt_hash(prompt), hist([10 + k, 40, 41, 42, 43, 44]))
    d.start("p", P, [12, 40])  # P has no history: only the global tree knows "40 41 ..."
    draft = d.draft("p", 8)
    assert draft.token_ids == [41, 42, 43, 44]
    assert d.stats().wins["global"] == 1


def test_better_scoring_local_draft_beats_the_global_one():
    d = drafter(use_siblings=False)
    d.set_history(prompt_hash(Q), hist([40, 41, 50], [40, 41, 51], [40, 41, 52]))
    d.set_history(prompt_hash(P), hist([40, 41, 60, 61]))
    d.start("p", P, [40])
    assert d.draft("p", 8).token_ids == [41, 60, 61]
    d.start("q", Q, [40])  # Q's own tree is as good as the global one: ties go local
    assert d.draft("q", 1).token_ids == [41]
    wins = d.stats().wins
    assert wins["prompt"] == 2 and wins["global"] == 0


def test_the_global_tree_is_asked_where_the_prompt_trees_expect_less_than_one_token():
    """Measured (docs/speculation.md, "Trees"): a higher-scoring global draft displacing a
    good draft of the prompt's own cost passes at T = 1 (the global tree's counts look sure
    for patterns this prompt's responses do not follow); where the prompt's trees expect
    less than one accepted token, the global tree's shared phrasing drafted better."""
    good = [[40, 41, 42], [40, 41, 45]]  # P's own: "40 41", then 42 or 45: score 1.5
    weak = [[40, 41], [40, 46], [40, 47]]  # after 40 any of three tokens: score 1/3
    for own, below, want, source in ((good, GLOBAL_BELOW, [41, 42], "prompt"),
                                      (good, 8.0, [41, 43, 44], "global"),
                                      (weak, GLOBAL_BELOW, [41, 43, 44], "global"),
                                      (weak, 0.0, [41], "prompt")):
        d = drafter(use_siblings=False, global_below=below)
        # another prompt's history makes "40 41 43 44" near certain in the global tree
        d.set_history(prompt_hash(Q), hist(*[[40, 41, 43, 44]] * 6))
        d.set_history(prompt_hash(P), hist(*own))
        d.start("p", P, [40])
        assert d.draft("p", 8).token_ids[:len(want)] == want, (own, below)
        assert d.stats().wins[source] == 1, (own, below)
        d.start("fresh", R, [40])  # no history of its own: the global tree serves it
        assert d.draft("fresh", 8).token_ids[:3] == [41, 43, 44]


def test_with_a_draft_model_the_global_tree_is_a_fallback_only():
    """The draft model drafts where the prompt's trees offer little (measured: the global
    tree's weak drafts displaced its better ones there)."""
    assert DrafterConfig.for_method("history+group").global_below == GLOBAL_BELOW > 0
    assert DrafterConfig.for_method("history+group+model").global_below == 0.0
    assert DrafterConfig.for_method("history+group+model", global_below=2.0).global_below == 2.0


def test_spec_global_below_sets_the_threshold_and_null_keeps_the_methods():
    from pipeline.config import load_config
    from pipeline.config.load import ConfigError
    from pipeline.drafting.build import drafter_config

    for method, value, want in (("history+group", None, GLOBAL_BELOW),
                                ("history+group+model", None, 0.0),
                                ("history+group", "2.5", 2.5),
                                ("history+group+model", "1", 1.0)):
        overrides = [f"spec.method={method}"] + ([f"spec.global_below={value}"] if value else [])
        assert drafter_config(load_config(None, overrides).spec).global_below == want
    with pytest.raises(ConfigError, match="spec.global_below"):
        load_config(None, ["spec.global_below=-1"])


def test_global_history_is_fifo_capped():
    d = drafter(use_siblings=False, max_global_responses=2)
    for k, prompt in enumerate([Q, R, [60, 61]]):
        d.set_history(prompt_hash(prompt), hist([k, 30 + k, 31 + k, 32 + k]))
    d.start("p", P, [0, 30])  # Q's response was pushed out of the global tree
    assert d.draft("p", 8).token_ids == []
    d.start("p2", P + [1], [1, 31])
    assert d.draft("p2", 8).token_ids == [32, 33]


# ---------------------------------------------------------------- path probability

def test_draft_is_cut_where_the_path_probability_falls_below_the_threshold():
    responses = hist([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7, 7], [1, 2, 3, 8, 8])
    for min_prob, want in [(0.6, [2, 3]), (0.5, [2, 3, 4]), (0.25, [2, 3, 4, 5])]:
        d = drafter(use_siblings=False, use_global=False, min_path_prob=min_prob)
        d.set_history(prompt_hash(P), responses)
        d.start("r", P, [1])
        draft = d.draft("r", 8)
        assert draft.token_ids == want, min_prob
        assert draft.probs == pytest.approx([1.0, 1.0, 0.5, 0.25][: len(want)])


def test_max_tokens_caps_the_draft():
    d = drafter(use_siblings=False, use_global=False)
    d.set_history(prompt_hash(P), hist(list(range(1, 20))))
    d.start("r", P, [1])
    assert d.draft("r", 3).token_ids == [2, 3, 4]
    assert d.draft("r", 0).token_ids == [] and d.draft("unknown", 4).token_ids == []


# ---------------------------------------------------------------- reward weighting

def test_reward_weighting_prefers_the_branch_of_the_better_response():
    responses = hist([1, 2, 3, 4, 50], [1, 2, 3, 4, 60], rewards=[0.0, 1.0])
    plain = drafter(use_siblings=False, use_global=False, min_path_prob=0.1)
    plain.set_history(prompt_hash(P), responses)
    plain.start("r", P, [1, 2, 3])
    assert plain.draft("r", 8).probs == pytest.approx([1.0, 0.5])
    weighted = drafter(use_siblings=False, use_global=False, reward_weighted=True,
                       reward_copies=2)
    weighted.set_history(prompt_hash(P), responses)
    weighted.start("r", P, [1, 2, 3])
    draft = weighted.draft("r", 8)  # the rewarded response counts 3 times, the other once
    assert draft.token_ids == [4, 60] and draft.probs == pytest.approx([1.0, 0.75])
    assert weighted.stats().history_responses == 2  # copies live in the tree only


def test_reward_weighting_without_rewards_or_spread_counts_each_once():
    d = drafter(use_siblings=False, use_global=False, reward_weighted=True)
    d.set_history(prompt_hash(P), hist([1, 2, 50], [1, 2, 60], rewards=[1.0, 1.0]))
    d.start("r", P, [1])
    assert d.draft("r", 8).probs == pytest.approx([1.0, 0.5])


# ---------------------------------------------------------------- memory bound

def test_trees_of_idle_prompts_are_evicted_lru_and_rebuilt_on_return():
    d = drafter(use_siblings=False, use_global=False, max_cached_prompts=2)
    prompts = [[1, k] for k in range(4)]
    for k, prompt in enumerate(prompts):
        d.set_history(prompt_hash(prompt), hist([5, 6, 7, 8 + k]))
    d.start("idle", prompts[3], [5])  # started but never drafted: no tree is built
    d.finish("idle")
    for k, prompt in enumerate(prompts[:3]):
        d.start(k, prompt, [5])
        assert d.draft(k, 8).token_ids == [6, 7, 8 + k]
        d.finish(k)
    assert cached_prompts(d) == [prompt_hash(prompts[1]), prompt_hash(prompts[2])]
    assert d.stats().trees == 2
    d.start("back", prompts[0], [5])  # evicted, rebuilt from its compact history
    assert d.draft("back", 8).token_ids == [6, 7, 8]
    assert cached_prompts(d) == [prompt_hash(prompts[2]), prompt_hash(prompts[0])]


def test_prompts_with_running_requests_are_never_evicted():
    d = drafter(use_siblings=False, use_global=False, max_cached_prompts=1)
    for k in range(3):
        d.set_history(prompt_hash([1, k]), hist([5, 6, 7 + k]))
        d.start(k, [1, k], [5])
    assert [d.draft(k, 8).token_ids for k in range(3)] == [[6, 7], [6, 8], [6, 9]]
    assert d.stats().trees == 3  # over the cap while all three run
    d.end_step()
    assert d.stats().trees == 1 and d.stats().live_requests == 0


def test_stats_report_history_and_memory():
    d = drafter()
    d.set_history(prompt_hash(P), hist([1, 2, 3], [1, 2]))
    d.start("r", P, [1])
    s = d.stats()
    assert (s.prompts, s.history_responses, s.history_tokens, s.live_requests) == (1, 2, 5, 1)
    assert s.tree_bytes > 0


def test_sources_count_which_tree_served_each_draft():
    """A request of a prompt with history drafts from its prompt tree; a request of a new
    prompt whose output matches another prompt's history drafts from the global tree."""
    d = drafter()
    d.set_history(prompt_hash(P), hist([1, 2, 3, 4, 5]))
    d.start("p", P, [1, 2])
    d.start("q", Q, [2, 3])  # Q has no history: only the global tree knows 3 -> 4 -> 5
    assert d.draft("p", 3).token_ids == [3, 4, 5]
    assert d.draft("q", 2).token_ids == [4, 5]
    d.draft("p", 0)  # asked for nothing: no draft, not counted
    assert d.sources() == {"prompt": 1, "own": 0, "global": 1}
    assert d.stats().wins == d.sources() and d.stats().drafts == 2
    assert source_shares(d.sources()) == {"prompt": 0.5, "own": 0.0, "global": 0.5}
    assert source_shares({"prompt": 0, "own": 0, "global": 0}) == {"prompt": 0.0, "own": 0.0,
                                                                   "global": 0.0}


def test_history_from_read_only_arrays():
    """The history index hands out read-only views of Arrow buffers; the C++ tree must
    still accept them (nanobind refuses read-only arrays unless they are copied)."""
    import numpy as np

    ids = np.arange(5, 25, dtype=np.int32)
    ids.flags.writeable = False
    d = GroupDrafter(DrafterConfig.for_method("history", max_spec_factor=8.0, chain=False))
    d.set_history(prompt_hash([1, 2, 3]), [HistoryResponse(ids)])
    d.start("r", [1, 2, 3], [5, 6, 7])
    assert d.draft("r", 4).token_ids == [8, 9, 10, 11]


# ---------------------------------------------------------------- live-token window

@pytest.mark.parametrize("method", ["history", "group", "history+group"])
def test_long_requests_draft_the_same_after_the_window_is_cut(method, monkeypatch):
    """Each request keeps only the tokens some tree has yet to receive (plus the context);
    cutting that window must not change a draft."""
    import random

    import pipeline.drafting.live as live

    def run() -> tuple[list[list[int]], int]:
        rng = random.Random(7)
        d = GroupDrafter(DrafterConfig.for_method(method, max_depth=8, max_spec_factor=4.0, chain=False))
        motif = [rng.randrange(1, 9) for _ in range(40)]
        d.set_history(prompt_hash(P), hist(motif * 3))
        for r in ("a", "b"):
            d.start(r, P, [motif[0]])
        out = []
        for t in range(300):
            for r in ("a", "b"):
                tok = motif[(t + 1) % 40] if rng.random() > 0.1 else rng.randrange(1, 9)
                d.append_many([r], [[tok]] if t % 2 else [np.asarray([tok])])
                if t % 7 == 0 or t > 280:
                    out.append(d.draft(r, 6).token_ids)
        return out, d._live.running["a"].base

    cut, base = run()
    assert base > 0 and any(cut)  # the window was cut, and there were drafts
    monkeypatch.setattr(live, "TRIM_SLACK", 10**9)  # never cut
    assert run() == (cut, 0)


def test_append_many_is_append_per_request():
    d1, d2 = drafter(), drafter()
    for d in (d1, d2):
        d.start("a", P, [1])
        d.start("b", P, [1])
    d1.append_many(["a", "b"], [[2, 3, 4], np.asarray([2], dtype=np.int64)])
    d1.append_many(["a", "b"], [[5], []])  # b emitted nothing: nothing changes for it
    d2.append("a", [2, 3, 4])
    d2.append("b", (2,))
    d2.append("a", [5])
    assert d1.draft("b", 4) == d2.draft("b", 4)
    assert d1.draft("b", 4).token_ids == [3, 4]  # a's last pass (5) is held back


def test_live_set_groups_and_global_queue():
    from pipeline.drafting.live import LiveSet, LiveState

    live = LiveSet(max_depth=4, siblings=True, to_global=True)
    live.expect("p", 2)
    a, _ = live.start("a", "p", [1, 2, 3, 4, 5, 6], [7])
    # the prompt tree gets its output only (the prompt is in that tree already)
    assert (a.local_pos, a.global_pos, a.end, a.context()) == (6, 6, 7, [3, 4, 5, 6, 7])
    b, _ = live.start("b", "p", [1, 2, 3, 4, 5, 6], [])
    live.append_many(["b", "a"], [[8], [9]])
    assert live.take_unsent() == [a, b] and live.take_unsent() == []  # first waiting first
    assert live.finish("a") == []  # b still runs
    assert (a.state, b.state) == (LiveState.FINISHED, LiveState.RUNNING)
    b2, replaced = live.start("a", "p", [1, 2, 3, 4, 5, 6], [7, 9])  # resumed
    assert replaced == [a] and live.members("p") == [b, b2]
    assert live.finish("b") == [] and live.finish("a") == [b, b2]  # the group ends
    assert live.members("p") == [] and live.running == {}


# ---------------------------------------------------------------- repeated contexts

def _count_speculate(monkeypatch) -> list:
    calls = []
    original = SuffixTree.speculate

    def counted(self, *args, **kw):
        calls.append(args[0])
        return original(self, *args, **kw)

    monkeypatch.setattr(SuffixTree, "speculate", counted)
    return calls


def test_siblings_with_the_same_context_share_one_tree_query(monkeypatch):
    """GRPO siblings in the same state (all of them at T = 0) get the draft the first one
    got, without asking the trees again, until a tree changes or the context differs
    (their own trees, which they do not share, stay out of it here)."""
    d = drafter(use_global=False, min_path_prob=0.6, own_tree="never")
    d.set_history(prompt_hash(P), hist([1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8, 9]))
    for r in ("a", "b", "c"):
        d.start(r, P, [1])
    calls = _count_speculate(monkeypatch)
    first = d.draft("a", 4)
    assert first.token_ids == [2, 3] and len(calls) == 1  # the history forks after 3
    assert d.draft("b", 4) == first and d.draft("c", 4) == first and len(calls) == 1
    assert d.draft("c", 2).token_ids == [2, 3] and len(calls) == 2  # another cap: asked
    assert d.sources()["prompt"] == 4  # every draft counted, served or remembered
    d.append_many(["a", "b", "c"], [[2, 3, 4], [2, 3, 4], [2, 3, 7]])
    assert d.draft("a", 4).token_ids == [5, 6] and len(calls) == 3  # the group fed the tree
    assert d.draft("b", 4).token_ids == [5, 6] and len(calls) == 3
    assert d.draft("c", 4).token_ids == [8, 9] and len(calls) == 4  # its own context


def test_a_rebuilt_tree_is_asked_again(monkeypatch):
    d = drafter(use_global=False, max_cached_prompts=1, own_tree="never")
    d.set_history(prompt_hash(P), hist([5, 6, 7]))
    d.set_history(prompt_hash(Q), hist([5, 6, 8]))
    d.start("p", P, [5])
    assert d.draft("p", 4).token_ids == [6, 7]
    d.finish("p")
    d.end_step()
    d.start("q", Q, [5])  # P's tree is evicted for Q's
    assert d.draft("q", 4).token_ids == [6, 8]
    d.finish("q")
    d.end_step()
    calls = _count_speculate(monkeypatch)
    d.start("p2", P, [5])  # same context as before, same tree version, but a new tree
    assert d.draft("p2", 4).token_ids == [6, 7] and len(calls) == 1


def test_suffix_tree_version_counts_changes():
    t = SuffixTree(4)
    t.extend(1, [])
    assert t.version == 0
    t.extend(1, [1, 2])
    t.extend(2, np.array([3], dtype=np.int32))
    t.remove(7)  # unknown: no change
    assert t.version == 2
    t.remove(1)
    assert t.version == 3


def _repeating(**kw) -> GroupDrafter:
    """Request "a" keeps repeating "7 8 9 5"; its history and a sibling continue "5 7 8"
    each another way."""
    d = drafter(use_global=False, min_path_prob=0.5, **kw)
    d.set_history(prompt_hash(P), hist([7, 8, 9, 5, 7, 8, 1], [7, 8, 9, 5, 7, 8, 2],
                                       [7, 8, 9, 5, 7, 8, 3]))
    d.start("a", P, [7, 8, 9, 5, 7, 8, 9, 5, 7, 8])
    d.start("b", P, [7, 8, 9, 5, 7, 8, 4])
    d.append("a", [9])  # the request's tokens up to here are in its trees
    return d


@pytest.mark.parametrize("own_tree,thin_pass_tokens,own", [
    ("thin", 296, True),  # 2 requests x (1 + 4) tokens: a thin pass
    ("thin", 9, False),  # a full one: the own tree is neither fed nor asked
    ("always", 9, True),
    ("never", 296, False),
])
def test_a_request_that_repeats_itself_drafts_from_its_own_tree(own_tree, thin_pass_tokens, own):
    """In its prompt's tree the request's text is one sequence among its history's and its
    siblings', which match the same context with other continuations: the repetition the
    request keeps making is cut at min_path_prob there. Its own tree counts it alone; it is
    asked as spec.own_tree says (by default only in thin passes)."""
    d = _repeating(own_tree=own_tree, thin_pass_tokens=thin_pass_tokens)
    draft = d.draft("a", 4)
    if own:
        # the own tree has 9 after "5 7 8" once of the twice it saw "7 8" (the last one is
        # its context's end): probability 0.5, kept
        assert draft.token_ids == [5, 7, 8, 9] and draft.probs == pytest.approx([1, 1, 1, 0.5])
        assert d.sources() == {"prompt": 0, "own": 1, "global": 0}
    else:
        # after "5 7 8" the prompt's tree has 1, 2, 3, 4 and 9 once each: cut there
        assert draft.token_ids == [5, 7, 8] and d.sources() == {"prompt": 1, "own": 0, "global": 0}
        assert d._live.running["a"].own is None  # never built


def test_own_trees_are_built_ahead_when_passes_near_thin():
    """After a pass within twice the thin size the running requests' own trees are built
    in the background, so the first thin pass finds them; the drafts are the same."""
    ahead = _repeating(thin_pass_tokens=9)  # 2 x (1 + 4) = 10: not thin, within twice
    assert ahead.draft("a", 4).token_ids == [5, 7, 8]
    ahead.after_pass()
    ahead.settle()
    assert all(r.own is not None for r in ahead._live.running.values())
    ahead.append("a", [5])
    fresh = _repeating(thin_pass_tokens=9)
    fresh.append("a", [5])
    # now 2 x (1 + 3) = 8 tokens: thin; both ask their own trees, with the same result
    assert ahead.draft("a", 3) == fresh.draft("a", 3)
    assert ahead.sources()["own"] == fresh.sources()["own"] == 1
