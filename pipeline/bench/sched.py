"""`rhymectl bench sched --simulate`: the placement policies side by side on one step.

The step is drawn from a trace's replay epoch so that every worker holds
`requests_per_worker` requests; each group carries the prediction the length predictor
makes from the epochs before it (the fallback for prompts it has not seen). Every policy
then runs the same step in the simulator, and the Gantt chart shows each worker's batch
size over time, policy by policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import UsageError
from pipeline.sched.load import SPEC_COST_MODELS
from pipeline.sched.placement import make_policy, step_params
from pipeline.sched.predictor import LengthPredictor
from pipeline.sched.events import simulate_events
from pipeline.sched.simulator import SimConfig, SimResult
from pipeline.sched.trace import Trace, draw_groups
from pipeline.sched.types import GroupWork

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
    tier2_workers_frac: float = 0.125  # as sched.tier2_workers_frac
    tier2_max_seqs: int = 8  # as sched.tier2_max_seqs
    migrate_gap: int | None = None  # as sched.migrate_gap (None: auto)

    @property
    def knobs(self) -> dict:
        """The placement settings training takes from the `sched` config section."""
        return {"tier2_workers_frac": self.tier2_workers_frac,
                "tier2_max_seqs": self.tier2_max_seqs, "migrate_gap": self.migrate_gap}


def step_groups(trace: Trace, setup: BenchSetup) -> tuple[list[GroupWork], LengthPredictor]:
    """The step's groups and the predictor of the epochs before it."""
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
    return groups, predictor


def run_bench(trace: Trace, setup: BenchSetup) -> dict[str, SimResult]:
    """Every policy of `setup` on the same simulated step, in the order given."""
    if setup.spec not in SPEC_COST_MODELS:
        raise ValueError(f"spec {setup.spec!r} is not simulated; choose from "
                         f"{', '.join(SPEC_COST_MODELS)}")
    cost = SPEC_COST_MODELS[setup.spec]
    groups, predictor = step_groups(trace, setup)
    config = SimConfig(workers=setup.workers, capacity=setup.capacity,
                       prompt_tokens=setup.prompt_tokens, cost=cost)
    params = step_params(predictor, setup.requests_per_worker, chunk_tokens=setup.chunk_tokens,
                         capacity=setup.capacity, cost=cost, **setup.knobs)
    # the event-driven simulator: the chunk-by-chunk one's schedule, much faster
    results = {name: simulate_events(make_policy(name, params), groups, config)
               for name in setup.policies}
    return with_oracle(results, groups, config, params)


def with_oracle(results: dict[str, SimResult], groups, config: SimConfig, params,
                sim=simulate_events) -> dict[str, SimResult]:
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


__all__ = ["BenchSetup", "METRICS", "bench_json", "run_bench", "step_groups", "with_oracle"]
