"""The draft model as a draft source (`pipeline.drafting.model_source`): on hand-made
passes it takes the model's draft where the trees have little and the trees' where they
are sure, runs the model only for the requests where it may win, trains between steps,
and carries its whole state through a checkpoint."""

from __future__ import annotations

import pytest
import torch

from pipeline.drafting.choice import MODEL, TREE
from pipeline.drafting.draft_model import DraftModel, DraftShape
from pipeline.drafting.draft_train import DraftTrainer, TrainSettings
from pipeline.drafting.model_source import ModelSource

SMALL = DraftShape(vocab_size=24, hidden_size=32, layers=1, heads=4, kv_heads=2, head_dim=8,
                   intermediate_size=32, max_positions=64)
PROMPT, RESPONSE = [1, 5, 9, 7, 2], [5, 7, 9, 11, 13, 0]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _source(seed: int = 0, updates: int = 60, shape: DraftShape = SMALL,
            priced: bool = True) -> ModelSource:
    trainer = DraftTrainer(DraftModel(shape, seed=seed),
                           TrainSettings(updates=updates, batch=8, lr=1e-2), seed=seed)
    return ModelSource(trainer, max_len=4, priced=priced)


def _trained(**kw) -> ModelSource:  # it has learnt PROMPT -> RESPONSE
    source = _source(**kw)
    report = source.train([(PROMPT, RESPONSE)] * 8)
    assert report.loss_after < report.loss_before
    return source


def _remaining(ids):
    return [(20.0, 5.0)] * len(ids)


def _choose(source, trees, available=None, contexts=None):
    contexts = contexts or [PROMPT] * len(trees)
    available = available or [4] * len(trees)
    return source.choose([f"r{j}" for j in range(len(trees))], trees, available,
                         lambda j: contexts[j], _remaining)


def test_the_model_drafts_where_the_trees_have_nothing_and_the_trees_where_they_are_sure():
    source = _trained()
    sure_tree = ([5, 7, 9, 11], [1.0, 1.0, 1.0, 1.0])  # every token certain
    picks = _choose(source, [([], []), sure_tree])
    assert picks[0] == (MODEL, [5, 7, 9, 11])  # the learnt response
    assert picks[1] == (TREE, [5, 7, 9, 11])
    assert source.stats.chosen == 1 and source.stats.drafted == 4


def test_a_doubtful_tree_draft_loses_to_a_sure_model_draft():
    source = _trained()
    doubtful = ([5, 8, 8, 8], [0.3, 0.05, 0.01, 0.001])
    assert _choose(source, [doubtful])[0] == (MODEL, [5, 7, 9, 11])


def test_a_request_that_will_not_end_the_step_drafts_only_what_pays_for_its_tokens():
    """The critical-path weight: the request predicted to end last drafts the untrained
    model's unlikely tokens (an accepted one shortens the step), one predicted to end
    far sooner does not (an accepted token only saves its own verification)."""
    source = _source(updates=1)  # near-random weights: every token about 1/24 likely
    remaining = {"r0": (5.0, 1.0), "r1": (100.0, 5.0)}
    picks = source.choose(["r0", "r1"], [([], []), ([], [])], [4, 4], lambda j: PROMPT,
                          lambda ids: [remaining[r] for r in ids])
    assert picks[0] == ("none", [])
    assert picks[1][0] == MODEL and picks[1][1]


def test_drafts_never_exceed_a_requests_room():
    source = _trained()
    picks = _choose(source, [([], []), ([], [])], available=[2, 0])
    assert picks[0] == (MODEL, [5, 7]) and picks[1] == ("none", [])


def test_the_model_is_not_run_where_the_trees_draft_about_all_there_is():
    source = _trained()
    sure_tree = ([5, 7, 9, 11], [1.0, 1.0, 1.0, 1.0])  # E = 4 of the 4 it may draft
    nearly = ([5, 7, 9], [1.0, 1.0, 0.9])  # E = 2.9: the model could add at most 1.1
    assert _choose(source, [sure_tree]) == [(TREE, [5, 7, 9, 11])]
    assert source.stats.ran == 0
    _choose(source, [nearly])
    assert source.stats.ran == 1
    _choose(source, [sure_tree, ([], [])])
    assert source.stats.ran == 2  # only the second request


def test_under_the_tree_budget_the_likelier_source_drafts_what_it_supports():
    """Unpriced: every request gets the draft with more expected accepted tokens, the
    model's cut where its path probability falls below min_path_prob (0.1)."""
    source = _trained(priced=False)
    doubtful = ([5, 8], [0.3, 0.05])
    far = _source(updates=1, priced=False)  # near-random: its first token ~1/24 likely
    assert _choose(source, [doubtful]) == [(MODEL, [5, 7, 9, 11])]
    assert _choose(far, [doubtful]) == [(TREE, [5, 8])]
    assert _choose(far, [([], [])]) == [("none", [])]


