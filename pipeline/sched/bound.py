"""The ideal makespan of one step: a lower bound under the simulator's own cost model.

Every term uses the same `CostModel` (pass cost, tau, where speculation switches on) that
the policies run under in the simulator, so `makespan / ideal` measures placement, not a
mismatch between two models. With thr(b) = b * rate(b) the tokens per second a worker
makes at batch b (not monotone under speculation: it stops above spec_max_batch):

- work: every token at the best throughput a worker reaches at batch sizes up to the
  even share min(capacity, ceil(N / W)), plus every prompt's prefill, over W workers;
- pile-up: with lengths sorted l_1 >= l_2 >= ..., some worker holds k + 1 of the
  k * W + 1 longest requests, each at least l_{kW+1} long. That worker needs at least
  (k + 1) * l_{kW+1} / max_{b <= k+1} thr(b) seconds plus their prefills. k = 0 is the
  longest request's own critical path (alone, at the fastest rate); larger k is what
  bites when many responses hit max_tokens.

Both are lower bounds of any placement's makespan in the fluid model (the work term up to
the even-share assumption, which is exact when every worker runs its share at once).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pipeline.costs import CostModel


def throughputs(cost: CostModel, up_to: int) -> np.ndarray:
    """best[b] = max over b' <= b of thr(b') in tokens/s, for b = 0..up_to (best[0] = 0)."""
    thr = np.array([0.0] + [b * cost.rate(b) for b in range(1, up_to + 1)])
    return np.maximum.accumulate(thr)


def ideal_makespan(lengths: Sequence[int], workers: int, capacity: int, prompt_tokens: int,
                   cost: CostModel) -> float:
    """Seconds; lengths: [N] response tokens of the step's requests."""
    ls = np.sort(np.asarray(lengths, dtype=float))[::-1]
    n = len(ls)
    prefill_s = prompt_tokens * cost.per_token_s
    even = max(1, min(capacity, math.ceil(n / workers)))
    kmax = (n - 1) // workers  # the largest k with k * W + 1 <= N
    best = throughputs(cost, max(even, min(capacity, kmax + 1)))
    work = (ls.sum() / best[even] + n * prefill_s) / workers
    k = np.arange(kmax + 1)
    batch = np.minimum(k + 1, capacity)
    pile = (k + 1) * (ls[k * workers] / best[batch] + prefill_s)
    return float(max(work, pile.max(), share_bound(ls, workers, prefill_s, cost)))


def share_bound(ls: np.ndarray, workers: int, prefill_s: float, cost: CostModel) -> float:
    """Seconds: a worker whose longest response is m tokens and who generates t tokens
    needs at least a * m + c * t (a = base_s / the most tokens a pass gives a request,
    c = per_token_s * the fewest tokens scheduled per generated token). For a length x
    with n_x responses at least x long (S_x tokens) on q <= min(W, n_x) workers, the
    makespan is at least max(a x + c S_x / q, (q a x + c total) / W); the bound is the
    max over x of its min over q. It is tight when every worker must hold a response as
    long as the longest (many hit max_tokens): a x + c total / W.

    ls: [N] lengths sorted longest first."""
    speculating = cost.tau > 1 and (cost.spec_max_batch is None or cost.spec_max_batch >= 1)
    a = cost.base_s / (cost.tau if speculating else 1.0)
    c = cost.per_token_s * (min(1.0, (1 + cost.draft_tokens) / cost.tau) if speculating else 1.0)
    n_x = np.arange(1, len(ls) + 1, dtype=float)
    s_x = np.cumsum(ls) * c + n_x * prefill_s  # seconds of tokens and prefill at least x long
    total = s_x[-1]
    top_q = np.minimum(workers, n_x)
    # the crossing of the falling a x + s_x / q and the rising (q a x + total) / W
    ax = a * ls
    with np.errstate(divide="ignore", invalid="ignore"):
        # a x q^2 + (total - W a x) q - W s_x = 0
        lin = total - workers * ax
        cross = np.where(ax > 0, (-lin + np.sqrt(lin ** 2 + 4 * ax * workers * s_x)) / (2 * ax), top_q)
    best = np.full(len(ls), np.inf)
    for q in (np.floor(cross), np.ceil(cross)):
        q = np.clip(q, 1, top_q)
        best = np.minimum(best, np.maximum(ax + s_x / q, (q * ax + total) / workers))
    return float(best.max())


__all__ = ["ideal_makespan", "share_bound", "throughputs"]
