"""What better length knowledge would buy seer and tier 2 on production-shaped steps.

On the step scripts/sched_targets.py draws (`sched_lab.synth`, chunk 1,024), seer and
every tier-2 setting (reserved share x sequences per reserved worker) run with the
predictions of each knowledge level (`sched_lab.knowledge`): the history predictor's,
the group's true mean and longest length (more than any per-prompt predictor can know),
and every response's true length. Per level: makespan and the share of the oracle's gap
to the ideal bound it closes (the target is half: docs/scheduling.md), and seer's last 10 % of the
step (tail_s) over static's without speculation (target 0.3) with the moment 90 % of
the requests had finished.

    python scripts/sched_knowledge.py [--workers 256] [--requests 4096] [--spec history+group]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from pipeline.bench.sched import BenchSetup, sim_inputs, step_groups
from pipeline.sched.events import simulate_events
from pipeline.sched.load import SPEC_COST_MODELS
from pipeline.sched.registry import make_policy
from pipeline.sched.settings import PlacementSettings
from sched_lab.knowledge import LEVELS, with_knowledge
from sched_lab.synth import Shape, production_trace

TIER2_GRID = [(frac, seqs) for frac in (0.0625, 0.125, 0.25, 0.5, 0.75) for seqs in (1, 2, 4, 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--requests", type=int, default=4096)
    ap.add_argument("--spec", default="history+group", choices=sorted(SPEC_COST_MODELS))
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    trace = production_trace(Shape(prompts=max(800, 2 * args.requests // 8)), args.seed)
    rpw = math.ceil(args.requests / args.workers)
    setup = BenchSetup(policies=("seer", "tier2", "oracle"), workers=args.workers, spec=args.spec,
                       requests_per_worker=rpw,
                       settings=PlacementSettings(chunk_tokens=args.chunk_tokens), seed=args.seed)
    groups, predictor = step_groups(trace, setup)
    inputs = {spec: sim_inputs(setup, predictor, spec) for spec in {args.spec, "none"}}

    def run(policy: str, gs, spec: str, **knobs):
        config, params = inputs[spec]
        return simulate_events(make_policy(policy, replace(params, **knobs)), gs, config)

    oracle = run("oracle", groups, args.spec)
    static_tail = run("static", groups, "none").tail_s
    gap = oracle.makespan_s - oracle.ideal_s
    print(f"W={args.workers} requests={sum(g.n for g in groups)} spec={args.spec}: ideal "
          f"{oracle.ideal_s:.1f} s, oracle {oracle.makespan_s:.1f} s, half the gap at "
          f"{oracle.makespan_s - gap / 2:.1f} s; static without speculation: last 10 % "
          f"{static_tail:.1f} s")

    def closes(makespan: float) -> str:
        return f"{(oracle.makespan_s - makespan) / gap:+.0%}" if gap > 1e-9 * oracle.makespan_s else "-"

    def tail(r) -> str:
        return (f"last 10 % {r.tail_s:6.1f} s ({r.tail_s / static_tail:.3f} x static), "
                f"90 % done at {r.makespan_s - r.tail_s:6.1f} s")

    print(f"  {'oracle':24s} makespan {oracle.makespan_s:7.1f} s           {tail(oracle)}")
    for level in LEVELS:
        gs = with_knowledge(groups, level)
        seer = run("seer", gs, args.spec)
        best = min(((run("tier2", gs, args.spec, tier2_workers_frac=f, tier2_max_seqs=c).makespan_s,
                     f, c) for f, c in TIER2_GRID))
        print(f"  {level:10s} seer          makespan {seer.makespan_s:7.1f} s (closes "
              f"{closes(seer.makespan_s):>5s})  {tail(seer)}")
        print(f"  {level:10s} tier2 (best)  makespan {best[0]:7.1f} s (closes {closes(best[0]):>5s})"
              f"  reserved {best[1]:.4f} x {best[2]} seqs")


if __name__ == "__main__":
    main()
