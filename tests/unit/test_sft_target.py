"""The warm-up's held-out loss target: training stops at the first check where the
held-out loss is at or below it (never before min_steps, never after max_steps), and the
learning rate holds its last value past the schedule."""

from __future__ import annotations

import pytest
import torch

from pipeline.policy.sft import SFTSettings, heldout_loss, lr_at, train_on_examples


class _Bigram(torch.nn.Module):
    """A model of the shape the trainer calls: model(input_ids=ids).logits."""

    training = True

    def __init__(self, vocab: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, input_ids):
        return type("Out", (), {"logits": self.table(input_ids)})()


def _examples():
    # prompt token 1, then the response 2 3 4 5 (every step predicts the next)
    return [([1, 2, 3, 4, 5], 1)] * 8


def test_training_stops_at_the_first_check_that_reaches_the_target():
    s = SFTSettings(steps=40, lr=0.05, warmup=1, target_loss=0.5, min_steps=5, max_steps=400,
                    check_every=5)
    model = _Bigram()
    losses = train_on_examples(model, _examples(), 0, s, heldout=_examples())
    done = len(losses)
    assert 15 <= done < 400 and done % 5 == 0
    assert heldout_loss(model, _examples(), 0) <= 0.5
    # one check earlier the target was not reached: the same run capped there is above it
    short = _Bigram()
    train_on_examples(short, _examples(), 0, SFTSettings(
        steps=40, lr=0.05, warmup=1, target_loss=0.5, min_steps=5, max_steps=done - 5,
        check_every=5), heldout=_examples())
    assert heldout_loss(short, _examples(), 0) > 0.5


def test_an_unreachable_target_stops_at_max_steps_and_none_trains_the_schedule():
    s = SFTSettings(steps=20, lr=0.01, warmup=1, target_loss=1e-9, max_steps=35, check_every=5)
    assert len(train_on_examples(_Bigram(), _examples(), 0, s, heldout=_examples())) == 35
    plain = SFTSettings(steps=20, lr=0.01, warmup=1)
    assert plain.most_steps == 20
    assert len(train_on_examples(_Bigram(), _examples(), 0, s, heldout=())) == 20  # no rows


def test_the_rate_holds_its_last_value_past_the_schedule():
    s = SFTSettings(steps=100, lr=1.0, warmup=10)
    assert lr_at(99, s) == pytest.approx(0.1, abs=1e-3)
    assert lr_at(150, s) == lr_at(400, s) == pytest.approx(0.1)


def test_bad_target_settings_are_refused():
    with pytest.raises(ValueError, match="min_steps <= max_steps"):
        SFTSettings(steps=10, target_loss=0.1, min_steps=50, max_steps=20)


def _mixed():
    # two continuations of prompt 1: the argmax can reproduce at most one of them
    return [([1, 2, 3], 1)] * 3 + [([1, 4, 5], 1)]


def test_heldout_exact_counts_the_examples_greedy_reproduces():
    from pipeline.policy.sft import heldout_exact

    model = _Bigram()
    with torch.no_grad():
        model.table.weight.zero_()
        model.table.weight[1, 2] = model.table.weight[2, 3] = 1.0  # 1 -> 2 -> 3
        model.table.weight[4, 5] = 1.0
    assert heldout_exact(model, _mixed(), 0) == 0.75  # 1 4 5 fails at its first token
    model.table.weight.data[1, 4] = 2.0
    assert heldout_exact(model, _mixed(), 0) == 0.25


def test_training_stops_at_the_first_check_that_reaches_the_exact_target():
    from pipeline.policy.sft import heldout_exact

    s = SFTSettings(steps=40, lr=0.05, warmup=1, target_exact=0.75, min_steps=5,
                    max_steps=400, check_every=5)
    model = _Bigram()
    assert heldout_exact(model, _mixed(), 0) < 0.75
    done = len(train_on_examples(model, _mixed(), 0, s, heldout=_mixed()))
    assert 5 <= done < 400 and done % 5 == 0
    assert heldout_exact(model, _mixed(), 0) >= 0.75
    assert SFTSettings(target_exact=0.5, max_steps=800).most_steps == 800
    with pytest.raises(ValueError, match="not both"):
        SFTSettings(target_loss=0.1, target_exact=0.5)
    with pytest.raises(ValueError, match="target_exact"):
        SFTSettings(target_exact=1.5)
