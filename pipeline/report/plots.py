"""`<run_dir>/metrics.jsonl` -> PNG plots: reward, response length, time per phase.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot), so plotting never
touches a global backend or needs a display. Each PNG is written atomically: a report
regenerated while someone has the old one open never shows a half-written image.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.atomic import write_atomic
from pipeline.errors import UsageError
from pipeline.loop.metrics import METRICS_FILE, MetricsLog

_WHOLE_STEP = "time_step_s"


def load_metrics(run_dir: str | Path) -> list[dict]:
    """The run's step records; UsageError when there is no run or no step yet."""
    run_dir = Path(run_dir)
    log = MetricsLog(run_dir)
    if not log.path.is_file():
        raise UsageError(f"{run_dir} has no {METRICS_FILE}; is it a run directory written by "
                         "`rhymectl train`?")
    records = log.read()
    if not records:
        raise UsageError(f"{log.path} has no complete step yet; rerun the report after the "
                         "first step finishes")
    return records


def phase_keys(records: list[dict]) -> list[str]:
    """time_<phase>_s keys except the whole-step total, in the order the run logged them."""
    keys: dict[str, None] = {}
    for record in records:
        for key in record:
            if key.startswith("time_") and key.endswith("_s") and key != _WHOLE_STEP:
                keys.setdefault(key)
    return list(keys)


def write_report(run_dir: str | Path, out_dir: str | Path | None = None,
                 records: list[dict] | None = None) -> list[Path]:
    """Write reward.png, length.png and phases.png; return their paths in that order.

    out_dir defaults to `<run_dir>/report/`. records, when given, are plotted instead of
    re-reading the log (the CLI reads once for both the plots and its summary).
    """
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    records = load_metrics(run_dir) if records is None else records
    out_dir = run_dir / "report" if out_dir is None else Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir} is a file, not a folder; give --out a folder for the plots")
    steps = [r.get("step", i) for i, r in enumerate(records)]
    name = run_dir.resolve().name

    def series(key: str) -> list[float]:
        return [_number(r.get(key)) for r in records]

    def line_plot(title: str, ylabel: str, lines: list[tuple[str, str]]) -> Figure:
        fig = Figure(figsize=(8, 4.5), layout="constrained")
        ax = fig.add_subplot()
        for key, label in lines:
            ax.plot(steps, series(key), marker="." if len(steps) < 60 else None, label=label)
        ax.set(title=f"{title} — {name}", xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        return fig

    reward_fig = line_plot("Reward and accuracy", "mean over the step's responses",
                           [("reward_mean", "reward mean"), ("accuracy", "accuracy")])
    _add_evals(reward_fig.axes[0], run_dir)
    figures = {
        "reward.png": reward_fig,
        "length.png": line_plot("Response length", "tokens",
                                [("resp_len_mean", "mean"), ("resp_len_p90", "p90"),
                                 ("resp_len_max", "max")]),
        "phases.png": _phases_figure(records, steps, name),
    }
    paths = []
    for filename, fig in figures.items():
        paths.append(write_atomic(out_dir / filename,
                                  lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=110)))
    return paths


def _add_evals(ax, run_dir: Path) -> None:
    """Held-out greedy accuracy (eval.jsonl, written by training) as a second series."""

    evals = MetricsLog(run_dir, "eval.jsonl").read()
    if evals:
        ax.plot([e["step"] for e in evals], [_number(e.get("accuracy")) for e in evals],
                marker="s", color="black", label="held-out greedy accuracy")
        ax.legend()


def _phases_figure(records: list[dict], steps: list, name: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    keys = phase_keys(records)
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    width = 0.8 * min(gaps, default=1)
    bottom = [0.0] * len(records)
    for key in keys:
        # A phase missing from a step took no time in it; NaN would break the stacking.
        values = [_number(r.get(key), missing=0.0) for r in records]
        ax.bar(steps, values, width=width, bottom=bottom, label=key[len("time_"):-len("_s")])
        bottom = [b + v for b, v in zip(bottom, values)]
    if any(_WHOLE_STEP in r for r in records):
        ax.plot(steps, [_number(r.get(_WHOLE_STEP)) for r in records], "k_", markersize=12,
                label="whole step")
    if not keys:
        ax.text(0.5, 0.5, "no time_<phase>_s keys in metrics.jsonl", ha="center",
                transform=ax.transAxes)
    ax.set(title=f"Seconds per phase — {name}", xlabel="step", ylabel="seconds")
    ax.grid(axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # outside the axes: bars fill them to the top
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def _number(value, missing: float = float("nan")) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return missing
