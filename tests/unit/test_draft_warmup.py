"""The draft model's warm-up before a fresh run's first step (`pipeline.loop.warmup`): the
trainer's warm-up lowers the loss, stays out of the per-step window and optimizer, counts
toward the draft vocabulary and repeats exactly; the warm-up prompts a run asks for are
refused in one line where the data or the ranks cannot give them."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.config import load_config
from pipeline.drafting.draft_model import DraftModel
from pipeline.drafting.draft_train import DraftTrainer, TrainSettings
from pipeline.errors import UsageError
from pipeline.loop.batches import even_share, warmup_batch
from tests.unit.test_draft_model import SMALL, _corpus, one_thread  # noqa: F401


def _trainer(seed: int = 0, vocab: int = 0) -> DraftTrainer:
    return DraftTrainer(DraftModel(SMALL, seed=seed),
                        TrainSettings(updates=5, batch=8, lr=1e-2, draft_vocab=vocab), seed=seed)


def _weights(trainer: DraftTrainer) -> dict:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_the_warm_up_lowers_the_loss_outside_the_window_and_the_steps_optimizer():
    trainer = _trainer()
    before = _weights(trainer)
    report = trainer.warm_up(_corpus(5, n=32), updates=40)
    assert report.updates == 40 and report.loss_after < report.loss_before
    assert any(not torch.equal(v, before[k]) for k, v in _weights(trainer).items())
    assert trainer.window == [] and trainer.calls == 0
    assert trainer.opt.state == {}  # the per-step training starts with moments of its own
    # the steps then train from the warmed-up weights: a lower loss on unseen rollouts
    cold = _trainer()
    unseen = _corpus(6)
    assert trainer.loss(unseen) < cold.loss(unseen)


def test_the_warm_up_counts_toward_the_draft_vocabulary():
    trainer = _trainer(vocab=6)
    corpus = _corpus(5, n=32)
    trainer.warm_up(corpus, updates=2)
    counted = torch.bincount(torch.tensor([t for _, r in corpus for t in r]),
                             minlength=SMALL.vocab_size)
    assert torch.equal(trainer.counts, counted)
    assert trainer.model.draft_ids is not None and len(trainer.model.draft_ids) == 6


def test_the_warm_up_repeats_exactly_and_differs_from_a_step_of_the_same_rollouts():
    a, b, step = _trainer(seed=3), _trainer(seed=3), _trainer(seed=3)
    for trainer in (a, b):
        trainer.warm_up(_corpus(5), updates=5)
    step.train(_corpus(5))  # the same number of updates, as the first step's training
    assert all(torch.equal(v, _weights(b)[k]) for k, v in _weights(a).items())
    assert any(not torch.equal(v, _weights(step)[k]) for k, v in _weights(a).items())


def test_no_warm_up_asks_for_no_prompts_and_a_warm_up_shares_evenly():
    assert warmup_batch(load_config(None, ["data.task=sort"]), 4) == []
    assert even_share(list(range(10)), 4) == list(range(8))
    cfg = load_config(None, ["data.task=sort", "data.train_size=32",
                             "spec.method=history+group+model", "spec.draft_warmup=rollout",
                             "spec.draft_warmup_prompts=10"])
    assert warmup_batch(load_config(None, ["data.task=sort", "spec.method=history+group+model",
                                           "spec.draft_warmup=eval"]), 4) == []
    warm = warmup_batch(cfg, 4)
    assert len(warm) == 8 and len({p.id for p in warm}) == 8


def test_warm_up_prompts_the_data_or_the_ranks_cannot_give_are_refused_in_one_line(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                            for i in range(10)))
    cfg = load_config(None, [f"data.path={rows}", "data.train_size=6",
                             "data.train_batch_size=2", "train.ppo_mini_batch_size=2",
                             "spec.method=history+group+model", "spec.draft_warmup=rollout",
                             "spec.draft_warmup_prompts=5"])
    with pytest.raises(UsageError, match=r"^spec.draft_warmup_prompts = 5: the data set has 10 "
                                         r"rows, 6 of them trained on: ask for at most 4"):
        warmup_batch(cfg, 1)
    cfg = load_config(None, ["data.task=sort", "spec.method=history+group+model",
                             "spec.draft_warmup=rollout", "spec.draft_warmup_prompts=3"])
    with pytest.raises(UsageError, match="fewer than the 4 ranks.*at least 4, or use spec.draft_warmup=eval"):
        warmup_batch(cfg, 4)


def test_a_warm_up_without_a_draft_model_is_refused():
    from pipeline.config.load import draft_model_problems

    cfg = load_config(None, ["data.task=sort", "spec.method=history+group",
                             "spec.draft_warmup=eval"])
    assert draft_model_problems(cfg) == [
        "spec.draft_warmup = eval applies to a draft model (history+group+model), and "
        "spec.method is history+group: remove it or use that method"]
