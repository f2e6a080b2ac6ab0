"""`rhymectl bench sched --simulate`: the placement policies side by side on one step.

The step is drawn from a trace's replay epoch so that every worker holds
`requests_per_worker` requests; each group carries the prediction the length predictor
makes from the epochs before it (the fallback for prompts it has not seen). Every policy
then runs the same step in the simulator, and the Gantt chart shows each worker's batch
size over time, policy by policy.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Sequence

from pipeline.config.schema import RolloutConfig, SchedConfig
from pipeline.errors import UsageError
from pipeline.history.lengths import LengthEvidence
from pipeline.sched.load import SPEC_COST_MODELS
from pipeline.sched.predictor import LengthPredictor
from pipeline.sched.events import simulate_events
from pipeline.sched.registry import make_policy
from pipeline.sched.settings import PlacementParams, PlacementSettings
from pipeline.sched.simulator import SimConfig, SimResult, no_cyclic_gc
from pipeline.sched.trace import Trace, draw_groups
from pipeline.sched.types import GroupWork

METRICS = ("makespan_s", "ideal_s", "makespan_over_ideal", "over_oracle", "bubble_ratio", "tail_s")


@dataclass(frozen=True)
class BenchSetup:
    """One bench step: `workers` rollout workers, each drawn `requests_per_worker`
    requests and running `capacity` at a time; `settings`: the placement knobs, as training
    takes them from the `sched` config section."""

    policies: tuple[str, ...]
    workers: int
    spec: str = "none"
    capacity: int = RolloutConfig().max_num_seqs
    requests_per_worker: int = SchedConfig().sim_requests_per_worker
    settings: PlacementSettings = PlacementSettings()
    prompt_tokens: int = 16
    epoch: int | None = None
    seed: int = 0
    jobs: int = 1  # processes the policies run in (0: one per CPU core, at most one per policy)


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
    predictor = LengthPredictor(LengthEvidence(trace.history(epoch)))
    drawn = draw_groups(pool, setup.workers * setup.requests_per_worker, setup.seed)
    groups = [GroupWork(g.group_id, len(g.lengths), predictor.predict(g.group_id),
                        predictor.known(g.group_id), g.lengths) for g in drawn]
    return groups, predictor


def sim_inputs(setup: BenchSetup, predictor: LengthPredictor,
               spec: str | None = None) -> tuple[SimConfig, PlacementParams]:
    """The simulator's configuration and the policies' parameters for a step of `setup`,
    under the cost model of `spec` (default: `setup.spec`)."""
    cost = SPEC_COST_MODELS[spec or setup.spec]
    config = SimConfig(workers=setup.workers, capacity=setup.capacity,
                       prompt_tokens=setup.prompt_tokens, cost=cost)
    params = setup.settings.step_params(predictor, setup.requests_per_worker,
                                        capacity=setup.capacity, cost=cost)
    return config, params


def run_bench(trace: Trace, setup: BenchSetup,
              on_done: Callable[[str], None] | None = None) -> dict[str, SimResult]:
    """Every policy of `setup` on the same simulated step, in the order given;
    `on_done(policy)` as each one finishes."""
    if setup.spec not in SPEC_COST_MODELS:
        raise ValueError(f"spec {setup.spec!r} is not simulated; choose from "
                         f"{', '.join(SPEC_COST_MODELS)}")
    groups, predictor = step_groups(trace, setup)
    config, params = sim_inputs(setup, predictor)
    results = simulate_policies(setup.policies, groups, config, params, setup.jobs, on_done)
    return with_oracle(results, groups, config, params)


# Relative simulation cost of each policy (measured with scripts/sim_speed.py): with
# several processes the slowest start first, so none is left running alone at the end.
_COST_RANK = {"seer": 0, "tier2": 1, "oracle": 2, "histopipe": 3, "static": 4}


def simulate_policies(names: Sequence[str], groups: Sequence[GroupWork], config: SimConfig,
                      params, jobs: int = 1,
                      on_done: Callable[[str], None] | None = None) -> dict[str, SimResult]:
    """Every policy in `names` on the same step, with the event-driven simulator (the
    chunk-by-chunk one's schedule, much faster); in `names` order. `on_done(name)` is
    called in this process as each policy finishes (for a progress display).

    The policies are independent, so with `jobs` > 1 (0: one per CPU core) they run in
    that many processes at once; the results are the same as in one process.
    """
    done = on_done or (lambda name: None)
    jobs = min(len(names), (os.cpu_count() or 1) if jobs == 0 else jobs)
    if jobs <= 1:
        results = {}
        for name in names:
            results[name] = _simulate(name, groups, config, params)
            done(name)
        return results
    # fork is fast, but only safe while this process runs no other thread (a thread
    # holding a lock at the fork would hold it forever in the child)
    fork = "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1
    context = multiprocessing.get_context("fork" if fork else "spawn")
    order = sorted(names, key=lambda n: _COST_RANK.get(n, -1))
    # (results arrive as millions of small tuples: no cyclic GC while they are unpickled)
    with no_cyclic_gc(), ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(_simulate, name, groups, config, params): name for name in order}
        results = {}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            done(futures[future])
        return {name: results[name] for name in names}


def _simulate(name: str, groups, config: SimConfig, params) -> SimResult:
    return simulate_events(make_policy(name, params), groups, config)


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


__all__ = ["BenchSetup", "METRICS", "bench_json", "run_bench", "sim_inputs", "simulate_policies",
           "step_groups", "with_oracle"]
