"""`rhymectl bench sched RUN_DIR --workers W` without --simulate: the policies on real
rollout workers. Started by the command under torchrun (one rank per worker):

    python -m pipeline.bench.sched_real RUN_DIR OUT_JSON POLICIES SPEC REQUESTS_PER_WORKER
        CHUNK_TOKENS CAPACITY SEED TIER2_WORKERS_FRAC TIER2_MAX_SEQS MIGRATE_GAP [EPOCH]

(MIGRATE_GAP 0: auto, as `sched.migrate_gap: null`.)

The step is drawn exactly as the simulated bench draws it (`step_groups`: the replay
epoch's groups, predictions from the epochs before), its prompts come from the run's data
set and its policy from the run's newest checkpoint. Each policy then runs that step on the
W ranks (`pipeline.loop.sched_runtime`), after one unmeasured warm-up step. Per policy:

- makespan_s: the coordinator's time to the last finished response;
- ideal_s: the larger of total busy worker-seconds / W and the decode time of the longest
  response on its own (its length × the measured seconds per token of one request
  generated alone, speculation included);
- bubble_ratio: idle worker-seconds / worker-seconds; tail_s: time spent finishing the
  last 10 % of the responses;
- simulated_makespan_s: the simulator's makespan for the same step, the same lengths and
  a cost model fitted to this run's measured decode passes — the calibration check.

Oracle needs the true lengths in advance and is only simulated. Rank 0 writes the JSON.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from pipeline import distributed as dist
from pipeline.atomic import write_json_atomic
from pipeline.bench.sched import BenchSetup, step_groups
from pipeline.config import load_config
from pipeline.costs import SCHED_COST, tail_s
from pipeline.distributed import CoordinationStore
from pipeline.history import index
from pipeline.loop.sched_runtime import measured_cost, rollout
from pipeline.loop.step import sampling
from pipeline.process_exit import exit_now
from pipeline.rollout.engine import RolloutEngine
from pipeline.sched.registry import make_policy
from pipeline.sched.settings import PlacementSettings
from pipeline.sched.simulator import SimConfig, SimResult, simulate
from pipeline.sched.trace import trace_from_history
from pipeline.tasks.prompts import distinct, train_rows
from pipeline.train import checkpoint


def main(argv: list[str]) -> None:
    run_dir, out, policies, spec_method, rpw, chunk, capacity, seed, frac, seqs, gap, *rest = argv
    run_dir = Path(run_dir)
    rank, world = dist.init()
    cfg = load_config(run_dir / "config.yaml", [f"spec.method={spec_method}"])
    settings = PlacementSettings(chunk_tokens=int(chunk), migrate_gap=int(gap) or None,
                                 tier2_workers_frac=float(frac), tier2_max_seqs=int(seqs))
    setup = BenchSetup(policies=tuple(policies.split(",")), workers=world, spec=spec_method,
                       capacity=int(capacity), requests_per_worker=int(rpw), settings=settings,
                       epoch=int(rest[0]) if rest else None, seed=int(seed))
    groups, predictor = step_groups(trace_from_history(run_dir), setup)
    groups = [replace(g, lengths=None) for g in groups]  # real runs find out the lengths
    text = {p.id: p.text for p in distinct(train_rows(cfg.data))}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    prompts = [tok(text[g.prompt_id])["input_ids"] for g in groups]
    latest = checkpoint.latest(run_dir / "checkpoints")
    model = replace(cfg.model, path=str(latest / "policy")) if latest else cfg.model
    engine = RolloutEngine.from_config(cfg, model=model)
    if engine.drafting is not None:  # drafts from the run's history, as training would

        loaded = index.load(run_dir, cfg.model.path, cfg.spec.history_epochs)
        if loaded is not None:
            engine.drafting.load_history(loaded.responses(as_arrays=True))
    step_sampling = replace(sampling(cfg, 0), n=groups[0].n)
    params = settings.step_params(predictor, setup.requests_per_worker, capacity=setup.capacity)
    # warm-up (unmeasured): CPU kernels see their shapes once before any policy is timed;
    # its passes give the cost model the policies place with, as a step's give training's
    store = CoordinationStore(cfg.sched.store_timeout_s)
    warm = rollout(engine, prompts, groups, step_sampling, make_policy("static", params),
                   store=store, capacity=setup.capacity)
    params = replace(params, cost=measured_cost(warm.workers, SCHED_COST))
    # one request on its own: seconds per generated token (speculation included)
    single = engine.generate([prompts[0]], replace(step_sampling, n=1, max_tokens=64))
    alone = single.groups[0][0]
    decode_s = sum(s for _, s, prefill in single.stats.passes.samples if not prefill)
    per_token_1 = decode_s / max(1, len(alone.token_ids) - 1)

    results, lengths, workers = {}, {}, []
    for name in setup.policies:
        if name == "oracle":
            continue
        r = rollout(engine, prompts, groups, step_sampling, make_policy(name, params),
                    store=store, capacity=setup.capacity, step=setup.seed)
        finish = [[c.finish_s for c in g] for g in r.groups]
        lens = [[len(c.token_ids) for c in g] for g in r.groups]
        busy = sum(w.busy_s for w in r.workers)
        ideal = max(busy / world, max(max(x) for x in lens) * per_token_1)
        results[name] = SimResult(name, world, r.makespan_s, ideal, r.bubble_ratio,
                                  tail_s([f for g in finish for f in g]), r.migrations, finish,
                                  [w.timeline for w in r.workers])
        lengths[name] = lens
        workers += r.workers
    if rank == 0:
        cost = measured_cost(workers, SCHED_COST)
        report = {"source": "real", "workers": world, "per_token_1_s": per_token_1,
                  "cost_model": {"base_s": cost.base_s, "per_token_s": cost.per_token_s,
                                 "tau": cost.tau, "draft_tokens": cost.draft_tokens},
                  "policies": {}}
        for name, r in results.items():
            sim = _simulate(name, groups, lengths[name], world, setup, params, cost)
            report["policies"][name] = {**{k: round(float(v), 6) for k, v in r.summary().items()},
                                        "migrations": r.migrations,
                                        "simulated_makespan_s": round(sim.makespan_s, 6),
                                        "sim_over_real": round(sim.makespan_s / r.makespan_s, 4)
                                        if r.makespan_s else None,
                                        "timelines": r.timelines}
        write_json_atomic(out, report)
    dist.barrier()


def _simulate(name, groups, lengths, workers, setup, params, cost):
    with_lengths = [replace(g, lengths=tuple(ls)) for g, ls in zip(groups, lengths)]
    config = SimConfig(workers=workers, capacity=setup.capacity, prompt_tokens=setup.prompt_tokens,
                       cost=cost)
    return simulate(make_policy(name, replace(params, cost=cost)), with_lengths, config)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now(0)
