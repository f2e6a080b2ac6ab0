"""The draft model of the policy (`pipeline.drafting.draft_model`): sized from the policy's
config, started from its weights, trained online on rollouts, drafting in one batched loop,
and carried through a checkpoint as safetensors."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from pipeline.drafting.draft_model import (DraftModel, DraftShape, from_policy,
                                           policy_parameters, shape_for)
from pipeline.drafting.draft_propose import expected_accepted, propose
from pipeline.drafting.draft_state import load_state, save_state
from pipeline.drafting.draft_train import DraftTrainer, TrainSettings

# The tiny default policy's Hugging Face config (`rhymectl init-model`): 4 layers of 128.
TINY_POLICY = {"vocab_size": 101, "hidden_size": 128, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32,
               "intermediate_size": 512, "max_position_embeddings": 256,
               "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
               "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}

SMALL = DraftShape(vocab_size=24, hidden_size=32, layers=1, heads=4, kv_heads=2, head_dim=8,
                   intermediate_size=32, max_positions=64)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a machine whose cores are busy, two OpenMP threads made
    these tiny updates 50 times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _policy(config: dict, seed: int = 3) -> dict:
    """A policy state dict with Hugging Face Llama names, drawn at random."""
    shape = DraftShape(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                       layers=config["num_hidden_layers"], heads=config["num_attention_heads"],
                       kv_heads=config["num_key_value_heads"], head_dim=config["head_dim"],
                       intermediate_size=config["intermediate_size"],
                       max_positions=config["max_position_embeddings"],
                       tie_embeddings=config["tie_word_embeddings"])
    state = DraftModel(shape, seed=seed).state_dict()
    with torch.no_grad():  # norms away from 1 so that a copy is told from the default
        for name, value in state.items():
            if name.endswith("norm.weight"):
                value.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(seed))
    return state


def _corpus(seed: int = 0, n: int = 24):
    """Sort-task-like rollouts: a prompt of digits and its sorted copy, lengths varying."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        digits = [rng.randrange(3, 13) for _ in range(rng.randrange(3, 12))]
        out.append(([1] + digits + [2], sorted(digits) + [0]))
    return out


def _trainer(seed: int = 0, updates: int = 15) -> DraftTrainer:
    return DraftTrainer(DraftModel(SMALL, seed=seed), TrainSettings(updates=updates, batch=8,
                                                                    lr=1e-2), seed=seed)


def test_the_tiny_policys_draft_is_one_layer_within_a_tenth_of_its_parameters():
    shape = shape_for(TINY_POLICY)
    assert policy_parameters(TINY_POLICY) == 1_062_656  # what init-model reports
    assert (shape.layers, shape.hidden_size, shape.heads, shape.head_dim) == (1, 128, 4, 32)
    assert shape.intermediate_size == 96
    assert shape.own_parameters() == 102_784
    assert shape.own_parameters() <= 0.10 * policy_parameters(TINY_POLICY)
    assert shape.parameters() == 102_784 + 101 * 128  # the tied embedding on top


def test_a_draft_that_cannot_fit_its_fraction_is_refused():
    with pytest.raises(ValueError, match="does not fit in 1% of the policy's parameters"):
        shape_for(TINY_POLICY, max_fraction=0.01)


