"""`rhymectl bench spec --seeds`: the arithmetic over training runs of different seeds.

`--repeats` runs every method again on the same recorded run, and a seeded method draws the
same responses every time: its passes repeat exactly and only the seconds vary. At
temperature > 0 how many passes a method needs also depends on the draw (how long the
step's longest responses happen to be), and one draw cannot tell a method's gain from its
luck. `--seeds` trains one run per `run.seed` and measures every method on each: a method's
passes over `suffix`'s are taken within a seed (the same run, the same requests), then
summarised over the seeds as median, min and max, as `--repeats` summarises seconds.
Pure arithmetic.
"""

from __future__ import annotations

from statistics import median
from typing import Mapping

REFERENCE = "suffix"
# (key in a seed's summary, its ratio's name): counts whose ratio to suffix's is taken
COUNTS = (("passes", "passes_over_suffix"), ("critical_passes", "critical_over_suffix"))


def _spread(out: dict, key: str, values: list) -> None:
    known = [v for v in values if v is not None]
    out[f"{key}_runs"] = values
    if known:
        m = median(known)
        out[key] = round(m, 4) if isinstance(m, float) else m
        out[f"{key}_min"], out[f"{key}_max"] = min(known), max(known)
    else:
        out[key] = out[f"{key}_min"] = out[f"{key}_max"] = None


def across_seeds(per_seed: Mapping[int, Mapping[str, Mapping]],
                 gaps: Mapping[int, Mapping | None] | None = None) -> dict[str, dict]:
    """Per method measured under every seed: its passes and median step's critical path
    per seed (`KEY_runs`, in seed order), their ratios to `suffix`'s in the same seed
    (`passes_over_suffix`, `critical_over_suffix`; None without a suffix run), and of each
    the median, min and max over the seeds (`KEY`, `KEY_min`, `KEY_max`). gaps: seed ->
    that seed's `ceiling.gap_closed` (`pipeline.draft_ceiling.gaps_closed`), summarised
    the same way as `gap_passes` and `gap_critical`.

    per_seed: seed -> the `methods` summary of that seed's bench (`summarize` /
    `aggregate` output: per method at least `passes` and `critical_passes`)."""
    seeds = list(per_seed)
    if not seeds:
        raise ValueError("no seeds to summarise")
    names = [n for n in per_seed[seeds[0]] if all(n in per_seed[s] for s in seeds)]
    out: dict[str, dict] = {}
    for name in names:
        merged: dict = {"seeds": seeds}
        for key, ratio in COUNTS:
            values, ratios = [], []
            for s in seeds:
                value = per_seed[s][name].get(key)
                ref = per_seed[s].get(REFERENCE, {}).get(key)
                values.append(value)
                ratios.append(round(value / ref, 4) if value is not None and ref else None)
            _spread(merged, key, values)
            _spread(merged, ratio, ratios)
        if gaps and any(gaps.get(s) for s in seeds):
            for key, field in (("gap_passes", "passes"), ("gap_critical", "critical_passes")):
                values = [((gaps.get(s) or {}).get("methods", {}).get(name) or {}).get(field)
                          for s in seeds]
                if any(v is not None for v in values):
                    _spread(merged, key, values)
        out[name] = merged
    return out


__all__ = ["COUNTS", "REFERENCE", "across_seeds"]