def test_choices_are_the_same_whatever_was_cached():
    a, b = _trained(), _trained()
    trees = [([], []), ([5, 7], [0.9, 0.5])]
    contexts = [PROMPT, PROMPT + [5, 7]]
    _choose(a, trees, contexts=contexts)  # a's cache holds these contexts; b's is empty
    assert _choose(a, trees, contexts=contexts) == _choose(b, trees, contexts=contexts)


def test_training_clears_the_caches_of_the_old_weights():
    source = _trained()
    _choose(source, [([], [])])
    assert len(source.cache) == 1
    source.train([(PROMPT, RESPONSE)] * 8)
    assert len(source.cache) == 0


def test_save_and_load_carry_weights_moments_and_counters(tmp_path):
    source = _trained()
    source.save(tmp_path, 3)
    other = _source(seed=7)
    assert other.load(tmp_path, 3)
    for (n, p), (_, q) in zip(source.trainer.model.named_parameters(),
                              other.trainer.model.named_parameters()):
        assert torch.equal(p, q), n
    assert other.trainer.calls == source.trainer.calls
    # the same next training call and the same drafts after it
    more = [(PROMPT, [5, 7, 0])] * 4
    source.train(more)
    other.train(more)
    assert _choose(source, [([], [])]) == _choose(other, [([], [])])
    assert not other.load(tmp_path, 4)  # no file for that rank: nothing loaded


def test_a_state_of_another_shape_or_kind_is_refused(tmp_path):
    import dataclasses

    _trained().save(tmp_path, 0)
    wider = _source(shape=dataclasses.replace(SMALL, intermediate_size=64))
    with pytest.raises(ValueError, match="another shape"):
        wider.load(tmp_path, 0)
    (tmp_path / "model-rank-1.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="cannot be read"):
        _source().load(tmp_path, 1)


@pytest.mark.parametrize("priced", [True, False])
def test_a_source_whose_drafts_fail_loses_to_the_other_for_the_rest_of_the_rollout(priced):
    """The model's own probabilities say its draft is sure; the verifier keeps rejecting
    it. Scaled by accepted over expected tokens, its drafts then lose to a doubtful
    tree's, until the rollout ends (each rollout learns its own)."""
    source = _trained(priced=priced)
    doubtful = ([5, 8], [0.6, 0.3])
    picks = [_choose(source, [doubtful])[0]]
    for _ in range(12):  # the verifier rejects the model's drafts, accepts the tree's
        kind, tokens = picks[-1]
        source.observe("r0", len(tokens), 0 if kind == MODEL else len(tokens))
        picks.append(_choose(source, [doubtful])[0])
    assert picks[0][0] == MODEL and picks[-1] == (TREE, [5, 8])
    assert [kind for kind, _ in picks].count(MODEL) < 8
    source.end_step()
    assert _choose(source, [doubtful])[0][0] == MODEL


# -- the price of the model's own forward steps (the priced budgets) ----------------------
def _priced_source(fraction: float, **kw) -> ModelSource:
    """A source whose forward steps each cost `fraction` of a memory-bound target pass."""
    source = _source(**kw)
    own = SMALL.own_parameters() + SMALL.vocab_size * SMALL.hidden_size
    source.policy_params = round(own / fraction)
    assert source.step_fraction == pytest.approx(fraction, rel=1e-3)
    return source


def test_a_forward_step_of_the_model_runs_only_where_it_may_pay():
    """One request, the one that ends the step: its first model token may pay a step of a
    tenth of a pass; after it the near-random model's path (about 1/24) cannot pay another.
    Free steps (the policy's size unknown) run on while a next token could pay for its own
    verification: a second one (1/24 of a tail pass), not a third (1/576)."""
    free = _source(updates=1)
    first = _choose(free, [([], [])])[0]
    assert free.stats.steps == 2 and first[0] == MODEL and len(first[1]) == 1
    source = _priced_source(0.1, updates=1)
    assert _choose(source, [([], [])])[0] == first
    assert source.stats.steps == 1 and source.stats.step_reads == pytest.approx(0.1, rel=1e-3)


def test_a_sure_model_keeps_drafting_at_the_same_step_price():
    source = _trained()
    source.policy_params = round((SMALL.own_parameters() + 24 * 32) / 0.1)
    assert _choose(source, [([], [])])[0] == (MODEL, [5, 7, 9, 11])
    assert source.stats.steps == 4


def test_the_model_is_not_run_where_not_even_a_sure_first_token_pays_its_step():
    source = _priced_source(2.0)  # a step costs two target passes
    assert _choose(source, [([], []), ([5, 8], [0.5, 0.1])]) == [("none", []), (TREE, [5, 8])]
    assert source.stats.passes == 0 and source.stats.steps == 0
