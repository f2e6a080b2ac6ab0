"""Run under torchrun by tests/engine/test_sched_runtime.py: the same greedy rollout
placed by every policy over the ranks, with chunks small enough that requests continue
(and migrate) at chunk boundaries. Rank 0 writes the outputs as JSON."""

import json
import sys

from pipeline import distributed as dist
from pipeline.config.schema import ModelConfig, RolloutConfig, SchedConfig
from pipeline.loop.sched_runtime import rollout
from pipeline.rollout.engine import RolloutEngine, Sampling
from pipeline.sched.registry import make_policy
from pipeline.sched.settings import PlacementParams
from pipeline.sched.types import GroupWork
from pipeline.tasks.base import get_task


def main(model: str, out: str) -> None:
    from transformers import AutoTokenizer

    rank, world = dist.init()
    engine = RolloutEngine(ModelConfig(path=model), RolloutConfig(max_num_seqs=8), 256, seed=0)
    tok = AutoTokenizer.from_pretrained(model)
    rows = get_task("sort").generate(6, 11)
    prompts = [tok(r["prompt"])["input_ids"] for r in rows]
    # deliberately poor predictions: the scheduler must cope with them
    groups = [GroupWork(r["id"], 2, float(8 + 4 * i), known=i % 2 == 0) for i, r in enumerate(rows)]
    sampling = Sampling(n=2, temperature=0.0, max_tokens=64, seed=3)
    store = dist.CoordinationStore(SchedConfig().store_timeout_s)
    result = {"store_keys": []}
    for name in ("static", "histopipe", "seer", "tier2"):
        # tier2: one of the two ranks reserved for the longest predicted group, 2 sequences
        policy = make_policy(name, PlacementParams(chunk_tokens=8, migrate_gap=1, capacity=4,
                                                   tier2_workers_frac=0.5, tier2_max_seqs=2))
        r = rollout(engine, prompts, groups, sampling, policy, store=store, capacity=4)
        result[name] = {
            "tokens": [[c.token_ids for c in g] for g in r.groups],
            "logprobs": [[len(c.logprobs) for c in g] for g in r.groups],
            "finish": [[c.finish_reason for c in g] for g in r.groups],
            "migrations": r.migrations, "chunks": [w.chunks for w in r.workers],
            "busy": [w.busy_s for w in r.workers], "makespan": r.makespan_s,
            "bubble": r.bubble_ratio,
            "plan": policy.assign(groups, world) if name == "tier2" else None}
        dist.barrier()
        result["store_keys"].append(store.num_keys())
    if rank == 0:
        plain = engine.generate(prompts, sampling).groups
        result["plain"] = [[c.token_ids for c in g] for g in plain]
        with open(out, "w") as fh:
            json.dump(result, fh)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
