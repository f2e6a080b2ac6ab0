"""`rhymectl bench sched --simulate`: the placement policies side by side on one step.

The step is drawn from a trace's replay epoch so that every worker holds
`requests_per_worker` requests; each group carries the prediction the length predictor
makes from the epochs before it (the fallback for prompts it has not seen). Every policy
then runs the same step in the simulator, and the Gantt chart shows each worker's batch
size over time, policy by policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.atomic import write_atomic
from pipeline.errors import UsageError
from pipeline.sched.cost import SPEC_COST_MODELS
from pipeline.sched.placement import make_policy, policy_names
from pipeline.sched.predictor import LengthPredictor
from pipeline.sched.simulator import SimConfig, SimResult, simulate
from pipeline.sched.trace import Trace, draw_groups
from pipeline.sched.work import GroupWork, PlacementParams

METRICS = ("makespan_s", "ideal_s", "makespan_over_ideal", "over_oracle", "bubble_ratio", "tail_s")


@dataclass(frozen=True)
class BenchSetup:
    policies: tuple[str, ...]
    workers: int
    spec: str = "none"
    capacity: int = 256
    requests_per_worker: int = 64
    chunk_tokens: int = 64
    prompt_tokens: int = 16
    epoch: int | None = None
    seed: int = 0


def parse_policies(text: str) -> tuple[str, ...]:
    """'static,seer' -> ('static', 'seer'); UsageError naming the valid ones otherwise."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in policy_names()]
    if unknown or not names:
        what = f"unknown placement policy {unknown[0]!r}" if unknown else "no placement policy given"
        raise UsageError(f"{what} in --policies; choose from {', '.join(policy_names())}")
    return tuple(dict.fromkeys(names))


def check_spec(spec: str) -> str:
    if spec not in SPEC_COST_MODELS:
        raise UsageError(f"--spec {spec!r} is not simulated; choose from {', '.join(SPEC_COST_MODELS)}")
    return spec


def step_groups(trace: Trace, setup: BenchSetup) -> tuple[list[GroupWork], float]:
    """The simulated step, and the length floor for the placement (`typical_max`)."""
    epochs = trace.epochs()
    epoch = trace.step_epoch() if setup.epoch is None else setup.epoch
    if epoch not in epochs:
        raise UsageError(f"--epoch {epoch}: {trace.source} has epochs {epochs}")
    pool = trace.step(epoch)
    available = sum(len(g.lengths) for g in pool)
    if setup.workers > available:
        raise UsageError(f"--workers {setup.workers} is larger than the {available} requests of "
                         f"{trace.source} (epoch {epoch}); give at most {available} workers")
    predictor = LengthPredictor(trace.history(epoch))
    drawn = draw_groups(pool, setup.workers * setup.requests_per_worker, setup.seed)
    groups = [GroupWork(g.group_id, len(g.lengths), predictor.predict(g.group_id),
                        predictor.known(g.group_id), g.lengths) for g in drawn]
    return groups, predictor.typical_max(setup.requests_per_worker)


def run_bench(trace: Trace, setup: BenchSetup) -> dict[str, SimResult]:
    """Every policy of `setup` on the same simulated step, in the order given."""
    cost = SPEC_COST_MODELS[check_spec(setup.spec)]
    groups, floor = step_groups(trace, setup)
    config = SimConfig(workers=setup.workers, capacity=setup.capacity,
                       prompt_tokens=setup.prompt_tokens, cost=cost)
    params = PlacementParams(chunk_tokens=setup.chunk_tokens, cost=cost, capacity=setup.capacity,
                             length_floor=floor)
    results = {name: simulate(make_policy(name, params), groups, config) for name in setup.policies}
    return with_oracle(results, groups, config, params)


def with_oracle(results: dict[str, SimResult], groups: Sequence[GroupWork], config: SimConfig,
                params: PlacementParams, sim=simulate) -> dict[str, SimResult]:
    """Set every result's oracle_s (running the oracle when it was not among them)."""
    oracle = results.get("oracle") or sim(make_policy("oracle", params), groups, config)
    for r in results.values():
        r.oracle_s = oracle.makespan_s
    return results


def bench_json(results: dict[str, SimResult], workers: int, source: str = "simulated") -> dict:
    """The `--json` object: {"source", "workers", "policies": {NAME: {METRICS}}}."""
    return {"source": source, "workers": workers,
            "policies": {name: {k: round(float(v), 6) for k, v in r.summary().items()}
                         for name, r in results.items()}}


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


__all__ = ["BenchSetup", "METRICS", "bench_json", "check_spec", "occupancy", "parse_policies",
           "run_bench", "step_groups", "write_gantt"]
