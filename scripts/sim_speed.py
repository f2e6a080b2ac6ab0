"""How fast the event-driven simulator replays a production-scale step.

100,000 requests (12,500 prompts x 8, production-shaped lengths: `sched_lab.synth`)
over 1,024 workers, every placement policy, chunks of --chunk-tokens. Prints one line per
policy: first the wall time of all of them as `rhymectl bench sched --simulate` runs them,
in --jobs processes (0: one per CPU core); then each one's time and makespan, one after
another in this process, and whether those results are the same. With --compare N,
also times the chunk-by-chunk simulator on an N-request step and checks both give the same
makespan.

Timing is a benchmark, not a test: run it on an idle machine for absolute numbers.

    python scripts/sim_speed.py [--requests 100000] [--workers 1024] [--jobs 0] [--compare 6400]
"""

from __future__ import annotations

import argparse
import math
import time

from pipeline.bench.sched import BenchSetup, sim_inputs, simulate_policies, step_groups
from pipeline.sched.events import simulate_events
from pipeline.sched.registry import make_policy, policy_names
from pipeline.sched.settings import PlacementSettings
from pipeline.sched.simulator import simulate
from sched_lab.synth import Shape, production_trace


def step(requests: int, workers: int, chunk: int, spec: str, seed: int):
    shape = Shape(prompts=math.ceil(requests / 8), n=8)
    trace = production_trace(shape, seed)
    setup = BenchSetup(policies=tuple(policy_names()), workers=workers, spec=spec,
                       requests_per_worker=math.ceil(requests / workers),
                       settings=PlacementSettings(chunk_tokens=chunk), seed=seed)
    groups, predictor = step_groups(trace, setup)
    return groups, *sim_inputs(setup, predictor)


def timed(sim, name, groups, config, params):
    """(wall seconds, CPU seconds of this process, result): on a shared machine the CPU
    time is what the simulator itself cost."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = sim(make_policy(name, params), groups, config)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--spec", default="none")
    ap.add_argument("--compare", type=int, default=0, help="also time the old simulator on N requests")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=0, help="processes for the all-policies run "
                    "(0: one per CPU core)")
    args = ap.parse_args()

    groups, config, params = step(args.requests, args.workers, args.chunk_tokens, args.spec, args.seed)
    n = sum(g.n for g in groups)
    tokens = sum(sum(g.lengths) for g in groups)
    print(f"event simulator: {n} requests, {tokens / 1e9:.2f} G tokens, {args.workers} workers, "
          f"chunk {args.chunk_tokens}, spec {args.spec}")
    wall = time.perf_counter()
    together = simulate_policies(policy_names(), groups, config, params, args.jobs)
    wall = time.perf_counter() - wall
    print(f"  all policies as `bench sched --simulate` runs them (--jobs {args.jobs}): "
          f"wall {wall:.2f} s")
    total_wall = total_cpu = 0.0
    same = True
    for name in policy_names():
        wall, cpu, r = timed(simulate_events, name, groups, config, params)
        total_wall, total_cpu = total_wall + wall, total_cpu + cpu
        same = same and together[name].makespan_s == r.makespan_s \
            and together[name].finish_s == r.finish_s
        print(f"  {name:10s} wall {wall:6.2f} s  cpu {cpu:6.2f} s   makespan {r.makespan_s:9.1f} s  "
              f"x ideal {r.makespan_over_ideal:.3f}  migrations {r.migrations}")
    print(f"  all policies, one after another in one process: wall {total_wall:.2f} s, "
          f"cpu {total_cpu:.2f} s; same results as the --jobs run: {same}")
    if args.compare:
        w = max(1, round(args.workers * args.compare / n))
        groups, config, params = step(args.compare, w, args.chunk_tokens, args.spec, args.seed)
        print(f"old vs event simulator on {sum(g.n for g in groups)} requests, {w} workers:")
        for name in policy_names():
            _, old_s, old = timed(simulate, name, groups, config, params)
            _, new_s, new = timed(simulate_events, name, groups, config, params)
            same = math.isclose(old.makespan_s, new.makespan_s, rel_tol=1e-9)
            print(f"  {name:10s} cpu: old {old_s:6.2f} s  event {new_s:6.2f} s  "
                  f"speed-up {old_s / max(new_s, 1e-9):6.1f}x  same makespan: {same}")


if __name__ == "__main__":
    main()
