"""The benches' figures: `bench spec`'s bars per method and `bench sched`'s Gantt chart
(matplotlib is imported only when drawing)."""

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


__all__ = ["occupancy", "write_gantt", "write_plot"]
