"""Held-out evaluation: the clean learning signal next to the noisy per-step training reward
(whose batches differ in difficulty).

Two views of the same prompts, never trained on:
- greedy (temperature 0): one response per prompt, `accuracy` and `reward_mean`;
- mean@k (`run.eval_n` = k samples per prompt at the rollout temperature, top-p and top-k):
  what GRPO optimises. Each prompt's k rewards are averaged first, then the prompts, so
  the standard error is the spread of the per-prompt means over sqrt(prompts): prompts
  are the independent units, a prompt's k samples are not.
"""

from __future__ import annotations

import math
from typing import Sequence

from pipeline import distributed as dist
from pipeline.loop import rollouts
from pipeline.loop.context import Context
from pipeline.loop.tp_groups import TPLayout
from pipeline.rollout.contract import Sampling
from pipeline.tasks.prompts import Prompt

# A fixed sampling seed for every evaluation of a run (common random numbers): the change
# from step 0 to step N is then not blurred by drawing new random streams each time.
EVAL_SEED_OFFSET = 7_777_777


def is_correct(reward: float) -> bool:
    return reward >= 1.0 - 1e-9


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) of independent values; SE 0 for fewer than 2."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def mean_at_k(rewards: Sequence[Sequence[float]]) -> dict:
    """k rewards per prompt ([P][k]) -> mean@k reward and accuracy with their standard errors
    over prompts, plus the per-prompt means ([P], for comparisons across runs)."""
    per_reward = [sum(r) / len(r) for r in rewards if r]
    per_acc = [sum(is_correct(x) for x in r) / len(r) for r in rewards if r]
    reward, reward_se = mean_se(per_reward)
    acc, acc_se = mean_se(per_acc)
    return {"mean_at_k_reward": reward, "mean_at_k_reward_se": reward_se,
            "mean_at_k_accuracy": acc, "mean_at_k_accuracy_se": acc_se,
            "per_prompt_reward": [round(v, 6) for v in per_reward],
            "per_prompt_accuracy": [round(v, 6) for v in per_acc]}


def evaluate(ctx: Context, prompts: list[Prompt], keep: list | None = None) -> dict:
    """Greedy accuracy and reward, and mean@k at the rollout temperature, over `prompts`,
    split over the engines (TP groups: the ranks of a group generate the same share and only
    its leader counts it). Per-prompt lists come back in `prompts` order. keep: where
    given, this rank's responses (`Rollout`s, greedy then sampled) are appended to it (the
    draft model's warm-up, `pipeline.loop.warmup`)."""
    cfg = ctx.cfg
    tp = ctx.tp or TPLayout(ctx.world_size)
    share = prompts[tp.group_of(ctx.rank):: tp.groups]
    greedy, sampled = eval_samplings(cfg)
    k = cfg.run.eval_n
    mine: tuple[list[float], list[list[float]]] = ([], [])
    if share:  # every rank of a TP group drives its engine; only the leader counts
        done, _ = rollouts.generate(ctx.engine, ctx.encoder, share, greedy)
        rollouts.score(done, ctx.reward_fn)
        mine = ([x.reward for x in done], [])
        if keep is not None:
            keep.extend(done)
        if sampled is not None:
            done, _ = rollouts.generate(ctx.engine, ctx.encoder, share, sampled)
            rollouts.score(done, ctx.reward_fn)
            if keep is not None:
                keep.extend(done)
            mine[1].extend([x.reward for x in done[i * k:(i + 1) * k]] for i in range(len(share)))
        if not tp.is_leader(ctx.rank):
            mine = ([], [])
    parts = dist.all_gather(mine)
    greedy_rewards, sampled_rewards = _interleave([p[0] for p in parts]), \
        _interleave([p[1] for p in parts])
    return summarize(greedy_rewards, sampled_rewards, k, cfg.rollout.temperature)


def eval_samplings(cfg) -> tuple[Sampling, Sampling | None]:
    """How an evaluation samples: greedy, and `run.eval_n` samples a prompt at the rollout
    temperature under the run's fixed evaluation seed (None where eval_n is 0)."""
    greedy = Sampling(n=1, temperature=0.0, max_tokens=cfg.rollout.max_tokens, logprobs=False)
    k = cfg.run.eval_n
    sampled = Sampling.from_rollout(  # scored by reward only
        cfg.rollout, n=k, seed=(cfg.run.seed + EVAL_SEED_OFFSET) * 65_536,
        logprobs=False) if k else None
    return greedy, sampled


def summarize(greedy_rewards: list[float], sampled_rewards: list[list[float]], k: int,
              temperature: float) -> dict:
    """One eval.jsonl record (without its step) from greedy rewards [P] and sampled [P][k]."""
    n = max(1, len(greedy_rewards))
    acc = sum(is_correct(x) for x in greedy_rewards) / n
    out = {"prompts": len(greedy_rewards), "reward_mean": sum(greedy_rewards) / n,
           "accuracy": acc, "accuracy_se": math.sqrt(acc * (1 - acc) / n)}
    if k and sampled_rewards:
        out.update({"k": k, "temperature": temperature, **mean_at_k(sampled_rewards)})
    return out


def _interleave(parts: list[list]) -> list:
    """Undo the `prompts[rank::world]` split: rank r's i-th item was prompt i*world + r."""
    out = []
    for i in range(max((len(p) for p in parts), default=0)):
        out.extend(p[i] for p in parts if i < len(p))
    return out
