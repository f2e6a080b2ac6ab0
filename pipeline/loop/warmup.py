"""Warming the draft model up before a fresh run's first step (`spec.draft_warmup`).

A draft model starts as the policy's embeddings, head and a layer or two, and learns the
policy only from the run's own rollouts, so the first steps draft from a poor model of it.
The warm-up teaches it the starting policy first, right after the held-out evaluation
before step 1:

1. responses of the starting policy to prompts the run does not train on:
   - `eval`: the evaluation's own (greedy and mean@k), which the run generates anyway;
     each TP group's leader contributes its share;
   - `rollout`: a rollout of `rollout.n` responses to each warm-up prompt (`ctx.warmup_set`,
     `pipeline.loop.batches.warmup_batch`), sampled as a step samples them but under the
     seeds of step -1, apart from every step's; each rank keeps its own (as many each);
2. teacher: the trainer's forward over them without an update (the engine sleeps
   meanwhile, then wakes with the same weights): the policy's `spec.draft_distill` most
   likely tokens at every response token (skipped where the draft learns sampled tokens).
   Every rank scores as many rows (ZeRO-3's forward is collective): the fewest any has;
3. training: every rank's responses gathered, `spec.draft_warmup_updates` updates of the
   draft (`DraftTrainer.warm_up`); the per-step training goes on from those weights.

Nothing of it enters the history, the policy or the step's own metrics: its counts are the
first step's `warmup_*` metrics (rank 0's rollout, every rank's draft training) and its
seconds `time_warmup_*_s`. A rerun repeats it token for token (its seeds are fixed and its
drafts reproducible like a step's); a resumed run loads the warmed-up draft (trained on
since) from its checkpoint and does not warm up again.
"""

from __future__ import annotations

from dataclasses import replace

from pipeline import distributed as dist
from pipeline.loop import rollouts
from pipeline.loop.batches import shard
from pipeline.loop.step import gather_teachers, group_rollout, rollout_metrics, sampling
from pipeline.loop.timer import PhaseTimer
from pipeline.loop.tp_groups import TPLayout

WARMUP_STEP = -1  # the warm-up rollout samples with the seeds a step before step 0 would


def warm_up(ctx, evaluated: list | None = None) -> dict:
    """The draft model's warm-up (see the module docstring) on every rank; its metrics
    ({} where there is nothing to warm up). evaluated: this rank's responses of the
    evaluation before step 1 (`spec.draft_warmup: eval`)."""
    drafting, source = ctx.engine.drafting, ctx.cfg.spec.draft_warmup
    if source == "none" or drafting is None or drafting.model is None:
        return {}
    cfg, phases, out = ctx.cfg, PhaseTimer(), {}
    tp = ctx.tp or TPLayout(ctx.world_size)
    if source == "rollout":
        with phases("warmup_rollout"):
            share = shard(ctx.warmup_set, tp.group_of(ctx.rank), tp.groups)
            group, stats = group_rollout(ctx, share,
                                         replace(sampling(cfg, WARMUP_STEP), logprobs=False))
        out = {f"warmup_{k}": v for k, v in rollout_metrics(stats, drafting, tail=False).items()}
        contributes = True  # every rank's own 1/T of its group's share
    else:
        group, contributes = list(evaluated or []), tp.is_leader(ctx.rank)
    rows = min(dist.all_gather(len(group)))
    if not rows:
        return {}
    group = group[:rows]
    teachers: list = []
    if ctx.actor.teacher_k:
        with phases("warmup_teacher"):
            ctx.engine.sleep()  # the trainer's forward gets the memory
            batch = rollouts.to_batch(group, ctx.encoder.pad_id, cfg.train.adv_estimator)
            teachers = ctx.actor.teachers(batch)
            ctx.engine.update_weights(ctx.actor.named_weights(), ctx.policy_version)
    with phases("warmup_gather"):
        mine = [(r.prompt_ids, list(r.completion.token_ids)) for r in group if contributes]
        pairs = [x for rank_pairs in dist.all_gather(mine) for x in rank_pairs]
        taught = gather_teachers(teachers if contributes else []) if ctx.actor.teacher_k \
            else [None] * len(pairs)
    with phases("warmup_train"):
        out.update(drafting.warm_model([(p, r, t) for (p, r), t in zip(pairs, taught)],
                                       cfg.spec.draft_warmup_updates))
    out.update(phases.as_metrics())
    return out


def describe(metrics: dict, updates: int) -> str:
    """One line for the console: what the warm-up trained on and what it reached."""
    seconds = sum(v for k, v in metrics.items() if k.startswith("time_warmup_"))
    return (f"draft model warmed up on {metrics['draft_warmup_responses']} responses, "
            f"{updates} updates: loss {metrics['draft_warmup_loss_before']:.3f} -> "
            f"{metrics['draft_warmup_loss_after']:.3f} in {seconds:.1f} s")


__all__ = ["WARMUP_STEP", "describe", "warm_up"]
