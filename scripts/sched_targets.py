"""The scheduling targets (docs/scheduling.md) on production-shaped traces, simulated.

For W in (256, 1024) and speculation none / history+group: every policy's makespan over
the oracle's and over the ideal bound, tier 2 and tail batching against the oracle's gap
to the bound, and the last 10 % of the step (tail_s) of seer with speculation over static
without. Chunks of --chunk-tokens. Prints one table row per line.

    python scripts/sched_targets.py [--requests 4096,8192] [--chunk-tokens 1024]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import numpy as np

from pipeline.bench.sched import BenchSetup, sim_inputs, step_groups
from pipeline.sched.events import simulate_events
from pipeline.sched.registry import make_policy
from pipeline.sched.settings import PlacementSettings
from pipeline.sched.types import GroupWork
from sched_lab.synth import Shape, production_trace
from sched_lab.tail import TailBatching, simulate_tail

POLICIES = ("static", "histopipe", "tier2", "seer", "oracle")
STEPS = 8  # tail batching: deferred prompts come back (pinned after 2 waits); 2 windows of 4
TAILS = {"overprovision 0.25": TailBatching(0.25), "overprovision 1.0": TailBatching(1.0),
         "long prompts bucketed (4 steps)": TailBatching(0.0, bucket_steps=4),
         "bucketed + overprovision 0.25": TailBatching(0.25, bucket_steps=4)}


def one(workers: int, requests: int, spec: str, chunk: int, seed: int) -> dict:
    trace = production_trace(Shape(prompts=max(800, 2 * requests // 8)), seed)
    rpw = math.ceil(requests / workers)
    setup = BenchSetup(policies=POLICIES, workers=workers, spec=spec, requests_per_worker=rpw,
                       settings=PlacementSettings(chunk_tokens=chunk), seed=seed)
    groups, predictor = step_groups(trace, setup)
    config, params = sim_inputs(setup, predictor)
    out = {name: simulate_events(make_policy(name, params), groups, config) for name in POLICIES}
    best_t2 = min((simulate_events(make_policy("tier2", replace(params, tier2_workers_frac=f,
                                                                tier2_max_seqs=c)), groups, config)
                   for f in (0.0625, 0.125) for c in (2, 4, 8)), key=lambda r: r.makespan_s)
    out["tier2_best"] = best_t2
    # tail batching: STEPS steps of the same number of groups from the replayed epoch
    pool = [GroupWork(g.group_id, len(g.lengths), predictor.predict(g.group_id),
                      predictor.known(g.group_id), g.lengths) for g in trace.step(trace.step_epoch())]
    per_step = len(groups)
    seer = make_policy("seer", params)
    base = simulate_tail(pool, per_step, STEPS, seer, config, simulate_events)
    tails = {name: simulate_tail(pool, per_step, STEPS, seer, config, simulate_events, tail)
             for name, tail in TAILS.items()}
    out["tail"] = (np.mean([r.step_s for r in base]),
                   {op: (np.mean([r.step_s for r in t]), np.mean([r.deferred for r in t]),
                         max(max(r.waits) for r in t)) for op, t in tails.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="4096,8192", help="requests per step at W=256, W=1024")
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sizes = [int(x) for x in args.requests.split(",")]
    static_tail = {}
    for workers, requests in zip((256, 1024), sizes):
        for spec in ("none", "history+group"):
            r = one(workers, requests, spec, args.chunk_tokens, args.seed)
            oracle, ideal = r["oracle"].makespan_s, r["oracle"].ideal_s
            print(f"W={workers} requests={requests} spec={spec}: ideal {ideal:.1f} s, oracle "
                  f"{oracle:.1f} s ({oracle / ideal:.3f} x ideal)")
            for name in (*POLICIES, "tier2_best"):
                x = r[name]
                print(f"  {name:10s} makespan {x.makespan_s:8.1f} s  x oracle {x.makespan_s / oracle:.3f}"
                      f"  x ideal {x.makespan_s / ideal:.3f}  tail_s {x.tail_s:7.1f}")
            gap = oracle - ideal

            def closes(x):
                return f"closes {(oracle - x) / gap:+.0%} of the oracle's gap" if gap > 1e-9 * oracle \
                    else "(the oracle is at the bound)"

            t2 = r["tier2_best"].makespan_s
            print(f"  tier2 (best of 6 settings) {closes(t2)}")
            base, tails = r["tail"]
            for op, (mean_s, deferred, wait) in tails.items():
                print(f"  tail batching, {op}, seer, {STEPS} steps: mean step {mean_s:.1f} s vs "
                      f"{base:.1f} s without; {closes(mean_s)}; deferred/step {deferred:.0f}, "
                      f"max wait {wait} steps")
            if spec == "none":
                static_tail[workers] = r["static"].tail_s
            else:
                ratio = r["seer"].tail_s / static_tail[workers]
                print(f"  seer+speculation last 10 % / static without: {ratio:.3f}")


if __name__ == "__main__":
    main()