def test_initialisation_shares_embeddings_and_head_with_the_policy():
    config = dict(TINY_POLICY, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                  head_dim=8, intermediate_size=128, vocab_size=24,
                  max_position_embeddings=64, tie_word_embeddings=False)
    policy = _policy(config)
    draft = from_policy(config, policy, shape_for(config, max_fraction=0.2))
    own = draft.state_dict()
    width = draft.shape.intermediate_size
    assert 0 < width < 128
    assert torch.equal(own["model.embed_tokens.weight"], policy["model.embed_tokens.weight"])
    assert torch.equal(own["lm_head.weight"], policy["lm_head.weight"])
    assert torch.equal(own["model.norm.weight"], policy["model.norm.weight"])
    assert torch.equal(own["model.layers.0.self_attn.q_proj.weight"],
                       policy["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(own["model.layers.0.mlp.down_proj.weight"],
                       policy["model.layers.0.mlp.down_proj.weight"][:, :width])
    # a copy, not a view: training the draft leaves the policy's tensors alone
    assert own["model.embed_tokens.weight"].data_ptr() != policy["model.embed_tokens.weight"].data_ptr()


def test_a_tied_policy_gives_a_tied_draft():
    config = dict(TINY_POLICY, hidden_size=32, head_dim=8, intermediate_size=128,
                  vocab_size=24, max_position_embeddings=64)
    policy = _policy(config)
    draft = from_policy(config, policy, shape_for(config, max_fraction=0.5))
    assert draft.lm_head is None
    assert "lm_head.weight" not in draft.state_dict()
    assert torch.equal(draft.state_dict()["model.embed_tokens.weight"],
                       policy["model.embed_tokens.weight"])


def test_online_training_on_a_small_corpus_lowers_its_loss():
    trainer = _trainer()
    corpus = _corpus()
    first = trainer.train(corpus)
    second = trainer.train(corpus)
    assert first.updates == 15 and first.tokens > 0
    assert first.loss_after < first.loss_before
    assert second.loss_after < first.loss_after
    assert trainer.loss(corpus) == pytest.approx(second.loss_after)


def test_long_responses_weigh_more():
    trainer = _trainer()
    short, long_ = ([1, 3, 2], [3, 0]), ([1, 4, 5, 6, 2], [4, 5, 6, 7, 8, 9, 0])
    weights = {len(r): w for (_, start, w, _), (_, r) in
               zip(trainer._examples([short, long_]), [short, long_])}
    assert weights[7] / weights[2] == pytest.approx(7 / 2)
    flat = DraftTrainer(DraftModel(SMALL), TrainSettings(length_power=0.0))
    assert {w for _, _, w, _ in flat._examples([short, long_])} == {1.0}


def test_training_is_deterministic_given_the_seed():
    a, b = _trainer(seed=4), _trainer(seed=4)
    for trainer in (a, b):
        trainer.train(_corpus(1))
        trainer.train(_corpus(2))
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), name


def test_save_and_load_give_identical_drafts_and_identical_further_training(tmp_path):
    trainer = _trainer(seed=2)
    trainer.train(_corpus(1))
    path = tmp_path / "draft.safetensors"
    save_state(trainer, path)
    loaded = load_state(path)
    contexts = [[1, 7, 3, 9, 2], [1, 4, 2], [1, 12, 11, 10, 9, 8, 2, 8]]
    assert propose(loaded.model, contexts, 6) == propose(trainer.model, contexts, 6)
    assert loaded.calls == trainer.calls == 1
    # the optimiser's moments came back too: the next update is the same
    trainer.train(_corpus(3))
    loaded.train(_corpus(3))
    for (name, x), (_, y) in zip(trainer.model.state_dict().items(),
                                 loaded.model.state_dict().items()):
        assert torch.equal(x, y), name


def _window_trainer(window: int, seed: int = 0) -> DraftTrainer:
    return DraftTrainer(DraftModel(SMALL, seed=seed),
                        TrainSettings(updates=15, batch=8, lr=1e-2, window=window), seed=seed)


def test_the_window_keeps_the_last_steps_rollouts_oldest_first():
    trainer = _window_trainer(2)
    steps = [_corpus(s, n=6) for s in (1, 2, 3)]
    for step in steps:
        trainer.train(step)
    kept = [[(p.tolist(), r.tolist()) for p, r, _ in step] for step in trainer.window]
    assert kept == [[(list(p), list(r)) for p, r in step] for step in steps[1:]]


def test_a_window_goes_on_training_on_the_earlier_steps_responses():
    """After steps A then B, a window of 2 still fits A better than a window of 1, which
    trained on B alone in its second call; both fit B."""
    a, b = _corpus(5), _corpus(6)
    losses = {}
    for window in (1, 2):
        trainer = _window_trainer(window, seed=3)
        trainer.train(a)
        report = trainer.train(b)
        assert report.loss_after < report.loss_before
        losses[window] = trainer.loss(a)
    assert losses[2] < losses[1]


