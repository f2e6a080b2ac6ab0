"""Tier 2 with perfect per-response lengths against tier 2 on history predictions.

On one production-shaped step (`pipeline.sched.synth`, as scripts/sched_targets.py draws
it), every tier-2 setting (reserved share x sequences per reserved worker) is simulated
twice: with each response's true length as its prediction (each response its own group),
and with the per-prompt history predictions training has. The gap between the two is what
per-response length knowledge would be worth.

    python scripts/tier2_truth.py [--workers 256] [--requests 4096] [--spec history+group]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from pipeline.bench.sched import BenchSetup, step_groups
from pipeline.sched.events import simulate_events
from pipeline.sched.load import SPEC_COST_MODELS
from pipeline.sched.placement import make_policy, step_params
from pipeline.sched.simulator import SimConfig
from pipeline.sched.synth import Shape, production_trace
from pipeline.sched.types import GroupWork


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--requests", type=int, default=4096)
    ap.add_argument("--spec", default="history+group")
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    trace = production_trace(Shape(prompts=max(800, 2 * args.requests // 8)), args.seed)
    rpw = math.ceil(args.requests / args.workers)
    setup = BenchSetup(policies=("tier2", "oracle"), workers=args.workers, spec=args.spec,
                       requests_per_worker=rpw, chunk_tokens=args.chunk_tokens, seed=args.seed)
    groups, predictor = step_groups(trace, setup)
    cost = SPEC_COST_MODELS[args.spec]
    config = SimConfig(workers=args.workers, capacity=setup.capacity,
                       prompt_tokens=setup.prompt_tokens, cost=cost)
    params = step_params(predictor, rpw, chunk_tokens=args.chunk_tokens, capacity=setup.capacity,
                         cost=cost)
    oracle = simulate_events(make_policy("oracle", params), groups, config)
    gap = oracle.makespan_s - oracle.ideal_s
    print(f"W={args.workers} requests={sum(g.n for g in groups)} spec={args.spec}: ideal "
          f"{oracle.ideal_s:.1f} s, oracle {oracle.makespan_s:.1f} s")
    truth = [GroupWork(f"{g.prompt_id}/{s}", 1, float(length), True, (length,))
             for g in groups for s, length in enumerate(g.lengths)]
    for frac in (0.0625, 0.125, 0.25, 0.5, 0.75):
        for seqs in (1, 2, 4, 8):
            p = replace(params, tier2_workers_frac=frac, tier2_max_seqs=seqs)
            known = simulate_events(make_policy("tier2", p), truth, config).makespan_s
            predicted = simulate_events(make_policy("tier2", p), groups, config).makespan_s
            closes = f"{(oracle.makespan_s - known) / gap:+.0%}" if gap > 0 else "-"
            print(f"  reserved {frac:6.4f} x {seqs} seqs: true lengths {known:7.1f} s "
                  f"(closes {closes} of the gap), predictions {predicted:7.1f} s")


if __name__ == "__main__":
    main()
