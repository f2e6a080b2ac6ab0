"""The benches' figures: `bench spec`'s bars per method and its running requests by pass,
`bench sched`'s Gantt chart and `bench e2e`'s overlaid arms (matplotlib is imported only
when drawing)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.atomic import write_atomic
from pipeline.sched.simulator import SimResult


def write_plot(summary: dict[str, dict], path: str | Path, title: str) -> Path:
    """tau and speedup per method (bars), rollout seconds against floor seconds."""
    from matplotlib.figure import Figure

    names = list(summary)
    fig = Figure(figsize=(12, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    x = range(len(names))
    for ax, key, label in ((axes[0], "tau", "tokens per pass (tau)"),
                           (axes[1], "speedup", "speedup over none")):
        values = [summary[n][key] for n in names]
        bars = ax.bar(x, values, color="#4c72b0")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set(title=label, xticks=list(x))
        ax.set_xticklabels(names, rotation=30, ha="right")
    width = 0.4
    axes[2].bar([i - width / 2 for i in x], [summary[n]["rollout_s"] for n in names], width,
                label="rollout s", color="#4c72b0")
    axes[2].bar([i + width / 2 for i in x], [summary[n]["floor_s"] for n in names], width,
                label="floor s", color="#dd8452")
    axes[2].set(title="rollout seconds vs floor", xticks=list(x))
    axes[2].set_xticklabels(names, rotation=30, ha="right")
    axes[2].legend(fontsize=8)
    fig.suptitle(title)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


def write_seeds_plot(summary: dict[str, dict], path: str | Path, title: str) -> Path:
    """`bench spec --seeds`: per method (but `none`), its total passes and its median
    step over `suffix`'s, one dot per seed and a bar at the median
    (`pipeline.bench.spec_seeds.across_seeds`)."""
    from matplotlib.figure import Figure

    names = [n for n in summary if n != "none"]
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    x = np.arange(len(names))
    for ax, key, label in ((axes[0], "passes_over_suffix", "target passes over suffix's"),
                           (axes[1], "critical_over_suffix", "median step over suffix's")):
        medians = [summary[n][key] or 0.0 for n in names]
        bars = ax.bar(x, medians, color="#4c72b0", alpha=0.6, label="median over seeds")
        ax.bar_label(bars, fmt="%.2f", fontsize=9, label_type="center")
        for i, n in enumerate(names):
            runs = [v for v in summary[n][f"{key}_runs"] if v is not None]
            ax.plot([i] * len(runs), runs, "o", color="black", ms=4,
                    label="one seed" if i == 0 else None)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set(title=label, xticks=list(x))
        ax.set_xticklabels(names, rotation=20, ha="right")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


RUNNING_COLORS = {"none": "#4c72b0", "suffix": "#dd8452", "history+group": "#55a868"}


def write_running_plot(steps: dict[str, dict], path: str | Path, title: str,
                       ridge_tokens: float | None = None, ridge_label: str = "") -> Path:
    """One step as each method ran it (`bench spec`'s step records: per pass its running
    requests and scheduled tokens): running requests by pass index, with the tail
    threshold (a quarter of the step's requests) and each method's first tail pass; below,
    scheduled tokens by pass, with the GPU model's ridge (memory-bound below it)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 7), layout="constrained")
    ax_run, ax_tok = fig.subplots(2, 1, sharex=True)
    for name, s in steps.items():
        color = RUNNING_COLORS.get(name)
        x = np.arange(len(s["running"]))
        label = (f"{name}: {s['passes']} passes, {s['tail_passes']} in the tail")
        ax_run.step(x, s["running"], where="post", color=color, label=label)
        ax_tok.step(x, s["tokens"], where="post", color=color, label=name)
        if s["tail_passes"]:
            ax_run.axvline(s["passes"] - s["tail_passes"], color=color, lw=0.8, ls=":")
    requests = max((s["requests"] for s in steps.values()), default=0)
    ax_run.axhline(0.25 * requests, color="black", lw=0.8, ls="--",
                   label="tail: fewer than 25 % of the requests running")
    ax_run.set(ylabel="running requests", title="requests scheduled in each pass")
    ax_run.legend(fontsize=8)
    if ridge_tokens:
        ax_tok.axhline(ridge_tokens, color="black", lw=0.8, ls="--", label=ridge_label)
    ax_tok.set(xlabel="pass index within the step", ylabel="scheduled tokens",
               title="tokens scheduled in each pass (prefill, decode, draft tokens verified)")
    ax_tok.set_yscale("log")
    ax_tok.legend(fontsize=8)
    for ax in (ax_run, ax_tok):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


def occupancy(timeline: Sequence[tuple[float, float, int]], edges: np.ndarray) -> np.ndarray:
    """Mean running requests of one worker in each time bin [edges[i], edges[i+1])."""
    if not timeline:
        return np.zeros(len(edges) - 1)
    seg = np.asarray(timeline, dtype=float)
    knots = np.column_stack([seg[:, 0], seg[:, 1]]).ravel()
    area = np.cumsum(seg[:, 2] * (seg[:, 1] - seg[:, 0]))
    values = np.column_stack([np.concatenate([[0.0], area[:-1]]), area]).ravel()
    integral = np.interp(edges, knots, values, left=0.0, right=float(area[-1]))
    return np.diff(integral) / np.diff(edges)


def write_gantt(results: dict[str, SimResult], path: str | Path, title: str, bins: int = 600) -> Path:
    """One panel per policy: workers (rows) by time, coloured by running requests
    (white: idle); the red line is the makespan, the dashed one the ideal."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    horizon = max(r.makespan_s for r in results.values()) or 1.0
    edges = np.linspace(0.0, horizon, bins + 1)
    cmap = colormaps["viridis"].with_extremes(under="white")
    fig = Figure(figsize=(10, 1.2 + 2.2 * len(results)), layout="constrained")
    axes = fig.subplots(len(results), 1, sharex=True, squeeze=False)[:, 0]
    vmax = max(max((b for line in r.timelines for _, _, b in line), default=1)
               for r in results.values())
    for ax, (name, r) in zip(axes, results.items()):
        grid = np.vstack([occupancy(line, edges) for line in r.timelines])
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", origin="lower", cmap=cmap,
                          vmin=1e-9, vmax=vmax, extent=(0.0, horizon, -0.5, r.workers - 0.5))
        ax.axvline(r.makespan_s, color="red", lw=1.2)
        ax.axvline(r.ideal_s, color="black", lw=1.0, ls="--")
        ax.set(ylabel="worker", title=f"{name}: makespan {r.makespan_s:.2f} s = "
               f"{r.makespan_over_ideal:.2f}× ideal, bubbles {r.bubble_ratio:.0%}, "
               f"last 10% {r.tail_s:.2f} s")
    axes[-1].set_xlabel("seconds into the step")
    fig.colorbar(image, ax=list(axes), label="running requests", shrink=0.8)
    fig.suptitle(title)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


E2E_COLORS = {"baseline": "#4c72b0", "accelerated": "#dd8452"}


def write_e2e_plot(report: dict, path: str | Path, title: str) -> Path:
    """bench e2e, both arms overlaid: seconds per step (median over seeds), training reward
    (mean over seeds), held-out mean@k reward (mean over seeds, ±1 SE), seconds per step by
    phase."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8), layout="constrained")
    (ax_time, ax_reward), (ax_heldout, ax_phases) = fig.subplots(2, 2)
    for arm, data in report["arms"].items():
        c, h, color = data["curves"], data["heldout"], E2E_COLORS.get(arm)
        ax_time.plot(c["step"], c["time_step_s"], color=color, label=f"{arm} step")
        ax_time.plot(c["step"], c["time_rollout_s"], color=color, ls="--", label=f"{arm} rollout")
        ax_reward.plot(c["step"], c["reward_mean"], color=color, label=arm)
        points = [(s, y, e) for s, y, e in zip(h["step"], h["mean_at_k_reward"],
                                               h["mean_at_k_reward_se"]) if y is not None]
        if points:
            xs, ys, es = zip(*points)
            ax_heldout.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=color, label=arm)
    ax_time.set(title="seconds per step (median over seeds)", xlabel="step", ylabel="s")
    ax_reward.set(title="training reward (mean over seeds)", xlabel="step", ylabel="reward")
    ax_heldout.set(title="held-out mean@k reward (mean over seeds, ±1 SE)", xlabel="step",
                   ylabel="reward")
    _e2e_phases(ax_phases, report["arms"])
    for ax in (ax_time, ax_reward, ax_heldout):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    d = report["heldout_diff"]
    e2e, ro = report["speedup_e2e"], report["speedup_rollout"]
    diff = (f"held-out diff {d['mean']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}], "
            f"p={d['p']:.3f}" if d.get("mean") is not None else "no held-out mean@k")
    fig.suptitle(f"{title}\nspeedup e2e {e2e['median']:.3f}× (min {e2e['min']:.3f}, max "
                 f"{e2e['max']:.3f}); rollout {ro['median']:.3f}×; Amdahl bound "
                 f"{ro['amdahl_bound']:.3f}×; {diff}", fontsize=10)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


def _e2e_phases(ax, arms: dict) -> None:
    names = list(arms)
    phases = list(dict.fromkeys(p for a in arms.values() for p in a["phases_s_per_step"]))
    bottom = [0.0] * len(names)
    from matplotlib import colormaps

    colors = colormaps["tab20"].colors  # distinct for up to 20 phases (warm-up's included)
    for i, phase in enumerate(phases):
        values = [arms[n]["phases_s_per_step"].get(phase, 0.0) for n in names]
        ax.bar(names, values, bottom=bottom, label=phase, color=colors[i % len(colors)])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(title="seconds per step by phase (mean over seeds)", ylabel="s")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))


__all__ = ["RUNNING_COLORS", "occupancy", "write_e2e_plot", "write_gantt", "write_plot",
           "write_running_plot"]