def test_the_window_survives_save_and_load(tmp_path):
    trainer = _window_trainer(3, seed=1)
    for s in (1, 2):
        trainer.train(_corpus(s, n=5))
    path = tmp_path / "draft.safetensors"
    save_state(trainer, path)
    loaded = load_state(path)
    assert len(loaded.window) == 2
    for mine, theirs in zip(trainer.window, loaded.window):
        assert [(p.tolist(), r.tolist()) for p, r, _ in mine] == \
            [(p.tolist(), r.tolist()) for p, r, _ in theirs]
    trainer.train(_corpus(3))
    loaded.train(_corpus(3))
    for (name, x), (_, y) in zip(trainer.model.state_dict().items(),
                                 loaded.model.state_dict().items()):
        assert torch.equal(x, y), name


def test_a_foreign_safetensors_file_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(1)}, str(path))
    with pytest.raises(ValueError, match="is not a draft-model state"):
        load_state(path)


def test_batched_drafts_are_each_contexts_own():
    """Left padding and the KV cache change no row's draft: one batch equals one call per
    context, and each draft is the model's greedy continuation recomputed from scratch."""
    trainer = _trainer(seed=1)
    trainer.train(_corpus())
    model = trainer.model
    contexts = [[1, 9, 4, 2], [1, 3, 5, 7, 9, 11, 2, 3], [1, 6, 2]]
    tokens, probs = propose(model, contexts, 5)
    for c, t, p in zip(contexts, tokens, probs):
        alone_tokens, alone_probs = propose(model, [c], 5)
        assert alone_tokens == [t]
        assert alone_probs[0] == pytest.approx(p, rel=1e-5)
        seq = list(c)
        for _ in range(5):
            with torch.no_grad():
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert seq[len(c):] == t
        assert all(0.0 < x <= 1.0 for x in p)


def test_a_draft_learns_the_corpus_it_was_trained_on():
    trainer = _trainer(seed=0, updates=60)
    corpus = [([1, 5, 9, 7, 2], [5, 7, 9, 0])] * 8
    trainer.train(corpus)
    tokens, probs = propose(trainer.model, [[1, 5, 9, 7, 2]], 4)
    assert tokens == [[5, 7, 9, 0]]
    assert expected_accepted(probs[0]) > 3.0


def test_expected_accepted_is_the_sum_of_prefix_products():
    assert expected_accepted([]) == 0.0
    assert expected_accepted([0.5, 0.5, 1.0]) == pytest.approx(0.5 + 0.25 + 0.25)


def test_the_loss_counts_response_tokens_only():
    """Prompt tokens are the policy's input, not its output: only the positions that
    predict response tokens are scored."""
    trainer = _trainer(seed=5)
    prompt, response = [1, 7, 3, 9, 2], [3, 7, 9, 0]
    seq = prompt + response
    with torch.no_grad():
        logits = trainer.model(torch.tensor([seq[:-1]]))[0]
    logp = torch.log_softmax(logits, -1)
    want = -sum(float(logp[i, seq[i + 1]]) for i in range(len(prompt) - 1, len(seq) - 1)) / 4
    assert trainer.loss([(prompt, response)]) == pytest.approx(want, rel=1e-5)


def _cached_passes(seed: int):
    """A trained draft, an empty cache, three running requests' contexts and a generator
    of verification outcomes: what the cache tests drive pass after pass."""
    from pipeline.drafting.draft_propose import DraftCache

    trainer = _trainer(seed=3)
    trainer.train(_corpus())
    contexts = {"a": [1, 9, 4, 2], "b": [1, 3, 5, 7, 9, 11, 2, 3], "c": [1, 6, 2]}
    return trainer.model, DraftCache(), contexts, random.Random(seed)


