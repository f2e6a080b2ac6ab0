"""Sampled model drafts (`spec.draft_probs`): the seeded uniforms, the inverse-CDF draw, the
draft model's sampled drafts with their distributions, the choice handing them out, and the
proposer's draft-probability rows for vLLM's rejection sampler. (That vLLM's sampler keeps
the target's distribution with them: tests/engine/test_rejection_draft_probs.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from pipeline.drafting.choice import MODEL, TREE
from pipeline.drafting.draft_propose import DraftCache, propose_cached, sample_cached
from pipeline.drafting.draft_sample import sample_columns, uniforms
from tests.unit.test_model_source import PROMPT, RESPONSE, _remaining, _source, one_thread  # noqa: F401


def test_uniforms_are_a_function_of_seed_and_position_alone():
    seeds, pos = np.arange(50_000) * 7919 + 3, np.arange(50_000) % 97
    u = uniforms(seeds, pos)
    assert np.array_equal(u, uniforms(seeds, pos))  # the same numbers again
    assert ((u > 0) & (u < 1)).all()
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    assert chisquare(counts).pvalue > 1e-4  # flat
    assert uniforms([5], [1])[0] != uniforms([5], [2])[0] != uniforms([6], [1])[0]
    # any Python int is a seed (reduced mod 2**64), and broadcasting works
    assert uniforms([2**70 + 5], [3])[0] == uniforms([5 + (2**70 % 2**64)], [3])[0]
    assert uniforms(np.array([[1, 2]]), np.array([[0], [1]])).shape == (2, 2)


def test_sample_columns_draws_each_column_by_its_weight_never_a_weightless_one():
    prob = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])
    n = 30_000
    cols = sample_columns(prob.expand(n, -1), torch.from_numpy(uniforms(np.arange(n), 0)))
    counts = np.bincount(cols.numpy(), minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert chisquare(counts[[1, 3, 4]], np.array([0.1, 0.6, 0.3]) * n).pvalue > 1e-3
    # extreme uniforms still land in the support
    edge = sample_columns(prob.expand(2, -1), torch.tensor([1e-16, 1 - 1e-16]))
    assert edge.tolist() == [1, 4]


def _trained_source(**kw):
    source = _source(**kw)
    source.train([(PROMPT, RESPONSE)] * 8)
    return source


def test_sampled_drafts_repeat_for_the_same_seeds_and_come_with_their_distributions():
    model = _trained_source().trainer.model
    contexts = [PROMPT, PROMPT + [5, 7], [3, 3, 3, 3]]
    ids = ["a", "b", "c"]
    toks, est, dists = sample_cached(model, DraftCache(), ids, contexts, 4, 1.0, [11, 12, 13])
    again = sample_cached(model, DraftCache(), ids, contexts, 4, 1.0, [11, 12, 13])
    assert again[0] == toks and again[1] == est
    assert all(torch.equal(a, b) for a, b in zip(again[2], dists))
    assert len(dists) == 4 and all(d.shape == (3, 24) for d in dists)
    for step, d in enumerate(dists):
        assert torch.allclose(d.sum(-1), torch.ones(3))
        for row in range(3):  # every drafted token is one q gives weight
            assert d[row, toks[row][step]] > 0
    # a row drafts the same alone as in the batch, and with a warm cache
    alone = sample_cached(model, DraftCache(), ["c"], [contexts[2]], 4, 1.0, [13])
    assert alone[0] == [toks[2]]
    cache = DraftCache()
    sample_cached(model, cache, ids, [c[:-1] for c in contexts], 4, 1.0, [11, 12, 13])
    assert sample_cached(model, cache, ids, contexts, 4, 1.0, [11, 12, 13])[0] == toks
    # the estimates are the greedy drafts' (q's largest probability at each step)
    greedy = propose_cached(model, DraftCache(), ids[:1], contexts[:1], 1)
    assert est[0][0] == pytest.approx(greedy[1][0][0])
    # other seeds draw otherwise where the model is unsure (barely trained)
    unsure = _source(updates=1).trainer.model
    draws = {tuple(map(tuple, sample_cached(unsure, DraftCache(), ids, contexts, 4, 1.0,
                                            [s, s + 1, s + 2])[0])) for s in (11, 21, 31)}
    assert len(draws) == 3


def test_sampled_drafts_follow_the_models_distribution():
    """Across many seeds the first drafted token of one context is distributed as q."""
    model = _source(updates=1).trainer.model  # barely trained: q spread over many tokens
    n = 4_000
    toks, _, dists = sample_cached(model, DraftCache(), list(range(n)), [[3, 4, 5]] * n, 1,
                                   1.0, list(range(n)))
    q = dists[0][0].double().numpy()
    counts = np.bincount([t[0] for t in toks], minlength=q.size)
    keep = q * n >= 5
    assert keep.sum() >= 5
    expected = q[keep] / q[keep].sum() * counts[keep].sum()
    assert chisquare(counts[keep], expected).pvalue > 1e-3


def test_the_choice_hands_out_the_distributions_of_the_model_drafts_it_picked():
    source = _trained_source()
    source.sample = True
    source.set_temperature(1.0)
    assert source.sampling
    trees = [([], []), ([5, 7, 9, 11], [1.0, 1.0, 1.0, 1.0])]
    picks = source.choose(["r0", "r1"], trees, [4, 4], lambda j: PROMPT, _remaining,
                          lambda j: 100 + j)
    assert picks[0][0] == MODEL and picks[1][0] == TREE
    rows, q = source.take_probs()
    assert rows == {0: 0} and q.shape == (1, 4, 24)
    assert all(q[0, t, tok] > 0 for t, tok in enumerate(picks[0][1]))
    assert source.take_probs() == ({}, None)  # handed out once
    # two model rows: each gets its own row's distributions
    contexts = [PROMPT, [3, 4, 5]]
    picks = source.choose(["r2", "r3"], [([], []), ([], [])], [4, 4], lambda j: contexts[j],
                          _remaining, lambda j: 200 + j)
    rows, q = source.take_probs()
    for j in (0, 1):
        assert picks[j][0] == MODEL
        toks, _, alone = sample_cached(source.trainer.model, DraftCache(), ["x"], [contexts[j]],
                                       4, 1.0, [200 + j])
        assert toks[0][:len(picks[j][1])] == picks[j][1]
        n = len(picks[j][1])
        assert torch.allclose(q[rows[j], :n], torch.stack([d[0] for d in alone[:n]]), atol=1e-6)
    with pytest.raises(ValueError, match="seed"):
        source.choose(["r0"], trees[:1], [4], lambda j: PROMPT, _remaining)
    # greedy rollouts draft the argmax and hand nothing out
    source.set_temperature(0.0)
    assert not source.sampling
    picks = source.choose(["r0"], trees[:1], [4], lambda j: PROMPT, _remaining)
    assert picks[0] == (MODEL, RESPONSE[:4]) and source.take_probs() == ({}, None)


def test_every_drafted_row_gets_probabilities_one_hot_for_tree_drafts():
    from pipeline.rollout.draft_probs import dense_rows, hand_over

    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.0, 0.0]])  # over tokens 1, 4, 6, 9
    other = torch.full((3, 4), 0.25)  # another sampled row's distributions (Q's row 0)
    out = [[3, 3, 7], [], [9, 1], [2]]  # row 2 is the model's draft: Q's row 1
    rows, dense = dense_rows(out, {2: 1}, torch.stack([other, torch.cat((q, other[:1]))]), 10,
                             torch.tensor([1, 4, 6, 9]), "cpu")
    runner = SimpleNamespace(_draft_probs=None, _draft_prob_req_ids=None)
    hand_over(runner, ["a", "b", "c", "d"], rows, dense)
    # the sampled row first, then the others in order
    assert runner._draft_prob_req_ids == ["c", "a", "d"] and runner._draft_probs is dense
    assert dense.shape == (3, 3, 10) and dense.dtype == torch.float32
    assert torch.equal(dense[0, :2, [1, 4, 6, 9]], q) and dense[0, :2].sum() == pytest.approx(2)
    assert dense[1, 0, 3] == dense[1, 1, 3] == dense[1, 2, 7] == 1 and dense[1].sum() == 3
    assert dense[2, 0, 2] == 1 and dense[2].sum() == 1
    # without a draft vocabulary q's columns are the tokens
    assert torch.equal(dense_rows([[1, 2]], {0: 0}, q[None], 4, None, "cpu")[1][0], q)
    # rows sampled in any order land on their own rows
    rows, dense = dense_rows([[1], [2, 3]], {1: 0, 0: 1}, torch.stack([q, other[:2]]), 4, None,
                             "cpu")
    assert rows == [1, 0] and torch.equal(dense[0], q) and torch.equal(dense[1, :1], other[:1])


def test_a_draft_model_of_another_vocabulary_is_refused():
    from pipeline.rollout.proposer import RhymeProposer

    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                          model_config=SimpleNamespace(max_model_len=64,
                                                       get_vocab_size=lambda: 32))
    model = SimpleNamespace(sample=True, vocab_size=24)
    with pytest.raises(ValueError, match="vocabulary"):
        RhymeProposer(cfg).bind(SimpleNamespace(), None, None, model=model)


def test_a_requests_seed_is_its_sampling_seed_else_a_hash_of_its_id():
    from pipeline.rollout.draft_probs import request_seed

    runner = SimpleNamespace(requests={
        "0:1-0a1b2c3d": SimpleNamespace(sampling_params=SimpleNamespace(seed=1234)),
        "0:2-0a1b2c3d": SimpleNamespace(sampling_params=SimpleNamespace(seed=None))})
    assert request_seed(runner, "0:1-0a1b2c3d") == 1234
    unseeded = request_seed(runner, "0:2-0a1b2c3d")
    assert unseeded == request_seed(runner, "0:2-ffffffff")  # vLLM's random suffix left out
    assert unseeded != request_seed(runner, "0:3-0a1b2c3d")


def test_a_proposer_pass_hands_its_sampled_drafts_probabilities_to_the_runner():
    """The proposer as vLLM calls it, with a sampling draft model beside trees that know
    nothing: each request's draft is the model's, drawn with its own seed, and the runner
    holds its q for the next pass; a second run of the same pass draws the same."""
    from pipeline.drafting.budget_tree import TreeBudget
    from pipeline.drafting.drafter import GroupDrafter
    from pipeline.drafting.inputs import DrafterConfig
    from pipeline.rollout.proposer import RhymeProposer, attach
    from tests.unit.test_rollout_proposer import FakeBatch, step

    def one_pass():
        source = _trained_source()
        source.sample = True
        source.set_temperature(1.0)
        cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                              model_config=SimpleNamespace(max_model_len=64,
                                                           get_vocab_size=lambda: 24))
        proposer = RhymeProposer(cfg)
        batch = FakeBatch(64)
        seeds = {"0:0-aaaaaaaa": 7, "0:1-aaaaaaaa": 8}
        runner = SimpleNamespace(
            input_batch=batch, drafter=proposer, device=torch.device("cpu"),
            _draft_probs=None, _draft_prob_req_ids=None,
            requests={r: SimpleNamespace(sampling_params=SimpleNamespace(seed=s))
                      for r, s in seeds.items()})
        attach(runner, GroupDrafter(DrafterConfig()), TreeBudget(4), model=source)
        for r in seeds:
            batch.add(r, PROMPT)
        out = step(proposer, batch, {r: [RESPONSE[3]] for r in seeds})  # no tree knows 11
        return out, runner, proposer

    out, runner, proposer = one_pass()
    assert all(out) and runner._draft_prob_req_ids == list(runner.requests)
    dense = runner._draft_probs
    assert dense.shape == (2, max(map(len, out)), 24)
    for r, toks in enumerate(out):
        assert torch.allclose(dense[r, :len(toks)].sum(-1), torch.ones(len(toks)))
        assert all(dense[r, t, tok] > 0 for t, tok in enumerate(toks))
    assert proposer.stats.sampled == 2
    again, runner2, _ = one_pass()
    assert again == out and torch.equal(runner2._draft_probs, dense)
