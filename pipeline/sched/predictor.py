"""Response-length prediction: a prompt's history, refined online by its group's probe.

RhymeRL observes that a prompt's response length rank barely moves between epochs, so
the prediction for a prompt is a recency-weighted mean of its per-epoch mean lengths over
the last `last_epochs` epochs it was seen in (weight decay**age, age 0 = newest), read from
the prompt's length evidence (`pipeline.history.lengths`, keyed by the prompt key). A prompt
without history gets the data set's fallback: the median of the known prompts'
predictions, or `default` when nothing is known yet. Seer's probe refines a prediction
online (`refine`, in `pipeline.sched.seer`): the first finished response of a group is
averaged with the history prediction (which counts as one observation), and replaces the
fallback outright.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from pipeline.history.epochs import newest_epochs
from pipeline.history.lengths import LengthEvidence


def refine(prior: float, prior_weight: float, observed: Sequence[float]) -> float:
    """Posterior-style mean: the prior counts as `prior_weight` observations (tokens)."""
    if not observed:
        return prior
    return (prior * prior_weight + float(sum(observed))) / (prior_weight + len(observed))


def recency_weighted(per_epoch: Mapping[int, Sequence[int]], last_epochs: int, decay: float) -> float:
    """Weighted mean of per-epoch mean lengths over the newest `last_epochs` epochs."""
    epochs = newest_epochs((e for e, lengths in per_epoch.items() if len(lengths)), last_epochs)
    if not epochs:
        raise ValueError("no lengths to predict from")
    weights = [decay ** age for age in range(len(epochs))][::-1]  # oldest first, like epochs
    means = [float(np.mean(per_epoch[e])) for e in epochs]
    return float(np.dot(weights, means) / sum(weights))


class LengthPredictor:
    """Predicted response length (tokens) per prompt key.

    evidence: the prompts' history lengths by epoch (their finished siblings are `refine`'s);
    before_epoch: use only epochs strictly before it (to predict that epoch honestly).
    """

    def __init__(self, evidence: LengthEvidence | None = None, *, last_epochs: int = 3,
                 decay: float = 0.5, default: float = 64.0, before_epoch: int | None = None):
        if last_epochs < 1:
            raise ValueError(f"last_epochs must be >= 1, got {last_epochs}")
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if default < 0:
            raise ValueError(f"default must be >= 0, got {default}")
        self.last_epochs, self.decay, self.default = last_epochs, decay, default
        self.predictions: dict[str, float] = {}
        pooled: list[int] = []
        for key in (evidence.prompts() if evidence is not None else ()):
            usable = {e: ls for e, ls in evidence.by_epoch(key).items()
                      if len(ls) and (before_epoch is None or e < before_epoch)}
            if usable:
                self.predictions[key] = recency_weighted(usable, last_epochs, decay)
                pooled.extend(x for e in newest_epochs(usable, last_epochs) for x in usable[e])
        self.pooled = np.sort(np.asarray(pooled, dtype=float))
        self.fallback = (float(np.median(list(self.predictions.values())))
                         if self.predictions else float(default))

    def known(self, key: str) -> bool:
        return key in self.predictions

    def predict(self, key: str) -> float:
        """The history prediction, or the fallback for a prompt without history."""
        return self.predictions.get(key, self.fallback)

    def typical_max(self, requests: int) -> float:
        """The length the longest of `requests` random responses probably reaches: the
        (1 - 1/requests) quantile of the recorded lengths (0 without history)."""
        if not len(self.pooled) or requests <= 1:
            return 0.0
        return float(np.quantile(self.pooled, 1.0 - 1.0 / requests))


__all__ = ["LengthPredictor", "recency_weighted", "refine"]
