"""Greedy evaluation on held-out prompts: the clean learning signal next to the noisy
per-step training reward (whose batches differ in difficulty)."""

from __future__ import annotations

from pipeline import distributed as dist
from pipeline.config import Config
from pipeline.loop import rollouts
from pipeline.loop.batches import Prompt
from pipeline.rollout.engine import Sampling
from pipeline.tasks.data import build_task_dataset, load_user_dataset


def eval_prompts(cfg: Config, train_ids: set[str]) -> list[Prompt]:
    """Built-in task: fresh prompts never trained on; user data: `data.eval_path`, if set."""

    d = cfg.data
    if d.path is not None:
        if d.eval_path is None:
            return []
        rows = load_user_dataset(d.eval_path, d.split, d.prompt_key, d.answer_key)
    else:
        rows = build_task_dataset(d.task, d.eval_size * 3, d.seed + 7919)
    seen: dict[str, Prompt] = {}
    for row in rows:
        if row["id"] not in train_ids:
            seen.setdefault(row["id"], Prompt(row["id"], row["prompt"], row["answer"]))
    return list(seen.values())[: d.eval_size]


def evaluate(ctx, prompts: list[Prompt]) -> dict:
    """Greedy accuracy and reward over `prompts`, split over the ranks."""
    share = prompts[ctx.rank:: ctx.world_size]
    greedy = Sampling(n=1, temperature=0.0, max_tokens=ctx.cfg.rollout.max_tokens)
    rewards: list[float] = []
    if share:
        done = rollouts.generate(ctx.engine, ctx.tokenizer, share, greedy)
        rollouts.score(done, ctx.reward_fn)
        rewards = [r.reward for r in done]
    everything = [r for part in dist.all_gather(rewards) for r in part]
    n = max(1, len(everything))
    return {"prompts": len(everything), "reward_mean": sum(everything) / n,
            "accuracy": sum(r >= 1.0 - 1e-9 for r in everything) / n}
