"""Statistics of `rhymectl bench e2e`: speedups across seeds, the Amdahl bound, and the
comparison of final held-out mean@k between two arms. Pure functions, no I/O.

The held-out comparison. Each arm trains S runs (seeds); each run's final evaluation gives
a mean@k per held-out prompt, and every run sees the same P prompts. A model of one value:

    y[arm, seed, prompt] = mu[arm] + prompt effect + run effect[arm, seed] + noise

Prompt difficulty varies far more than anything else (1-digit and 12-digit sorts), but the
prompt effects are the same in every run, so they cancel in the difference of arm means.
What does not cancel is the run effect: one training run's policy lifts or sinks all its
prompts together, and the arms' runs are independent (even with equal seeds, speculation
consumes random numbers differently, so the two arms' runs diverge from the first draft).
In this balanced nested design the exact test of the arm effect with runs as random
effects is the t-test on per-run means (prompts averaged inside each run): treating the
S x P values as independent would ignore the run effect and overstate certainty. Welch's
unequal-variance form is used (the arms may differ in run-to-run spread), with its
Welch-Satterthwaite degrees of freedom for the 95 % interval and the two-sided p.

With one run per arm the run effect cannot be estimated; then the test falls back to
the paired t-test over prompts (per-prompt differences), and `method` says so: it covers
sampling noise only, so it is a statement about these two runs, not about the configs.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence


def ratio_summary(values: Sequence[float]) -> dict:
    """{"median", "min", "max"} of per-seed ratios (e.g. speedups)."""
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def amdahl_bound(rollout_share: float, rollout_speedup: float) -> float:
    """End-to-end speedup if only the rollout (a share f of the baseline's step time) gets
    `rollout_speedup` times faster and nothing else changes: 1 / ((1 - f) + f / s)."""
    if rollout_speedup <= 0:
        raise ValueError("rollout_speedup must be > 0")
    f = min(max(rollout_share, 0.0), 1.0)
    return 1.0 / ((1.0 - f) + f / rollout_speedup)


def compare_heldout(baseline: Sequence[Sequence[float]], accelerated: Sequence[Sequence[float]],
                    level: float = 0.95) -> dict:
    """Difference of final held-out mean@k, accelerated - baseline.

    baseline[s][p], accelerated[s][p]: per-prompt values of each run (the same prompts,
    in the same order, in every run). Returns {"mean", "ci95": [lo, hi], "p", "se", "df",
    "method", "runs": [S_base, S_acc], "prompts": P}. Raises ValueError on ragged input.
    """
    from scipy import stats

    _check(baseline, accelerated)
    prompts = len(baseline[0])
    base_runs = [sum(r) / len(r) for r in baseline]
    acc_runs = [sum(r) / len(r) for r in accelerated]
    diff = statistics.fmean(acc_runs) - statistics.fmean(base_runs)
    if len(base_runs) >= 2 and len(acc_runs) >= 2:
        vb = statistics.variance(base_runs) / len(base_runs)
        va = statistics.variance(acc_runs) / len(acc_runs)
        se = math.sqrt(va + vb)
        df = _welch_df(va, len(acc_runs), vb, len(base_runs))
        method = "welch t-test on per-run means (runs random, prompts averaged within runs)"
    else:
        per_prompt = [statistics.fmean(a[p] for a in accelerated) -
                      statistics.fmean(b[p] for b in baseline) for p in range(prompts)]
        se = statistics.stdev(per_prompt) / math.sqrt(prompts) if prompts > 1 else 0.0
        df = max(prompts - 1, 1)
        method = "paired t-test over prompts (one run per arm: run-to-run variance not estimated)"
    if se == 0.0:
        p, half = (1.0 if diff == 0 else 0.0), 0.0
    else:
        p = float(2 * stats.t.sf(abs(diff) / se, df))
        half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return {"mean": round(diff, 6), "ci95": [round(diff - half, 6), round(diff + half, 6)],
            "p": round(p, 6), "se": round(se, 6), "df": round(df, 2), "method": method,
            "runs": [len(base_runs), len(acc_runs)], "prompts": prompts}


def _welch_df(va: float, na: int, vb: float, nb: int) -> float:
    """Welch-Satterthwaite degrees of freedom from the two squared standard errors."""
    denom = (va ** 2 / (na - 1) if na > 1 else 0.0) + (vb ** 2 / (nb - 1) if nb > 1 else 0.0)
    return (va + vb) ** 2 / denom if denom > 0 else float(na + nb - 2)


def _check(baseline, accelerated) -> None:
    runs = list(baseline) + list(accelerated)
    if not baseline or not accelerated:
        raise ValueError("each arm needs at least one run's per-prompt values")
    sizes = {len(r) for r in runs}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every run must score the same held-out prompts; got sizes {sorted(sizes)}")