def _verify(contexts: dict, ids, drafts, rng) -> None:
    """One pass's verification: each request accepts a random prefix of its draft, then
    the target's own token."""
    for r, draft in zip(ids, drafts):
        accepted = rng.randrange(len(draft) + 1)
        contexts[r] = contexts[r] + draft[:accepted] + [rng.randrange(3, 13)]


def test_cached_drafts_are_the_recomputed_drafts_pass_after_pass():
    """A cache kept across passes changes no draft: requests that accept part of their
    draft, none of it, or diverge, start late or stop, get `propose`'s drafts."""
    from pipeline.drafting.draft_propose import propose_cached

    model, cache, contexts, rng = _cached_passes(seed=0)
    for step in range(6):
        if step == 2:
            contexts["d"] = [1, 8, 8, 2]  # starts late
        if step == 4:
            contexts.pop("a")
            cache.forget("a")
        ids = list(contexts)
        got_t, got_p = propose_cached(model, cache, ids, [contexts[r] for r in ids], 4)
        want_t, want_p = propose(model, [contexts[r] for r in ids], 4)
        assert got_t == want_t, step
        for g, w in zip(got_p, want_p):
            assert g == pytest.approx(w, rel=1e-4, abs=1e-6)
        _verify(contexts, ids, got_t, rng)
    assert len(cache) == 3


def test_drafting_stops_once_every_rows_path_is_below_the_floor_and_the_cache_still_holds():
    """stop_below: the drafts are the first tokens of the full drafts, as many for every
    row, cut at the first step where every row's path probability is below the floor;
    later passes through the same cache still give `propose`'s drafts."""
    from pipeline.drafting.draft_propose import propose_cached

    model, cache, contexts, rng = _cached_passes(seed=1)
    shorter = 0
    for step in range(6):
        ids = list(contexts)
        full_t, full_p = propose(model, [contexts[r] for r in ids], 8)
        paths = [[math.prod(p[:i + 1]) for i in range(8)] for p in full_p]
        values = sorted(x for path in paths for x in path)
        m = len(values) // 2  # a floor between two path probabilities near the median,
        while values[m + 1] < values[m] * 1.01:  # clear of both (the cache's float error)
            m += 1
        floor = (values[m] + values[m + 1]) / 2
        want = next((i + 1 for i in range(8) if all(path[i] < floor for path in paths)), 8)
        got_t, got_p = propose_cached(model, cache, ids, [contexts[r] for r in ids], 8,
                                      stop_below=floor)
        assert got_t == [t[:want] for t in full_t], step
        shorter += want < 8
        _verify(contexts, ids, got_t, rng)
        got, _ = propose_cached(model, cache, ids, [contexts[r] for r in ids], 8)
        assert got == propose(model, [contexts[r] for r in ids], 8)[0], step
        for r, draft in zip(ids, got):  # the next pass starts from these drafts
            contexts[r] = contexts[r] + draft[:2] + [rng.randrange(3, 13)]
    assert shorter >= 3


# -- the draft vocabulary -------------------------------------------------------------------
def _vocab_trainer(size: int, seed: int = 3) -> DraftTrainer:
    return DraftTrainer(DraftModel(SMALL, seed=seed),
                        TrainSettings(updates=15, batch=8, lr=1e-2, draft_vocab=size), seed=seed)


def test_the_draft_vocabulary_is_the_most_frequent_trained_tokens():
    trainer = _vocab_trainer(4)
    assert trainer.draft_vocab() is None  # nothing counted yet: every token
    trainer.train([([1, 2], [5, 5, 5, 9, 9, 7, 7, 3]), ([1, 2], [11, 3, 5, 0])])
    # counts: 5 x4, 3/7/9 x2 each, 0 and 11 x1: the top four, ties to the lower id
    assert trainer.draft_vocab().tolist() == [3, 5, 7, 9]
    assert trainer.model.draft_ids.tolist() == [3, 5, 7, 9]
    tokens, _ = propose(trainer.model, [[1, 5, 2], [1, 11, 4, 2]], 5)
    assert {t for row in tokens for t in row} <= {3, 5, 7, 9}
    assert _vocab_trainer(SMALL.vocab_size).draft_vocab() is None  # no smaller than all
    trainer = _vocab_trainer(SMALL.vocab_size)
    trainer.train(_corpus())
    assert trainer.model.draft_ids is None


