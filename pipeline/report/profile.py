"""`rhymectl profile RUN_DIR`: response lengths from history, their rank stability across
epochs, and how well the length predictor does on the epoch after its history.

Rank stability compares each pair of adjacent recorded epochs over the prompts seen in
both: the Spearman correlation of per-prompt mean lengths, and the share of prompts whose
rank moves by more than 10 % of the number of prompts compared (RhymeRL's observation).

The sibling probe asks Seer's question of every group (one prompt's responses in one
epoch): how well does its first finished response tell its longest? In a synchronous
rollout a group's responses start in the same pass and emit one token a pass without
drafts, so the first to finish is the shortest; the probe reports the Spearman
correlation of the shortest with the longest over groups, and the median of their ratio.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pipeline.atomic import write_atomic
from pipeline.history.lengths import LengthEvidence, LengthHistory
from pipeline.sched.predictor import LengthPredictor
from pipeline.sched.trace import open_history

RANK_MOVE = 0.10


def load_lengths(run_dir: str | Path) -> LengthHistory:
    return open_history(run_dir, "is it a run directory with at least one step of "
                                 "`rhymectl train`?").lengths()


def _num(x: float | None, digits: int = 4) -> float | None:
    """JSON-safe: NaN and None become null."""
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def ranks(x) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (scipy.stats.rankdata's default;
    numpy keeps `rhymectl profile` from paying seconds for importing scipy.stats)."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    average = (starts + ends + 1) / 2.0  # mean of the 1-based positions start+1 .. end
    out = np.empty(len(x))
    out[order] = np.repeat(average, ends - starts)
    return out


def _spearman(a, b) -> float | None:
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None  # undefined for constant input; meaningless for two points
    return _num(np.corrcoef(ranks(a), ranks(b))[0, 1])


def rank_stability(lengths: LengthHistory) -> list[dict]:
    """One entry per pair of adjacent recorded epochs (e, next)."""
    epochs = sorted({e for per in lengths.values() for e in per})
    out = []
    for a, b in zip(epochs, epochs[1:]):
        both = sorted(p for p, per in lengths.items() if per.get(a) and per.get(b))
        ma = np.array([np.mean(lengths[p][a]) for p in both])
        mb = np.array([np.mean(lengths[p][b]) for p in both])
        moved = None
        if both:
            shift = np.abs(ranks(ma) - ranks(mb)) / len(both)
            moved = _num(float(np.mean(shift > RANK_MOVE)))
        out.append({"epochs": [a, b], "prompts": len(both), "spearman": _spearman(ma, mb),
                    "moved_over_10pct": moved})
    return out


def sibling_probe(lengths: LengthHistory) -> dict:
    """Over every group of at least two responses: Spearman(shortest, longest), the median
    of shortest / longest, and the number of groups."""
    groups = [ls for per in lengths.values() for ls in per.values() if len(ls) >= 2]
    first = np.array([min(ls) for ls in groups], dtype=float)
    last = np.array([max(ls) for ls in groups], dtype=float)
    ratio = first[last > 0] / last[last > 0]
    return {"groups": len(groups), "spearman_first_longest": _spearman(first, last),
            "median_first_over_longest": _num(float(np.median(ratio))) if len(ratio) else None}


def predictor_errors(lengths: LengthHistory, **predictor_kwargs) -> list[dict]:
    """For each epoch with history before it: the predictor fit on the earlier epochs
    against the per-prompt mean lengths of that epoch (tokens; mape as a fraction)."""
    epochs = sorted({e for per in lengths.values() for e in per})
    out = []
    for e in epochs[1:]:
        predictor = LengthPredictor(LengthEvidence(lengths), before_epoch=e, **predictor_kwargs)
        prompts = sorted(p for p, per in lengths.items() if per.get(e))
        actual = np.array([np.mean(lengths[p][e]) for p in prompts])
        predicted = np.array([predictor.predict(p) for p in prompts])
        known = np.array([predictor.known(p) for p in prompts], dtype=bool)
        err = np.abs(predicted - actual)
        positive = known & (actual > 0)
        out.append({
            "epoch": e, "prompts": len(prompts), "known": int(known.sum()),
            "mae": _num(err.mean()),
            "mae_known": _num(err[known].mean()) if known.any() else None,
            "mape_known": _num((err[positive] / actual[positive]).mean()) if positive.any() else None,
            "spearman_known": _spearman(predicted[known], actual[known]),
            "mae_fallback_only": _num(np.abs(predictor.fallback - actual).mean()),
        })
    return out


def profile(run_dir: str | Path, lengths: LengthHistory | None = None, *, last_epochs: int = 3,
            decay: float = 0.5, bins: int = 16) -> dict:
    """Everything `rhymectl profile` reports, as one JSON-ready dict (lengths: the run's
    `HistoryStore.lengths()`, read here when not given)."""
    lengths = load_lengths(run_dir) if lengths is None else lengths
    every = np.array([x for per in lengths.values() for ls in per.values() for x in ls], dtype=float)
    epochs = sorted({e for per in lengths.values() for e in per})
    predictor = LengthPredictor(LengthEvidence(lengths), last_epochs=last_epochs, decay=decay)
    p50 = float(np.quantile(every, 0.5))
    lo, hi = int(every.min()), int(every.max())
    width = max(1, math.ceil((hi - lo + 1) / bins))  # whole-token bins [edge, next edge)
    edges = lo + width * np.arange(math.ceil((hi - lo + 1) / width) + 1)
    counts, _ = np.histogram(every, bins=edges)
    per_prompt = {}
    for pid in sorted(lengths, key=lambda p: (-predictor.predict(p), p)):
        xs = np.array([x for ls in lengths[pid].values() for x in ls], dtype=float)
        per_prompt[pid] = {"responses": len(xs), "epochs": len(lengths[pid]),
                           "mean": _num(xs.mean(), 2), "p50": _num(np.quantile(xs, 0.5), 2),
                           "max": int(xs.max()), "std": _num(xs.std(), 2),
                           "predicted": _num(predictor.predict(pid), 2)}
    return {
        "run_dir": str(run_dir), "responses": len(every), "prompts": len(lengths),
        "epochs": epochs,
        "length": {"mean": _num(every.mean(), 2), "p50": _num(p50, 2),
                   "p90": _num(np.quantile(every, 0.9), 2), "p99": _num(np.quantile(every, 0.99), 2),
                   "max": int(every.max()),
                   "p99_over_p50": _num(np.quantile(every, 0.99) / p50) if p50 > 0 else None},
        "histogram": {"edges": [_num(x, 2) for x in edges], "counts": counts.tolist()},
        "rank_stability": rank_stability(lengths),
        "sibling_probe": sibling_probe(lengths),
        "predictor": {"last_epochs": last_epochs, "decay": decay,
                      "fallback": _num(predictor.fallback, 2),
                      "next_epoch_errors": predictor_errors(lengths, last_epochs=last_epochs,
                                                            decay=decay)},
        "per_prompt": per_prompt,
    }


def write_profile_plot(report: dict, lengths: LengthHistory, path: str | Path) -> Path:
    """Four panels: the length histogram, per-prompt ranges sorted by mean, adjacent-epoch
    means (last pair), and predicted against actual (last evaluated epoch)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 8), layout="constrained")
    (hist, spread), (pairs, fit) = fig.subplots(2, 2)
    edges, counts = report["histogram"]["edges"], report["histogram"]["counts"]
    hist.stairs(counts, edges, fill=True, alpha=0.7)
    hist.set(title=f"Response length ({report['responses']} responses)", xlabel="tokens",
             ylabel="responses")

    prompts = sorted(report["per_prompt"].items(), key=lambda kv: kv[1]["mean"])
    xs = np.arange(len(prompts))
    lows = [min(x for ls in lengths[p].values() for x in ls) for p, _ in prompts]
    highs = [v["max"] for _, v in prompts]
    spread.vlines(xs, lows, highs, color="0.7", lw=1)
    spread.plot(xs, [v["mean"] for _, v in prompts], ".", ms=3, label="mean")
    spread.plot(xs, [v["predicted"] for _, v in prompts], "_", ms=4, label="predicted next")
    spread.set(title="Per prompt: min–max and mean", xlabel="prompt (by mean length)", ylabel="tokens")
    spread.legend()

    stable = [r for r in report["rank_stability"] if r["prompts"]]
    if stable:
        a, b = stable[-1]["epochs"]
        both = [p for p, per in lengths.items() if per.get(a) and per.get(b)]
        pairs.scatter([np.mean(lengths[p][a]) for p in both], [np.mean(lengths[p][b]) for p in both], s=8)
        pairs.set(title=f"Mean length, epoch {a} vs {b} (Spearman {stable[-1]['spearman']})",
                  xlabel=f"epoch {a}", ylabel=f"epoch {b}")
    else:
        pairs.text(0.5, 0.5, "one epoch recorded: no rank stability yet", ha="center",
                   transform=pairs.transAxes)
    errors = report["predictor"]["next_epoch_errors"]
    if errors:
        e = errors[-1]["epoch"]
        predictor = LengthPredictor(LengthEvidence(lengths), before_epoch=e,
                                    last_epochs=report["predictor"]["last_epochs"],
                                    decay=report["predictor"]["decay"])
        seen = [p for p, per in lengths.items() if per.get(e)]
        known = [predictor.known(p) for p in seen]
        fit.scatter([predictor.predict(p) for p in seen], [np.mean(lengths[p][e]) for p in seen], s=8,
                    c=["C0" if k else "C3" for k in known])
        top = max(max(np.mean(lengths[p][e]) for p in seen), predictor.fallback)
        fit.plot([0, top], [0, top], "k--", lw=0.8)
        fit.set(title=f"Epoch {e}: predicted vs actual (MAE {errors[-1]['mae']:.1f}; red: fallback)",
                xlabel="predicted tokens", ylabel="actual mean tokens")
    else:
        fit.text(0.5, 0.5, "one epoch recorded: nothing to predict yet", ha="center",
                 transform=fit.transAxes)
    fig.suptitle(f"Length profile — {Path(report['run_dir']).resolve().name}")
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


__all__ = ["load_lengths", "predictor_errors", "profile", "rank_stability", "ranks",
           "write_profile_plot"]
