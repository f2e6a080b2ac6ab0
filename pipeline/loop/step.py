"""One synchronous, on-policy GRPO step as a short sequence of named, timed phases."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline import distributed as dist
from pipeline.costs import bubble_ratio, tail_s
from pipeline.loop import rollouts
from pipeline.loop.batches import shard
from pipeline.loop.context import Context
from pipeline.loop.metrics import summarize_lengths
from pipeline.loop.timer import PhaseTimer
from pipeline.rollout.contract import Sampling


@dataclass
class StepResult:
    metrics: dict
    records: list  # this step's RolloutRecords, all ranks (rank 0 persists them)


def rl_step(ctx: Context, step: int) -> StepResult:
    """ctx: engine, actor, tokenizer, data, config, ranks (`pipeline.loop.context`)."""
    cfg, phases = ctx.cfg, PhaseTimer()
    epoch = ctx.prompts.epoch_of(step)
    version = ctx.policy_version
    scheduler = ctx.scheduler  # None: each rank generates its own share (static split)

    with phases("rollout"):
        ctx.engine.wake()
        if scheduler is None:
            mine = shard(ctx.prompts.batch(step), ctx.rank, ctx.world_size)
            group = rollouts.generate(ctx.engine, ctx.tokenizer, mine, sampling(cfg, step))
        else:
            group = scheduler.generate(ctx, step, sampling(cfg, step))
        ctx.engine.sleep()
    busy_s = scheduler.busy_seconds(ctx.rank) if scheduler else phases.seconds["rollout"]
    with phases("reward"):
        rollouts.score(group, ctx.reward_fn)
    with phases("train"):
        batch = rollouts.to_batch(group, ctx.tokenizer.pad_token_id, cfg.train.adv_estimator)
        train_metrics = ctx.actor.update(batch)
    with phases("sync"):
        ctx.engine.update_weights(ctx.actor.named_weights(), version + 1)
        ctx.policy_version = version + 1
    spec_metrics = ctx.engine.spec_metrics()
    with phases("gather"):
        records = rollouts.to_records(group, epoch, step, version)
        finish = [r.completion.finish_s for r in group]
        everything = dist.all_gather((records, {**train_metrics, **spec_metrics},
                                      phases.seconds.get("rollout", 0.0), finish, busy_s))
    records = [r for rank_records, *_ in everything for r in rank_records]
    if scheduler:
        scheduler.remember(records)
    if ctx.engine.drafting:
        with phases("index"):
            ctx.engine.drafting.remember(records)  # every rank may draft for any prompt
    metrics = step_metrics(step, epoch, version, records, everything, phases)
    if scheduler:
        metrics.update(scheduler.metrics())
    return StepResult(metrics, records)


def sampling(cfg, step: int) -> Sampling:
    """Per-step seeds: the same step samples the same way after a resume."""
    r = cfg.rollout
    return Sampling(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                        max_tokens=r.max_tokens, seed=(cfg.run.seed * 1_000_003 + step) * 65_536)


def step_metrics(step, epoch, version, records, everything, phases: PhaseTimer) -> dict:
    rewards = [r.reward for r in records]
    lengths = [r.length for r in records]
    lens = summarize_lengths(lengths)
    train = [m for _, m, *_ in everything]
    rollout_s = max(s for _, _, s, *_ in everything)  # the step waits for the slowest rank
    busy = [b for *_, b in everything]  # seconds each rank (rollout worker) was generating
    out = {
        "step": step + 1, "epoch": epoch, "policy_version": version,
        "reward_mean": sum(rewards) / len(rewards),
        "accuracy": sum(r >= 1.0 - 1e-9 for r in rewards) / len(rewards),
        "resp_len_mean": lens["mean"], "resp_len_p90": lens["p90"], "resp_len_max": lens["max"],
        "truncated_frac": sum(r.finish_reason == "length" for r in records) / len(records),
        "gen_tokens": sum(lengths),
        "gen_tokens_per_s": sum(lengths) / rollout_s if rollout_s > 0 else 0.0,
    }
    for key in train[0]:
        name = key if key.startswith("spec_") else f"train_{key}"
        out[name] = sum(m[key] for m in train) / len(train)
    out.update(phases.as_metrics())
    out["time_rollout_s"] = round(rollout_s, 4)
    # how the rollout work spread over the ranks (the rollout workers): idle rank-seconds
    # over rank-seconds, and the time spent finishing the last 10 % of the responses
    out["rollout_bubble_ratio"] = round(bubble_ratio(busy, rollout_s), 4)
    out["rollout_tail_s"] = round(tail_s([f for _, _, _, fs, _ in everything for f in fs]), 4)
    return out