def test_the_draft_vocabulary_holds_only_tokens_the_responses_used():
    """A vocabulary larger than the tokens seen keeps those alone (it used to fill up with
    never-seen tokens, lowest ids first, which the head was then computed for)."""
    trainer = _vocab_trainer(10)
    trainer.train([([1, 2], [5, 5, 9, 7, 3]), ([1, 2], [11, 3, 5, 0])])
    assert trainer.draft_vocab().tolist() == [0, 3, 5, 7, 9, 11]
    assert trainer.model.draft_ids.tolist() == [0, 3, 5, 7, 9, 11]


def test_the_loss_is_over_the_draft_vocabulary_with_the_teachers_tokens_outside_dropped():
    """Training's softmax is the drafting one: over the vocabulary's head rows only; a
    teacher's tokens outside it are dropped and the rest renormalised, and a position
    with none inside it is not scored."""
    from pipeline.train.teacher import Teacher

    trainer = _vocab_trainer(3, seed=4)
    trainer.counts[[5, 7, 9]] = 4  # the vocabulary: 5, 7, 9
    prompt, response = [1, 7, 3, 2], [5, 9, 7]
    ids = torch.tensor([[5, 20], [9, 7], [21, 22]], dtype=torch.int32)  # row 2: none inside
    logprobs = torch.log(torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]])).to(torch.float16)
    seq = prompt + response
    with torch.no_grad():
        hidden = trainer.model.hidden(torch.tensor([seq[:-1]]))[0]
        logq = torch.log_softmax(hidden @ trainer.model.lm_head_rows(torch.tensor([5, 7, 9])).T, -1)
    column = {5: 0, 7: 1, 9: 2}
    at = len(prompt) - 1  # the position that predicts the first response token
    p1 = torch.softmax(logprobs[1].float(), -1)
    want = (-float(logq[at, column[5]])  # 20 dropped: 5 takes all of the mass
            - float(p1[0] * logq[at + 1, column[9]] + p1[1] * logq[at + 1, column[7]])) / 2
    taught = trainer.loss([(prompt, response, Teacher(ids, logprobs))])
    assert taught == pytest.approx(want, rel=1e-4)
    # sampled tokens alone: the position whose token is outside (3) is not scored
    hard = -(float(logq[at, 0]) + float(logq[at + 1, 2])) / 2
    assert trainer.loss([(prompt, [5, 9, 3])]) == pytest.approx(hard, rel=1e-4)


def test_training_over_a_draft_vocabulary_computes_only_its_head_rows():
    """Tokens in no rollout and outside the vocabulary get no gradient: their head rows
    stay as they were (with the whole vocabulary every row's logit is trained down)."""
    corpus = _corpus(2)  # tokens 0-12 only
    untouched = list(range(13, SMALL.vocab_size))
    for size, moved in ((6, False), (0, True)):
        trainer = _vocab_trainer(size)
        before = trainer.model.lm_head_rows(torch.tensor(untouched)).detach().clone()
        trainer.train(corpus)
        after = trainer.model.lm_head_rows(torch.tensor(untouched)).detach()
        assert (not torch.equal(before, after)) is moved, size


def test_a_draft_vocabulary_holding_the_greedy_tokens_drafts_the_same():
    """The vocabulary's logits are the head's rows of its tokens, mapped back to their ids:
    where the whole-vocabulary drafts use only tokens in it, the drafts are the same (and,
    batched and cached, each context's own)."""
    from pipeline.drafting.draft_propose import DraftCache, propose_cached

    trainer = _trainer(seed=3)
    trainer.train(_corpus())
    model = trainer.model
    contexts = [[1, 9, 4, 2], [1, 3, 5, 7, 9, 11, 2, 3], [1, 6, 2]]
    full, full_p = propose(model, contexts, 5)
    used = sorted({t for row in full for t in row} | {0, 21})
    model.use_draft_vocab(torch.tensor(used))
    cut, cut_p = propose(model, contexts, 5)
    assert cut == full
    assert all(c >= f - 1e-6 for rc, rf in zip(cut_p, full_p) for c, f in zip(rc, rf))
    assert propose_cached(model, DraftCache(), ["a", "b", "c"], contexts, 5)[0] == full
    model.use_draft_vocab(torch.tensor([u for u in used if u != full[0][0]]))
    assert propose(model, contexts[:1], 5)[0][0][0] != full[0][0]  # its first token is gone


