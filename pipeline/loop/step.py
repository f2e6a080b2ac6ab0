"""One synchronous, on-policy GRPO step as a short sequence of named, timed phases."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline import distributed as dist
from pipeline.faults import fault
from pipeline.costs import bubble_ratio, tail_s
from pipeline.loop import rollouts
from pipeline.loop.batches import shard
from pipeline.loop.context import Context
from pipeline.loop.metrics import summarize_lengths
from pipeline.loop.timer import PhaseTimer
from pipeline.loop.tp_groups import TPLayout
from pipeline.rollout.contract import DraftingState, RolloutStats, Sampling


@dataclass
class StepResult:
    metrics: dict
    records: list  # this step's RolloutRecords, all ranks (rank 0 persists them)


def rl_step(ctx: Context, step: int) -> StepResult:
    """ctx: engine, actor, prompt encoder, data, config, ranks (`pipeline.loop.context`)."""
    cfg, phases = ctx.cfg, PhaseTimer()
    version = ctx.policy_version
    scheduler = ctx.scheduler  # None: each rank generates its own share (static split)
    launched = ctx.tail.launch() if ctx.tail else None  # tail batching: more than it trains
    epoch = max(x.epoch for x in launched) if launched else ctx.prompts.epoch_of(step)
    params = sampling(cfg, step)

    with phases("rollout"):  # the engine is awake, holding the policy of `version`
        if launched:
            group, stats = tail_rollout(ctx, params, launched)
        elif scheduler is None:
            group, stats = static_rollout(ctx, step, params)
        else:
            group, stats = scheduler.generate(ctx, step, params)
        ctx.engine.sleep()  # its weights and KV cache go; the trainer gets the memory
    if ctx.engine.drafting and step + 1 < cfg.train.total_steps:
        # the next step's trees build in the background while reward and train run
        ctx.engine.drafting.prepare(next_prompt_ids(ctx, step + 1))
    fault("after_rollout")
    busy_s = scheduler.busy_seconds(ctx.rank) if scheduler else phases.seconds["rollout"]
    with phases("reward"):
        rollouts.score(group, ctx.reward_fn)
    with phases("train"):
        batch = rollouts.to_batch(group, ctx.encoder.pad_id, cfg.train.adv_estimator)
        # the next step's sampler check compares vLLM with this update's starting weights
        train_metrics = ctx.actor.update(batch, keep_policy=sampling(cfg, step + 1).logprobs)
        teachers = ctx.actor.take_teachers()  # the draft model's, per row (or none)
    fault("after_train")
    with phases("sync"):  # wakes the engine with the new policy (pipeline.rollout.residency)
        ctx.engine.update_weights(ctx.actor.named_weights(), version + 1)
        ctx.policy_version = version + 1
    fault("after_sync")
    spec_metrics = rollout_metrics(stats, ctx.engine.drafting, tail=bool(launched))
    with phases("gather"):
        epochs = {id(x.prompt): x.epoch for x in launched} if launched else None
        records = rollouts.to_records(group, epoch, step, version, epochs)
        finish = [r.completion.finish_s for r in group]
        everything = dist.all_gather((records, {**train_metrics, **spec_metrics},
                                      phases.seconds.get("rollout", 0.0), finish, busy_s))
    records = [r for rank_records, *_ in everything for r in rank_records]
    if scheduler:
        scheduler.remember(records)
    draft_metrics = {}
    if ctx.engine.drafting:
        with phases("index"):
            ctx.engine.drafting.remember(records)  # every rank may draft for any prompt
        if ctx.engine.drafting.model is not None:
            with phases("draft_train"):  # the draft model learns this step's responses
                draft_metrics = ctx.engine.drafting.train_model(
                    draft_examples(ctx, step, launched, records, teachers))
    metrics = step_metrics(step, epoch, version, records, everything, phases)
    metrics.update(draft_metrics)
    if scheduler:
        metrics.update(scheduler.metrics())
    if launched:
        metrics.update(settle_tail(ctx.tail, launched, records))
    return StepResult(metrics, records)


def rollout_metrics(stats: RolloutStats, drafting: DraftingState | None, tail: bool) -> dict:
    """This rank's speculation metrics of the rollout (`spec_*`, with rhymectl's drafter
    its counters since the last call) and, with tail batching, the tokens of the groups
    it dropped."""
    out = stats.spec_metrics()
    if stats.speculating and drafting is not None:
        out.update(drafting.stats())
    if tail:
        out["tail_dropped_tokens"] = stats.dropped_tokens
    return out


def tail_rollout(ctx, params: Sampling, launched: list) -> tuple[list, RolloutStats]:
    """Tail batching (`pipeline.loop.tail_queue`): each rank launches its share of the
    over-provisioned batch and keeps the first groups to complete, the pinned ones among
    them, as many as its share of data.train_batch_size."""
    mine = shard(launched, ctx.rank, ctx.world_size)
    keep = ctx.tail.keep // ctx.world_size
    return rollouts.generate(ctx.engine, ctx.encoder, [x.prompt for x in mine],
                             params, keep, ctx.tail.pinned(mine))


def settle_tail(tail, launched: list, records: list) -> dict:
    """Defer what the step launched and did not train on (every rank the same: `records`
    are every rank's); the step's tail-batching metrics."""
    trained = {(r.prompt_id, r.epoch) for r in records}
    waits = [x.waits for x in launched if x.key in trained]
    deferred = tail.settle(trained)
    return {"tail_launched": len(launched), "tail_deferred": deferred,
            "tail_wait_max": max(waits, default=0),
            "tail_wait_mean": round(sum(waits) / len(waits), 4) if waits else 0.0,
            "tail_queue": len(tail.deferred)}


def static_rollout(ctx, step: int, params: Sampling) -> tuple[list, RolloutStats]:
    """This rank's rollouts when every rollout worker runs its own share of the run's
    placement plan (`ctx.placement` runs locally: static, the contiguous split, or any
    policy on one worker): `group_rollout` of its TP group's share of the step's batch."""
    tp = ctx.tp or TPLayout(ctx.world_size)
    batch = ctx.prompts.batch(step)
    share = [batch[g] for g in ctx.placement.share(len(batch), params.n, tp.group_of(ctx.rank),
                                                   tp.groups)]
    return group_rollout(ctx, share, params)


def group_rollout(ctx, share: list, params: Sampling) -> tuple[list, RolloutStats]:
    """This rank's rollouts of `share`, its TP group's prompts: the group's engine
    generates them all (every rank of the group the same); the rank keeps its own 1/T,
    which is the share it would have had with T = 1 (see `pipeline.loop.tp_groups`)."""
    tp = ctx.tp or TPLayout(ctx.world_size)
    out, stats = rollouts.generate(ctx.engine, ctx.encoder, share, params)
    if tp.tp == 1:
        return out, stats
    mine = {id(p) for p in shard(share, tp.tp_rank(ctx.rank), tp.tp)}
    return [r for r in out if id(r.prompt) in mine], stats


def draft_examples(ctx, step: int, launched, records: list, teachers: list) -> list[tuple]:
    """(prompt ids, response ids, teacher or None) of every rank's records, in their order:
    what the draft model trains on (the records name prompts by hash; the step's batch
    gives their ids). teachers: this rank's, per record of its own (empty: none), which
    every rank gathers, in rank order as the records are (a collective: every rank calls)."""
    from pipeline.history.store import prompt_hash

    prompts = [x.prompt for x in launched] if launched else ctx.prompts.batch(step)
    ids = {prompt_hash(p): p for p in ctx.encoder.encode_many([p.text for p in prompts])}
    taught = gather_teachers(teachers) if ctx.actor.teacher_k else [None] * len(records)
    if len(taught) != len(records):
        raise RuntimeError(f"{len(taught)} teachers for {len(records)} rollouts")
    return [(ids[r.prompt_hash], list(r.response_ids), t) for r, t in zip(records, taught)
            if r.prompt_hash in ids]


def gather_teachers(teachers: list) -> list:
    """Every rank's `Teacher`s, in rank order, each rank's sent as three tensors."""
    from pipeline.train.teacher import Teacher

    mine = ([len(t) for t in teachers], torch.cat([t.ids for t in teachers]),
            torch.cat([t.logprobs for t in teachers])) if teachers else ([], None, None)
    out = []
    for lengths, ids, lps in dist.all_gather(mine):
        if lengths:
            out += [Teacher(a, b) for a, b in zip(torch.split(ids, lengths),
                                                  torch.split(lps, lengths))]
    return out


def next_prompt_ids(ctx, step: int) -> list[list[int]]:
    """The prompts this rank's engine will generate at `step`, as it will encode them: the
    whole batch where a coordinated policy may place any group on any rank, else the share
    of this rank's engine (what `static_rollout` generates)."""
    batch = ctx.prompts.batch(step)
    if ctx.scheduler is None:
        tp = ctx.tp or TPLayout(ctx.world_size)
        n = ctx.cfg.rollout.n
        batch = [batch[g] for g in ctx.placement.share(len(batch), n, tp.group_of(ctx.rank),
                                                       tp.groups)]
    return ctx.encoder.encode_many([p.text for p in batch])


def sampling(cfg, step: int) -> Sampling:
    """Per-step seeds: the same step samples the same way after a resume. vLLM's logprobs
    only on sampler-check steps, every `rollout.logprob_check_every`-th from step 0: by
    step number alone, so a resumed run checks (and logs) what an uninterrupted one does."""
    r = cfg.rollout
    every = r.logprob_check_every
    return Sampling.from_rollout(r, n=r.n, seed=(cfg.run.seed * 1_000_003 + step) * 65_536,
                                 logprobs=every > 0 and step % every == 0)


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
        if key.startswith("tail_"):  # counts: summed over the ranks
            out[key] = sum(m[key] for m in train)
            continue
        name = key if key.startswith("spec_") else f"train_{key}"
        out[name] = sum(m[key] for m in train) / len(train)
    out.update(phases.as_metrics())
    out["time_rollout_s"] = round(rollout_s, 4)
    # how the rollout work spread over the ranks (the rollout workers): idle rank-seconds
    # over rank-seconds, and the time spent finishing the last 10 % of the responses
    out["rollout_bubble_ratio"] = round(bubble_ratio(busy, rollout_s), 4)
    out["rollout_tail_s"] = round(tail_s([f for _, _, _, fs, _ in everything for f in fs]), 4)
    return out
