"""`rhymectl bench spec --repeats R`: the arithmetic over interleaved repeats.

Each repeat runs every method once, so the machine's slow drift (other processes, thermal
state) lands on every method alike, and the order rotates from repeat to repeat (A B C,
B C A, C A B, ...): a run right after another can be slower (measured on this project's
VMs: the second of two back-to-back runs lost 0.6-1.1 s of 5-6 s in 4 of 4 pairs), and
with a fixed order that would fall on the same method every time. Ratios are taken within
a repeat, then summarised. Per method: the median of every numeric field over the
repeats, and for `rollout_s` and every ratio (`speedup` over none, `vs_suffix` = own
rollout_s / suffix's, `drafter_frac`) also the per-repeat values (`KEY_runs`) and their
min and max (`KEY_min`, `KEY_max`). Per-step counts (a KEY with its per-step values in
`KEY_steps`, e.g. critical_passes): KEY_steps holds each step's median over the repeats,
and KEY the median over every step of every repeat. Pure arithmetic.
"""

from __future__ import annotations

from statistics import median
from typing import Sequence

SPREAD_KEYS = ("rollout_s", "speedup", "vs_suffix", "drafter_frac")
REFERENCE = "suffix"
STEPS = "_steps"  # KEY_steps: KEY's per-step values


def run_order(names: Sequence[str], repeat: int) -> list[str]:
    """The methods in the order repeat `repeat` (from 0) runs them: `names` rotated, so
    over len(names) repeats every method runs once in every position."""
    k = repeat % len(names) if names else 0
    return [*names[k:], *names[:k]]


def with_vs_suffix(summary: dict[str, dict]) -> dict[str, dict]:
    """One repeat's summary with `vs_suffix` per method (None without a suffix run)."""
    ref = summary.get(REFERENCE, {}).get("rollout_s")
    return {name: {**m, "vs_suffix": round(m["rollout_s"] / ref, 4) if ref else None}
            for name, m in summary.items()}


def aggregate(repeats: Sequence[dict[str, dict]]) -> dict[str, dict]:
    """Median (and runs, min, max for SPREAD_KEYS) over repeats of `summarize` output."""
    if not repeats:
        raise ValueError("no repeats to aggregate")
    repeats = [with_vs_suffix(r) for r in repeats]
    out: dict[str, dict] = {}
    for name in repeats[0]:
        runs = [r[name] for r in repeats]
        merged: dict = {"repeats": len(runs)}
        for key, first in runs[0].items():
            values = [m[key] for m in runs]
            if key == "identical":
                merged[key] = None if first is None else all(values)
            elif isinstance(first, bool) or not isinstance(first, (int, float)) \
                    or any(v is None for v in values):
                merged[key] = first
            else:
                med = median(values)
                merged[key] = round(med, 4) if isinstance(med, float) else med
                if key in SPREAD_KEYS:
                    merged[f"{key}_runs"] = values
                    merged[f"{key}_min"] = min(values)
                    merged[f"{key}_max"] = max(values)
        for key in [k for k in runs[0] if k.endswith(STEPS) and k[:-len(STEPS)] in runs[0]]:
            merged[key[:-len(STEPS)]], merged[key] = _over_steps([m[key] for m in runs])
        out[name] = merged
    return out


def _over_steps(per_repeat: Sequence[Sequence]) -> tuple:
    """(median over every step of every repeat, per-step medians over the repeats); None
    values (undefined for that step) are left out, and a step without any stays None."""
    def med(values):
        known = [v for v in values if v is not None]
        m = median(known) if known else None
        return round(m, 4) if isinstance(m, float) else m

    return (med([v for steps in per_repeat for v in steps]),
            [med(values) for values in zip(*per_repeat)])


__all__ = ["REFERENCE", "SPREAD_KEYS", "aggregate", "run_order", "with_vs_suffix"]
