"""Length evidence: one object per prompt key holding history lengths by epoch and the
step's finished siblings, read by the draft budget's remaining-length estimate and the
placement's length predictor (pure logic, milliseconds)."""

from __future__ import annotations

import pytest

from pipeline.drafting.remaining import RemainingTracker
from pipeline.history.epochs import last_epochs, newest_epochs
from pipeline.history.lengths import LengthEvidence
from pipeline.sched.predictor import LengthPredictor


def test_history_by_epoch_and_finished_siblings():
    ev = LengthEvidence({"p": {0: [10, 20]}})
    ev.add("p", 1, 30)
    ev.add("q", 1, 5)
    assert ev.by_epoch("p") == {0: [10, 20], 1: [30]} and ev.by_epoch("new") == {}
    assert sorted(ev.prompts()) == ["p", "q"]
    ev.finished("p", 7)
    assert ev.lengths("p") == [10, 20, 30, 7]
    assert sorted(ev.history_lengths()) == [5, 10, 20, 30]  # siblings are not history
    ev.end_group("p")
    assert ev.lengths("p") == [10, 20, 30]
    ev.set_history("p", {2: [40]})  # replaces the prompt's history
    assert ev.lengths("p") == [40] and ev.by_epoch("q") == {1: [5]}


def test_versions_move_with_what_readers_derive():
    ev = LengthEvidence()
    seen = (ev.version("p"), ev.history_version)
    ev.finished("p", 3)
    assert ev.version("p") != seen[0] and ev.history_version == seen[1]
    seen = (ev.version("p"), ev.history_version)
    ev.end_group("q")  # nothing of q's changed
    assert ev.version("q") == 0
    ev.add("q", 0, 4)
    assert ev.version("p") == seen[0] and ev.history_version != seen[1]


def test_the_remaining_estimate_and_the_predictor_read_the_same_evidence():
    ev = LengthEvidence({"p": {0: [12, 30]}})
    remaining = RemainingTracker(ev)
    # 1 generated: samples above 1 are 12 and 30 -> mean 21 - 1 = 20
    assert remaining.estimate("r", "p", 1)[0] == 20.0
    assert LengthPredictor(ev).predict("p") == pytest.approx(21.0)
    ev.finished("p", 3)  # a sibling ended: the estimate changes, the cached one goes
    assert remaining.estimate_many([("r", "p", 2)])[0][0] == pytest.approx((3 + 12 + 30) / 3 - 2)
    ev.end_group("p")
    ev.add("p", 1, 60)  # the step's responses, as the placement learns them
    assert remaining.estimate_many([("r", "p", 2)])[0][0] == pytest.approx((12 + 30 + 60) / 3 - 2)
    assert LengthPredictor(ev, decay=1.0).predict("p") == pytest.approx((21 + 60) / 2)


def test_the_newest_epochs_rule():
    assert newest_epochs([3, 1, 2, 1], 2) == [2, 3]
    assert newest_epochs([], 2) == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        newest_epochs([1], 0)
    rows = [(0, "a"), (2, "b"), (1, "c"), (2, "d")]
    assert last_epochs(rows, 2, epoch=lambda r: r[0]) == [(2, "b"), (1, "c"), (2, "d")]
    assert last_epochs(rows, 3, epoch=lambda r: r[0]) == rows
