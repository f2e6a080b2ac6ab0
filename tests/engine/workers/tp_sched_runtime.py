"""Run under torchrun (4 ranks) by tests/engine/test_tp_rollout.py: two TP groups of 2
ranks, each one vLLM engine (tensor_parallel_size=2); a greedy rollout placed by static and
seer over the two groups (workers), with chunks small enough that requests continue.
Rank 0 writes the outputs and group 0's plain greedy rollout as JSON."""

import json
import sys

from pipeline.config.schema import ModelConfig, RolloutConfig, RunConfig, SchedConfig
from pipeline import distributed as dist
from pipeline.loop.tp_groups import TPLayout, new_groups
from pipeline.rollout.engine import RolloutEngine, Sampling
from pipeline.sched.registry import make_policy
from pipeline.sched.settings import PlacementParams
from pipeline.loop.sched_runtime import rollout
from pipeline.sched.types import GroupWork
from pipeline.tasks.base import get_task


def main(model: str, out: str) -> None:
    from transformers import AutoTokenizer

    rank, world = dist.init()
    layout = TPLayout(world, 2)
    group = new_groups(layout, RunConfig().dist_timeout_min)
    engine = RolloutEngine(ModelConfig(path=model),
                           RolloutConfig(max_num_seqs=8, tensor_parallel_size=2), 256, seed=0)
    tok = AutoTokenizer.from_pretrained(model)
    rows = get_task("sort").generate(6, 11)
    prompts = [tok(r["prompt"])["input_ids"] for r in rows]
    groups = [GroupWork(r["id"], 2, float(8 + 4 * i), known=i % 2 == 0) for i, r in enumerate(rows)]
    spec = Sampling(n=2, temperature=0.0, max_tokens=64, seed=3)
    store = dist.CoordinationStore(SchedConfig().store_timeout_s)
    result = {}
    for name in ("static", "seer"):
        policy = make_policy(name, PlacementParams(chunk_tokens=8, migrate_gap=1, capacity=4))
        r = rollout(engine, prompts, groups, spec, policy, store=store, capacity=4,
                    tp_size=2, tp_group=group)
        result[name] = {"tokens": [[c.token_ids for c in g] for g in r.groups],
                        "workers": len(r.workers), "chunks": [w.chunks for w in r.workers]}
        dist.barrier()
    if layout.group_of(rank) == 0:  # both ranks of group 0 drive its engine
        plain = engine.generate(prompts, spec).groups
        result["plain"] = [[c.token_ids for c in g] for g in plain]
    dist.barrier()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