def test_the_draft_vocabulary_survives_save_and_load(tmp_path):
    trainer = _vocab_trainer(6, seed=2)
    trainer.train(_corpus(1))
    trainer.train(_corpus(2))
    path = tmp_path / "draft.safetensors"
    save_state(trainer, path)
    loaded = load_state(path)
    assert torch.equal(loaded.counts, trainer.counts)
    assert loaded.model.draft_ids.tolist() == trainer.model.draft_ids.tolist()
    contexts = [[1, 7, 3, 9, 2], [1, 4, 2]]
    assert propose(loaded.model, contexts, 6) == propose(trainer.model, contexts, 6)
    trainer.train(_corpus(3))
    loaded.train(_corpus(3))
    assert loaded.model.draft_ids.tolist() == trainer.model.draft_ids.tolist()


def test_the_draft_vocabulary_moves_with_the_model_and_stays_out_of_its_weights():
    """Its ids and head rows are buffers (a draft model moved to another device or dtype
    takes them along) that no state dict holds: the counts are the saved state."""
    trainer = _vocab_trainer(4)
    trainer.train([([1, 2], [5, 5, 5, 9, 9, 7, 7, 3]), ([1, 2], [11, 3, 5, 0])])
    model = trainer.model
    assert "draft_ids" not in model.state_dict() and "_draft_head" not in model.state_dict()
    model.to(torch.float64)
    assert model._draft_head.dtype == torch.float64 and model.draft_ids.dtype == torch.long
    tokens, _ = propose(model, [[1, 5, 2]], 3)
    assert {t for row in tokens for t in row} <= {3, 5, 7, 9}


