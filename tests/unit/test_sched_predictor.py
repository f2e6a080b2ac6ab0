"""Length predictor: recency weighting over the prompts' length evidence, the fallback, the
probe's online refinement."""

from __future__ import annotations

import pytest

from pipeline.history.lengths import LengthEvidence
from pipeline.sched.predictor import LengthPredictor, recency_weighted, refine

HISTORY = {"a": {0: [10, 20], 1: [30]}, "b": {1: [4, 6]}}
EVIDENCE = LengthEvidence(HISTORY)


def test_recency_weighted_by_hand():
    # epoch 0 mean 15 (age 1, weight 0.5), epoch 1 mean 30 (weight 1): (7.5 + 30) / 1.5
    assert recency_weighted(HISTORY["a"], last_epochs=3, decay=0.5) == pytest.approx(25.0)
    assert recency_weighted(HISTORY["a"], last_epochs=1, decay=0.5) == pytest.approx(30.0)
    assert recency_weighted({0: [10], 1: [20], 2: [40]}, last_epochs=2, decay=1.0) == pytest.approx(30.0)
    with pytest.raises(ValueError, match="no lengths"):
        recency_weighted({0: []}, 3, 0.5)


def test_known_prompts_and_the_median_fallback():
    p = LengthPredictor(EVIDENCE)
    assert p.predict("a") == pytest.approx(25.0) and p.predict("b") == pytest.approx(5.0)
    assert p.known("a") and not p.known("new")
    assert p.fallback == pytest.approx(15.0)  # median of 25 and 5
    assert p.predict("new") == pytest.approx(15.0)


def test_before_epoch_hides_the_epoch_being_predicted():
    p = LengthPredictor(EVIDENCE, before_epoch=1)
    assert p.predict("a") == pytest.approx(15.0)
    assert not p.known("b")
    assert p.predict("b") == pytest.approx(15.0)  # the fallback: the only known prompt's value


def test_no_history_uses_the_configured_default():
    p = LengthPredictor(LengthEvidence(), default=48.0)
    assert p.fallback == 48.0 and p.predict("x") == 48.0 and not p.known("x")
    assert p.typical_max(64) == 0.0
    assert LengthPredictor().predict("x") == 64.0


def test_probe_refines_known_and_replaces_fallback():
    """As seer refines a group's prediction by its probe: the history prediction counts as
    one observation, the fallback as none."""
    p = LengthPredictor(EVIDENCE)
    assert (p.predict("a"), p.predict("new")) == (pytest.approx(25.0), pytest.approx(15.0))
    assert refine(p.predict("a"), 1.0, [35]) == pytest.approx(30.0)
    assert refine(p.predict("new"), 0.0, [40]) == pytest.approx(40.0)
    assert refine(p.predict("new"), 0.0, [40, 20]) == pytest.approx(30.0)


def test_refine_by_hand():
    assert refine(100.0, 1.0, []) == 100.0
    assert refine(100.0, 1.0, [50]) == pytest.approx(75.0)
    assert refine(100.0, 0.0, [50, 70]) == pytest.approx(60.0)


def test_typical_max_is_the_quantile_of_recorded_lengths():
    p = LengthPredictor(EVIDENCE)  # pooled lengths 10, 20, 30, 4, 6
    assert p.typical_max(2) == pytest.approx(10.0)  # the median
    assert p.typical_max(1) == 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"last_epochs": 0}, "last_epochs must be >= 1"),
    ({"decay": 0.0}, r"decay must be in \(0, 1\]"),
    ({"default": -1.0}, "default must be >= 0"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LengthPredictor(EVIDENCE, **kwargs)


def test_predicts_from_the_history_stores_lengths(tmp_path):
    from pipeline.history.store import HistoryStore, RolloutRecord

    store = HistoryStore(tmp_path)
    store.append(0, [RolloutRecord("p", "h", 0, 0, 0, i, [1] * n, n, "stop", 0.0, 0.1)
                     for i, n in enumerate([3, 5])])
    store = HistoryStore(tmp_path, readonly=True)
    assert LengthPredictor(LengthEvidence(store.lengths())).predict("p") == pytest.approx(4.0)
    # as training looks prompts up: by the hash of their token ids
    by_hash = LengthPredictor(LengthEvidence(store.lengths("prompt_hash")))
    assert by_hash.predict("h") == pytest.approx(4.0) and not by_hash.known("p")


def test_the_newest_epochs_with_lengths_are_the_ones_averaged_and_pooled():
    """Epochs are cut by the history's one rule (`newest_epochs`); an epoch without lengths
    does not count as one of them."""
    evidence = LengthEvidence({"a": {0: [100], 1: [10], 2: [], 3: [20]}})
    p = LengthPredictor(evidence, last_epochs=2, decay=1.0)
    assert p.predict("a") == pytest.approx(15.0)
    assert p.pooled.tolist() == [10.0, 20.0]
