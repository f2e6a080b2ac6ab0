"""Distilling the draft model from the policy (`pipeline.train.teacher`,
`DraftTrainer` with teachers): the teacher's tokens are the policy's, distillation brings
the draft closer to the policy than the sampled tokens do, and the teachers survive a
checkpoint."""

from __future__ import annotations

import random

import pytest
import torch

from pipeline.drafting.draft_model import DraftModel
from pipeline.drafting.draft_state import load_state, save_state
from pipeline.drafting.draft_train import DraftTrainer, TrainSettings
from pipeline.train.teacher import Teacher, response_targets, soft_targets, top_k
from tests.unit.test_draft_model import SMALL, _corpus, one_thread  # noqa: F401

VOCAB = SMALL.vocab_size


# -- reading the teacher from the trainer's logits -------------------------------------------
def test_top_k_is_the_log_softmaxs_k_largest_in_chunks_or_not():
    logits = torch.randn(3, 7, 50, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ids, lps = top_k(logits, 4)
    full = torch.log_softmax(logits.float(), dim=-1)
    want_lp, want_ids = full.topk(4, dim=-1)
    assert ids.dtype == torch.int32 and lps.dtype == torch.float16
    assert torch.equal(ids.long(), want_ids)
    assert torch.allclose(lps.float(), want_lp, atol=2e-3)
    chunked = top_k(logits, 4, chunk_bytes=4 * 50 * 2)  # two positions a chunk
    assert torch.equal(chunked[0], ids) and torch.equal(chunked[1], lps)
    with pytest.raises(ValueError, match="k = 51"):
        top_k(logits, 51)


def test_response_targets_are_the_positions_that_predict_each_response_token():
    """Row i's teacher row r is the position that predicts response token r, with the
    logits cut at `first` as the trainer's `logits_to_keep` cuts them."""
    n, width, first = 2, 9, 2
    prompt_lens, total_lens = torch.tensor([3, 5]), torch.tensor([7, 9])
    # position j (column j + first) of row i "predicts" marker 100 * i + j + first + 1
    ids = torch.tensor([[[100 * i + j + first + 1] for j in range(width - first)]
                        for i in range(n)], dtype=torch.int32)
    lps = torch.zeros_like(ids, dtype=torch.float16)
    out = response_targets(ids, lps, prompt_lens, total_lens, first)
    assert [t.ids[:, 0].tolist() for t in out] == [[3, 4, 5, 6], [105, 106, 107, 108]]
    with pytest.raises(ValueError, match="prompt starts before"):
        response_targets(ids, lps, torch.tensor([2, 5]), total_lens, first=2)


def test_soft_targets_renormalise_the_k_and_follow_the_temperature():
    t = Teacher(torch.tensor([[4, 2, 9]], dtype=torch.int32),
                torch.log(torch.tensor([[0.4, 0.2, 0.1]])).to(torch.float16))
    p = soft_targets(t)
    assert torch.allclose(p, torch.tensor([[4 / 7, 2 / 7, 1 / 7]]), atol=1e-3)
    sharp = soft_targets(t, temperature=0.5)
    assert sharp[0, 0] > p[0, 0] and torch.allclose(sharp.sum(-1), torch.ones(1))


# -- training on teachers --------------------------------------------------------------------
def _bigram(seed: int = 0, temperature: float = 0.7) -> torch.Tensor:
    """A fixed next-token distribution [V, V] (the "policy"), fairly flat at T = 1."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(VOCAB, VOCAB, generator=g) / temperature, dim=-1)


def _sampled(table: torch.Tensor, n: int, seed: int, k: int = 4):
    """(prompt, response, teacher) rollouts sampled from the bigram `table`; the teacher
    its k most likely tokens at each position."""
    rng = torch.Generator().manual_seed(seed)
    py = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [py.randrange(VOCAB) for _ in range(3)]
        seq, response = list(prompt), []
        for _ in range(py.randrange(6, 14)):
            nxt = int(torch.multinomial(table[seq[-1]], 1, generator=rng))
            response.append(nxt)
            seq.append(nxt)
        prev = torch.tensor(seq[len(prompt) - 1:-1])
        lp, ids = torch.log(table[prev]).topk(k, dim=-1)
        out.append((prompt, response, Teacher(ids.to(torch.int32), lp.to(torch.float16))))
    return out


def _overlap(model: DraftModel, table: torch.Tensor) -> float:
    """Mean over previous tokens of sum min(p, q): a sampled draft's acceptance
    probability with the policy p = the table's row and q = the draft's next-token
    distribution after a fixed prompt."""
    total = 0.0
    with torch.no_grad():
        for prev in range(VOCAB):
            logits = model.logits(model.hidden(torch.tensor([[1, 5, prev]])))[0, -1]
            total += float(torch.minimum(table[prev], torch.softmax(logits, -1)).sum())
    return total / VOCAB


def _distil_trainer(seed: int) -> DraftTrainer:
    return DraftTrainer(DraftModel(SMALL, seed=seed),
                        TrainSettings(updates=15, batch=16, lr=1e-2, window=1), seed=seed)


def test_distillation_brings_the_draft_closer_to_the_policy_than_its_samples():
    """Same seed, same rollouts: the draft trained on the teacher's top-4 overlaps the
    policy's distribution more than the one trained on the sampled tokens alone."""
    table = _bigram()
    steps = [_sampled(table, 24, seed) for seed in (1, 2, 3)]
    taught, sampled = _distil_trainer(7), _distil_trainer(7)
    for step in steps:
        taught.train(step)
        sampled.train([(p, r) for p, r, _ in step])
    untrained = _overlap(DraftModel(SMALL, seed=7), table)
    # 0.66 against 0.51 (and 0.48 untrained) when this was written
    assert _overlap(taught.model, table) > max(_overlap(sampled.model, table), untrained) + 0.05


def test_a_one_hot_teacher_on_the_sampled_token_is_the_sampled_tokens_loss():
    rollouts = _corpus(3, n=8)
    hot = [(p, r, Teacher(torch.tensor([[t, 0] for t in r], dtype=torch.int32),
                          torch.tensor([[0.0, -1e4] for _ in r]).to(torch.float16)))
           for p, r in rollouts]
    trainer = _distil_trainer(1)
    assert trainer.loss(hot) == pytest.approx(trainer.loss(rollouts), rel=1e-5)


def test_rollouts_with_and_without_teachers_train_together():
    table = _bigram(1)
    step = _sampled(table, 8, 4)
    mixed = [x if i % 2 else x[:2] for i, x in enumerate(step)]
    trainer = _distil_trainer(2)
    report = trainer.train(mixed)
    assert report.loss_after < report.loss_before
    assert [t is None for *_, t in trainer.window[-1]] == [i % 2 == 0 for i in range(8)]


def test_a_teacher_that_does_not_cover_its_response_is_refused():
    p, r, t = _sampled(_bigram(), 1, 5)[0]
    with pytest.raises(ValueError, match="teacher of"):
        _distil_trainer(0).train([(p, r + [3], t)])


def test_teachers_survive_save_and_load_and_train_the_same(tmp_path):
    table = _bigram(2)
    trainer = DraftTrainer(DraftModel(SMALL, seed=3),
                           TrainSettings(updates=10, batch=8, lr=1e-2, window=3), seed=3)
    first = _sampled(table, 6, 8)
    trainer.train([x if i != 2 else x[:2] for i, x in enumerate(first)])
    trainer.train(_sampled(table, 5, 9))
    path = tmp_path / "draft.safetensors"
    save_state(trainer, path)
    loaded = load_state(path)
    for mine, theirs in zip(trainer.window, loaded.window):
        for (p, r, t), (p2, r2, t2) in zip(mine, theirs):
            assert torch.equal(p, p2) and torch.equal(r, r2)
            assert (t is None) == (t2 is None)
            if t is not None:
                assert torch.equal(t.ids, t2.ids) and torch.equal(t.logprobs, t2.logprobs)
    nxt = _sampled(table, 6, 10)
    trainer.train(nxt)
    loaded.train(nxt)
    for (name, x), (_, y) in zip(trainer.model.state_dict().items(),
                                 loaded.model.state_dict().items()):
        assert torch.equal(x, y), name


# -- a bench's teacher: a saved policy's forward ------------------------------------------------
def test_a_saved_policys_teachers_are_each_rollouts_own_whatever_it_is_batched_with(tmp_path):
    """`policy_teachers` (what `bench spec` teaches the draft with) gives each rollout the
    top-k of the policy's own forward over it alone, though it batches rollouts of other
    lengths together (right padding)."""
    from test_actor_devices import tiny_module

    from pipeline.train.teacher import policy_teachers

    torch.manual_seed(0)
    policy = tiny_module("cpu")
    policy.save_pretrained(tmp_path / "policy")
    rng = random.Random(1)
    rollouts = [([rng.randrange(64) for _ in range(rng.randrange(2, 6))],
                 [rng.randrange(64) for _ in range(rng.randrange(1, 9))]) for _ in range(5)]
    taught = policy_teachers(tmp_path / "policy", rollouts, 3, rows=3)
    assert len(taught) == len(rollouts)
    with torch.no_grad():
        for (p, r), t in zip(rollouts, taught):
            logits = policy(input_ids=torch.tensor([p + r])).logits[0]
            ids, lps = top_k(logits[len(p) - 1:len(p) + len(r) - 1], 3)
            assert len(t) == len(r) and torch.equal(t.ids, ids)
            assert torch.allclose(t.logprobs.float(), lps.float(), atol=2e-3)


def test_the_bench_teaches_only_a_draft_model_at_temperature_above_zero(tmp_path):
    from dataclasses import replace

    from pipeline.bench.spec import _teacher_of
    from pipeline.bench.spec_plan import Plan
    from pipeline.config.schema import Config

    cfg = Config()
    plan = lambda **kw: Plan(replace(cfg, rollout=replace(cfg.rollout, **kw)), tmp_path, 3, 2)
    assert _teacher_of(plan(temperature=1.0), "history+group+model") is not None
    assert _teacher_of(plan(temperature=1.0), "history+group") is None
    assert _teacher_of(plan(temperature=0.0), "history+group+model") is None
    off = Plan(replace(cfg, spec=replace(cfg.spec, draft_distill=0)), tmp_path, 3, 2)
    assert _teacher_of(off, "history+group+model") is None


def test_the_bench_teaches_each_step_with_the_nearest_policy_it_kept():
    from pipeline.bench.spec import teacher_epoch

    # two steps an epoch: each step's own policy or one update older (ties: the older)
    assert [teacher_epoch(s, 2) for s in range(6)] == [0, 0, 1, 1, 2, 2]
    # six: at most three updates away
    assert [teacher_epoch(s, 6) for s in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_teacher_wider_than_the_limit_is_refused_at_load_and_one_within_it_loads():
    from pipeline.config import ConfigError, load_config
    from pipeline.config.load import MAX_DRAFT_DISTILL

    with pytest.raises(ConfigError) as err:
        load_config(None, ["spec.method=history+group+model",
                           f"spec.draft_distill={MAX_DRAFT_DISTILL + 1}"])
    assert err.value.exit_code == 2
    assert err.value.problems == [
        f"spec.draft_distill = {MAX_DRAFT_DISTILL + 1}: the policy's most likely tokens the draft "
        f"learns at each response token, at most {MAX_DRAFT_DISTILL} (each costs 6 bytes a token "
        f"in the draft's window and checkpoints; 8, the default, carry nearly all the mass); use "
        f"1 to {MAX_DRAFT_DISTILL}, or 0 for the sampled tokens"]
    cfg = load_config(None, ["spec.method=history+group+model", "spec.draft_distill=0"])
    assert cfg.spec.draft_distill == 0


def test_a_state_whose_teachers_do_not_cover_its_responses_is_refused(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    trainer = _distil_trainer(0)
    trainer.train(_sampled(_bigram(), 4, 1))
    path = tmp_path / "draft.safetensors"
    save_state(trainer, path)
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    for name in ("window.0.teacher_ids", "window.0.teacher_logprobs"):
        tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(ValueError, match="teachers do not cover"):
        load_state(path)