def test_a_state_written_before_windows_goes_on_training_on_its_last_step_alone(tmp_path):
    """A checkpoint of the version without `window` resumes as that version trained."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    trainer = _window_trainer(1, seed=2)
    trainer.train(_corpus(1))
    path = tmp_path / "draft.safetensors"
    save_state(trainer, path)
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("window.")}
    settings = json.loads(meta.pop("settings"))
    del settings["window"]
    meta["settings"] = json.dumps(settings)
    meta.pop("window")
    save_file(tensors, str(path), metadata=meta)
    loaded = load_state(path)
    assert loaded.settings.window == 1 and loaded.window == []


# -- where the draft runs ---------------------------------------------------------------------
def test_drafting_and_training_make_every_tensor_where_the_model_is(tmp_path):
    """`spec.draft_device`: a draft on a GPU must not build its batches, caches or updates
    on the host. With the default device set to `meta`, any tensor made without naming a
    device lands there and the first operation that meets the model's (CPU) tensors fails;
    drafting, cached drafting and training give what they give without it."""
    from pipeline.drafting.draft_propose import DraftCache, propose_cached

    contexts = [[1, 9, 4, 2], [1, 3, 5, 7, 9, 11, 2, 3], [1, 6, 2]]

    def run(trainer):
        trainer.train(_corpus(2))
        cache = DraftCache()
        first = propose_cached(trainer.model, cache, ["a", "b", "c"], contexts, 4)
        grown = [c + d[:1] + [5] for c, d in zip(contexts, first[0])]
        again = propose_cached(trainer.model, cache, ["a", "b", "c"], grown, 4)
        return propose(trainer.model, contexts, 4), first, again, trainer.loss(_corpus(3))

    def started():
        """Made and trained once outside: AdamW makes its step counters on the default
        device when it first steps (torch's, not this code's)."""
        trainer = _vocab_trainer(12, seed=4)
        trainer.train(_corpus(1))
        return trainer

    want = run(started())
    trainer = started()
    with torch.device("meta"):
        got = run(trainer)
    assert got[0][0] == want[0][0] and got[1][0] == want[1][0] and got[2][0] == want[2][0]
    assert got[3] == pytest.approx(want[3], rel=1e-6)
    # (safetensors makes tensors of its own: the state's round trip runs outside)
    save_state(trainer, tmp_path / "state.safetensors")
    loaded = load_state(tmp_path / "state.safetensors", trainer.model.device)
    assert propose(loaded.model, contexts, 4)[0] == want[0][0]


def test_the_draft_device_follows_the_engine_unless_set():
    from types import SimpleNamespace

    from pipeline.errors import UsageError
    from pipeline.rollout.draft_source import draft_device

    assert draft_device("auto", SimpleNamespace(type="cuda")) == "cuda"
    assert draft_device("auto", torch.device("cpu")) == "cpu"
    assert draft_device("auto", None) == "cpu"  # no engine (a bench): the CPU
    assert draft_device("cpu", SimpleNamespace(type="cuda")) == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="spec.draft_device is cuda"):
            draft_device("cuda", None)


def test_the_common_prefix_of_two_contexts_is_found_by_halving_as_token_by_token():
    """The cache's check of how far a context still agrees with its keys' (compared in
    slices) gives the token-by-token answer: equal, one a prefix of the other, differing
    at the start, the end or anywhere, empty."""
    from pipeline.drafting.draft_propose import _common_prefix

    def by_token(a, b):
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    rng = random.Random(5)
    for _ in range(3000):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 120))]
        b = a[:rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        a, b = (b, a) if rng.random() < 0.5 else (a, b)
        assert _common_prefix(a, b) == by_token(a, b), (a, b)
    long = list(range(5000))
    assert _common_prefix(long, long[:4000] + [-1] + long[4001:]) == 4000


@pytest.mark.parametrize("vocab", [0, 6])
def test_a_large_minibatch_sums_its_loss_in_chunks_to_the_same_update(monkeypatch, vocab):
    """Above LOSS_CHUNK_BYTES of logits the loss is summed in chunks recomputed in the
    backward pass: the loss and the update are the one-piece ones (to float rounding);
    over a draft vocabulary, a chunk's logits are its columns."""
    from pipeline.drafting import draft_train

    pieces = []
    recompute = draft_train.checkpoint
    monkeypatch.setattr(draft_train, "checkpoint",
                        lambda fn, *a, **kw: pieces.append(len(a[0])) or recompute(fn, *a, **kw))

    def trained(chunk_bytes):
        monkeypatch.setattr(draft_train.draft_shape, "LOSS_CHUNK_BYTES", chunk_bytes)
        trainer = _trainer(seed=5)
        trainer.settings = replace(trainer.settings, draft_vocab=vocab)
        report = trainer.train(_corpus(4))
        return report, [p.detach().clone() for p in trainer.model.parameters()]

    whole, w_params = trained(1 << 30)
    assert not pieces
    chunked, c_params = trained(4 * (vocab or SMALL.vocab_size) * 7)  # 7 tokens a chunk
    assert pieces and max(pieces) == 7
    assert chunked.loss_before == pytest.approx(whole.loss_before, rel=1e-6)
    assert chunked.loss_after == pytest.approx(whole.loss_after, rel=1e-4)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(c_params, w_params))


