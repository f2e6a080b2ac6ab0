"""Greedy evaluation on held-out prompts: the clean learning signal next to the noisy
per-step training reward (whose batches differ in difficulty)."""

from __future__ import annotations

from pipeline import distributed as dist
from pipeline.loop import rollouts
from pipeline.loop.context import Context
from pipeline.rollout.contract import Sampling
from pipeline.tasks.prompts import Prompt


def evaluate(ctx: Context, prompts: list[Prompt]) -> dict:
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
