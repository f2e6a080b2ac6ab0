"""Run under torchrun (2 ranks) by tests/engine/test_tp_rollout.py: one vLLM engine with
tensor_parallel_size=2 over both ranks, drafting with history+group+model (the trees and
each rank's copy of the draft model, trained after every rollout as the loop trains it)
under each draft budget in turn. vLLM schedules every rank's shard the same, so each
rank's proposer must make the same drafting decisions: each rank records, pass by pass,
the draft length it proposed for every row and the rows the model drafted, over two
rollouts per budget (the second drafts from the first's history), and writes them as JSON
with the sampled tokens."""

import json
import sys

from pipeline import distributed as dist
from pipeline.config.schema import ModelConfig, RolloutConfig, SpecConfig
from pipeline.history.store import RolloutRecord, prompt_hash
from pipeline.rollout.engine import RolloutEngine, Sampling
from pipeline.tasks.base import get_task


BUDGETS = ("tree", "critical", "throughput")


def main(model: str, out: str) -> None:
    from transformers import AutoTokenizer

    from pipeline.drafting.build import make_budget
    from pipeline.drafting.pass_caps import PassCaps

    rank, _ = dist.init()
    spec = SpecConfig(method="history+group+model")
    engine = RolloutEngine(ModelConfig(path=model),
                           RolloutConfig(max_num_seqs=16, tensor_parallel_size=2), 256, seed=0,
                           spec=spec)
    drafting = engine.drafting
    proposer = drafting.proposer
    drafted: dict[str, list[list[int]]] = {b: [] for b in BUDGETS}
    model_rows: dict[str, int] = {}
    budget = BUDGETS[0]
    propose = proposer.propose

    def recording(*args, **kwargs):
        drafts = propose(*args, **kwargs)
        drafted[budget].append([len(d) for d in drafts])
        return drafts

    proposer.propose = recording
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(r["prompt"])["input_ids"] for r in get_task("sort").generate(4, 5)]
    sampled = []
    for step in range(2 * len(BUDGETS)):
        budget = BUDGETS[step // 2]
        if step % 2 == 0:
            from dataclasses import replace

            drafting.budget = make_budget(replace(spec, budget=budget))
            proposer.bind(proposer._runner, drafting.drafter, drafting.budget,
                          PassCaps.from_spec(spec), drafting.model)
        params = Sampling(n=4, temperature=1.0, max_tokens=48, seed=11 + step)
        groups = engine.generate(prompts, params).groups
        sampled.append([[c.token_ids for c in g] for g in groups])
        drafting.remember([
            RolloutRecord(f"p{i}", prompt_hash(ids), step, step, 0, j, list(c.token_ids),
                          len(c.token_ids), "stop", 0.0, 0.0)
            for i, (ids, g) in enumerate(zip(prompts, groups)) for j, c in enumerate(g)])
        model_rows[budget] = model_rows.get(budget, 0) + int(drafting.stats()["spec_model_rows"])
        drafting.train_model([(ids, list(c.token_ids)) for ids, g in zip(prompts, groups)
                              for c in g])
    with open(f"{out}.{rank}", "w") as fh:
        json.dump({"rank": rank, "drafted": drafted, "model_rows": model_rows,
                   "sampled": sampled}, fh)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