@pytest.mark.parametrize("vocab", [0, 6])
def test_a_minibatch_above_micro_tokens_trains_in_pieces_to_the_same_update(monkeypatch, vocab):
    """Above MICRO_TOKENS padded tokens a minibatch's forward and backward run a few rows at
    a time and their gradients add up: the losses and the update are the one-piece ones
    (to float rounding), and no piece holds more than the limit; over a draft vocabulary
    too, whose positions without a target in it weigh nothing in any piece."""
    from pipeline.drafting import draft_train

    held = []
    loss_sum = draft_train.DraftTrainer._loss_sum

    def spy(self, batch, kept):
        held.append(len(batch) * max(len(seq) for seq, *_ in batch))
        return loss_sum(self, batch, kept)
    monkeypatch.setattr(draft_train.DraftTrainer, "_loss_sum", spy)

    def trained(limit):
        monkeypatch.setattr(draft_train.draft_shape, "MICRO_TOKENS", limit)
        held.clear()
        trainer = _trainer(seed=5)
        trainer.settings = replace(trainer.settings, draft_vocab=vocab)
        report = trainer.train(_corpus(4))
        return report, [p.detach().clone() for p in trainer.model.parameters()], max(held)

    whole, w_params, widest = trained(1 << 30)
    split, s_params, piece = trained(widest // 3)
    assert piece <= widest // 3 < widest
    assert split.tokens == whole.tokens
    assert split.loss_before == pytest.approx(whole.loss_before, rel=1e-6)
    assert split.loss_after == pytest.approx(whole.loss_after, rel=1e-4)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(s_params, w_params))
    assert any(not torch.equal(a, b) for a, b in zip(w_params, _trainer(seed=5).model.parameters()))


def test_pieces_keep_order_and_bound_the_padded_size():
    from pipeline.drafting.draft_targets import pieces

    rng = random.Random(3)
    for _ in range(500):
        batch = [(list(range(rng.randrange(1, 40))), 0, 1.0) for _ in range(rng.randrange(1, 20))]
        limit = rng.randrange(1, 120)
        parts = pieces(batch, limit)
        assert [e for part in parts for e in part] == batch
        for part in parts:
            assert len(part) == 1 or len(part) * max(len(e[0]) for e in part) <= limit
    assert pieces([], 10) == []


def test_a_long_prefill_runs_a_few_rows_at_a_time_to_the_same_drafts(monkeypatch):
    """Above PREFILL_TOKENS new tokens a batch's first forward goes a few rows at a time
    (into the same caches): the drafts are the one-piece ones, and so are the next pass's
    from the cache."""
    from pipeline.drafting import draft_propose
    from pipeline.drafting.draft_propose import DraftCache, propose_cached

    model, _, contexts, rng = _cached_passes(seed=2)
    ids = list(contexts)
    whole = [propose(model, [contexts[r] for r in ids], 4),
             propose_cached(model, DraftCache(), ids, [contexts[r] for r in ids], 4)]
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda x, *a, **kw: calls.append(len(x)) or
                        forward(x, *a, **kw))
    monkeypatch.setattr(draft_propose, "PREFILL_TOKENS", 9)  # one row of up to 8 tokens
    cache = DraftCache()
    parts = [propose(model, [contexts[r] for r in ids], 4),
             propose_cached(model, cache, ids, [contexts[r] for r in ids], 4)]
    assert calls[:3] == [1, 1, 1]  # the prefill, row by row
    for got, want in zip(parts, whole):
        assert got[0] == want[0]
        assert all(g == pytest.approx(w, rel=1e-5) for g, w in zip(got[1], want[1]))
    _verify(contexts, ids, parts[1][0], rng)
    assert propose_cached(model, cache, ids, [contexts[r] for r in ids], 4)[0] == \
        propose(model, [contexts[r] for r in ids], 4)[0]


def test_a_draft_step_costs_its_own_parameters_and_head_rows_over_the_policys_by_hand():
    from pipeline.draft_shape import step_fraction

    shape = DraftShape(vocab_size=24, hidden_size=32, layers=1, heads=4, kv_heads=2,
                       head_dim=8, intermediate_size=32, max_positions=64)
    # attention 32*4*8*2 + 32*2*8*2 = 3,072; MLP 3*32*32 = 3,072; norms 64 + final 32
    assert shape.own_parameters() == 6240
    assert step_fraction(shape, None, 70080) == pytest.approx((6240 + 24 * 32) / 70080)
    assert step_fraction(shape, 10, 70080) == pytest.approx((6240 + 10 * 32) / 70080)
