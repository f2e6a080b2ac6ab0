"""The draft model's warm-up in `rhymectl bench spec`: the warm-up a fresh training run
gives its draft (`spec.draft_warmup`, `pipeline.loop.warmup`), given to a draft model's
engine before any history, its passes counted apart from the measured steps'."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.bench.spec_plan import Plan
from pipeline.critical_path import step_record
from pipeline.loop.step import sampling
from pipeline.tasks.chat import PromptEncoder
from pipeline.tasks.prompts import distinct, eval_prompts, train_rows


def draft_warmup_work(plan: Plan, encoder: PromptEncoder) -> tuple[list[tuple], bool]:
    """The generates whose responses a fresh training run's draft model warms up on
    (`spec.draft_warmup`, `pipeline.loop.warmup`) as (prompt ids, `Sampling`) pairs, and
    whether they are passes the run adds (`rollout`) or its evaluation's before step 1
    (`eval`), which it generates anyway; ([], False) without a warm-up."""
    from pipeline.loop.batches import warmup_batch
    from pipeline.loop.evaluate import eval_samplings
    from pipeline.loop.warmup import WARMUP_STEP

    cfg = plan.cfg
    if cfg.spec.draft_warmup == "rollout":
        ids = encoder.encode_many([p.text for p in warmup_batch(cfg, 1)])
        return [(ids, replace(sampling(cfg, WARMUP_STEP), logprobs=False))], True
    if cfg.spec.draft_warmup == "eval":
        trained = {p.id for p in distinct(train_rows(cfg.data))}
        ids = encoder.encode_many([p.text for p in eval_prompts(cfg.data, trained)])
        return [(ids, s) for s in eval_samplings(cfg) if s is not None], False
    return [], False


def warm_draft(plan: Plan, engine, method: str, work: list[tuple], extra: bool) -> dict:
    """The warm-up a fresh training run gives its draft model (`pipeline.loop.warmup`), on
    the engine's starting policy before any history: the same responses (`work`,
    `draft_warmup_work`), teacher (the starting policy) and updates. Its passes and
    critical passes where it adds a rollout (`extra`; 0 where it learns from the
    evaluation's), its responses and the warm-up's loss."""
    from pipeline.train.teacher import policy_teachers, teacher_k

    cfg = plan.cfg
    rollouts, passes, critical = [], 0, 0
    for prompts, params in work:
        out = engine.generate(list(prompts), params)
        rollouts += [(ids, list(c.token_ids)) for ids, group in zip(prompts, out.groups)
                     for c in group]
        record = step_record(out.stats.passes, out.groups)
        passes += record["passes"] if extra else 0
        critical += record["critical_passes"] if extra else 0
    if teacher_k(cfg, method):
        teachers = policy_teachers(Path(cfg.model.path), rollouts, cfg.spec.draft_distill)
        rollouts = [(p, r, t) for (p, r), t in zip(rollouts, teachers)]
    trained = engine.drafting.warm_model(rollouts, cfg.spec.draft_warmup_updates)
    return {"source": cfg.spec.draft_warmup, "responses": len(rollouts), "passes": passes,
            "critical_passes": critical, "loss_before": trained["draft_warmup_loss_before"],
            "loss_after": trained["draft_warmup_loss_after"]}


__all__ = ["draft_warmup_work", "warm_draft"]
