"""Per-token acceptance from a suffix tree's path counts, calibrated online.

A draft from a suffix tree (arctic-inference's `speculate`, as vLLM's SuffixDecoding
scores it) carries the path probability p_j of its first j tokens: the product of
count(child) / count(parent) along the matched path. The conditional probability of
token j given tokens 1 .. j-1 is q_j = p_j / p_{j-1} (p_0 = 1). If the tree's counts were
the target's distribution, token j would be accepted with probability q_j (greedy
verification accepts the argmax; rejection sampling of a point-mass draft accepts with
the target's probability of that token). They are not — the tree holds a few earlier
responses, and the policy moves — so `Calibrator` maps q to an observed acceptance rate:

- q falls into one of `EDGES`' buckets; each bucket counts tried and accepted tokens;
- its estimate is a Beta posterior mean with `prior_weight` pseudo-trials at the
  bucket's own mean q (uncalibrated trees are believed until evidence says otherwise);
- a verified draft of k tokens of which m were accepted is m successes (tokens 1..m) and,
  if m < k, one failure (token m+1); tokens after the first rejection were never tested.

`accept(q)` is the calibrated probability; `cumulative(qs)` turns a draft's q's into the
probability that its first j tokens are all accepted. Pure logic, no vLLM.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

# Bucket edges over q in [0, 1]: finer near 1, where most tree tokens sit.
EDGES = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0 + 1e-9)


def conditional(path_probs: Sequence[float]) -> list[float]:
    """q_j = p_j / p_{j-1} from a draft's non-increasing path probabilities p_j."""
    out, prev = [], 1.0
    for p in path_probs:
        out.append(min(1.0, p / prev) if prev > 0 else 0.0)
        prev = p
    return out


@dataclass(frozen=True)
class CalibrationRow:
    """One bucket: q range, tokens tried, mean predicted q, observed and calibrated rate."""

    lo: float
    hi: float
    tried: float
    predicted: float
    observed: float | None
    calibrated: float


class Calibrator:
    """Observed acceptance per bucket of predicted per-token probability q."""

    def __init__(self, prior_weight: float = 4.0, decay: float = 1.0):
        if prior_weight <= 0 or not 0 < decay <= 1:
            raise ValueError(f"need prior_weight > 0 and decay in (0, 1], got "
                             f"{prior_weight}, {decay}")
        self.prior_weight, self.decay = prior_weight, decay
        n = len(EDGES) - 1
        self._tried = [0.0] * n
        self._accepted = [0.0] * n
        self._qsum = [0.0] * n
        self._rate = [(EDGES[i] + min(EDGES[i + 1], 1.0)) / 2 for i in range(n)]

    @staticmethod
    def bucket(q: float) -> int:
        return min(max(bisect_right(EDGES, q) - 1, 0), len(EDGES) - 2)

    def observe(self, qs: Sequence[float], accepted: int) -> None:
        """A verified draft with per-token q's `qs` had its first `accepted` tokens accepted."""
        k = len(qs)
        accepted = max(0, min(int(accepted), k))
        tested = accepted + (1 if accepted < k else 0)
        d = self.decay
        for j in range(tested):
            b = self.bucket(qs[j])
            if d < 1:
                self._tried[b] *= d
                self._accepted[b] *= d
                self._qsum[b] *= d
            self._tried[b] += 1.0
            self._qsum[b] += qs[j]
            if j < accepted:
                self._accepted[b] += 1.0
            w = self.prior_weight
            prior = self._qsum[b] / self._tried[b]
            self._rate[b] = (self._accepted[b] + w * prior) / (self._tried[b] + w)

    def accept(self, q: float) -> float:
        """Calibrated probability that a token with tree probability q is accepted."""
        return self._rate[self.bucket(q)]

    def best(self) -> float:
        """The highest calibrated rate of any bucket (an optimistic first-token bound)."""
        return max(self._rate)

    def cumulative(self, qs: Sequence[float]) -> list[float]:
        """P(tokens 1..j all accepted) for each j of a draft with per-token q's."""
        out, g, rate, bucket = [], 1.0, self._rate, self.bucket
        for q in qs:
            g *= rate[bucket(q)]
            out.append(g)
        return out

    def table(self) -> list[CalibrationRow]:
        """Buckets with evidence, lowest q first."""
        rows = []
        for b in range(len(EDGES) - 1):
            tried = self._tried[b]
            if tried <= 0:
                continue
            rows.append(CalibrationRow(EDGES[b], min(EDGES[b + 1], 1.0), round(tried, 3),
                                       self._qsum[b] / tried, self._accepted[b] / tried,
                                       self._rate[b]))
        return rows

    def state(self) -> dict:
        """Raw counts (JSON-friendly) to merge across runs with `merge_tables`."""
        return {"edges": list(EDGES[:-1]) + [1.0], "tried": list(self._tried),
                "accepted": list(self._accepted), "qsum": list(self._qsum)}


def restore_state(cal: Calibrator, state: dict) -> None:
    """Give `cal` the counts of `Calibrator.state()` (same buckets); each rate is the one
    `observe` computed from those counts."""
    n = len(EDGES) - 1
    tried, accepted, qsum = (list(map(float, state[k])) for k in ("tried", "accepted", "qsum"))
    if not len(tried) == len(accepted) == len(qsum) == n:
        raise ValueError(f"calibration state has {len(tried)} buckets, expected {n}")
    cal._tried, cal._accepted, cal._qsum = tried, accepted, qsum
    w = cal.prior_weight
    for b in range(n):
        if tried[b] > 0:
            cal._rate[b] = (accepted[b] + w * (qsum[b] / tried[b])) / (tried[b] + w)


def merge_tables(states: Sequence[dict]) -> list[dict]:
    """Sum `Calibrator.state()` counts of several runs into table rows (JSON dicts):
    lo, hi, tried, predicted (mean q), observed (accepted / tried)."""
    if not states:
        return []
    n = len(states[0]["tried"])
    edges = states[0]["edges"]
    rows = []
    for b in range(n):
        tried = sum(s["tried"][b] for s in states)
        if tried <= 0:
            continue
        acc = sum(s["accepted"][b] for s in states)
        qsum = sum(s["qsum"][b] for s in states)
        rows.append({"lo": edges[b], "hi": edges[b + 1], "tried": int(round(tried)),
                     "predicted": round(qsum / tried, 4), "observed": round(acc / tried, 4)})
    return rows


__all__ = ["CalibrationRow", "Calibrator", "EDGES", "conditional", "merge_tables",
           "restore_state"]
