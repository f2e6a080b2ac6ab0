"""A training run on one rank: setup → steps → cleanup.

Rank 0 owns the run directory (config, metrics, history, checkpoint commits); every rank
holds one vLLM engine and one DeepSpeed engine over the same policy.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, ContextManager, Protocol

from pipeline import distributed as dist
from pipeline.config import Config
from pipeline.config.methods import method
from pipeline.errors import UsageError
from pipeline.history import index
from pipeline.history.store import HistoryStore
from pipeline.loop import rundir
from pipeline.loop.batches import PromptSource
from pipeline.loop.context import Context
from pipeline.loop.evaluate import evaluate
from pipeline.loop.metrics import MetricsLog
from pipeline.loop.scheduled import ScheduledRollout
from pipeline.loop.step import rl_step
from pipeline.rollout.engine import RolloutEngine
from pipeline.tasks.data import resolve_reward
from pipeline.tasks.prompts import eval_prompts, train_rows
from pipeline.train import checkpoint
from pipeline.train.actor import Actor

EVAL_FILE = "eval.jsonl"


class StepView(Protocol):
    """Shows finished steps (rank 0); the CLI's is `rhymectl.live.LiveView`."""

    def update(self, record: dict) -> None: ...


# (total steps, steps already done) -> a context manager that yields a StepView
ViewFactory = Callable[[int, int], ContextManager[StepView]]


def run(cfg: Config, resume: bool, force: bool, view: ViewFactory | None = None) -> dict:
    rank, world = dist.init()
    rundir.check_run_dir(cfg, resume, force)  # every rank, before rank 0 writes anything
    dist.barrier()
    dist.bind_cpu_threads()
    ctx = setup(cfg, rank, world, resume, force)
    train(ctx, view)
    dist.barrier()
    return ctx.summary if rank == 0 else None


def setup(cfg: Config, rank: int, world: int, resume: bool, force: bool) -> Context:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the live view is the progress display

    if cfg.run.threads:
        import torch
        torch.set_num_threads(cfg.run.threads)
    run_dir = Path(cfg.run.dir)
    if rank == 0:
        rundir.start(cfg, resume, force)
    dist.barrier()
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    prompts = PromptSource(list(train_rows(cfg.data)), cfg.data.train_batch_size, cfg.data.seed,
                           cfg.data.shuffle)
    reward_fn = resolve_reward(cfg.data.reward or cfg.data.task, cfg.data.partial_credit)
    actor = Actor(cfg, world)
    engine = RolloutEngine.from_config(cfg)
    ctx = Context(cfg, rank, world, engine, actor, tokenizer, prompts, reward_fn, run_dir)
    ctx.scheduler = ScheduledRollout.maybe(cfg, world, run_dir)
    ctx.eval_set = eval_prompts(cfg.data, {p.id for p in prompts.prompts})
    if rank == 0:
        ctx.history = HistoryStore(run_dir)
        ctx.metrics = MetricsLog(run_dir)
        ctx.evals = MetricsLog(run_dir, EVAL_FILE)
    if resume:
        restore(ctx)
    return ctx


def restore(ctx: Context) -> None:
    """Load the last complete checkpoint and roll history and metrics back to it."""

    ckpt = checkpoint.latest(ctx.run_dir / "checkpoints")
    if ckpt is None:
        raise UsageError(f"--resume: {ctx.run_dir} has no complete checkpoint yet; start over "
                         f"with --force")
    state = checkpoint.read_state(ckpt)
    if state["world_size"] != ctx.world_size:
        raise UsageError(f"--resume: the checkpoint was written by {state['world_size']} ranks, "
                         f"this run has {ctx.world_size}; use --nproc {state['world_size']}")
    ctx.actor.load(ckpt)
    checkpoint.load_rng(ckpt, ctx.rank)
    ctx.start_step = state["step"]
    ctx.policy_version = state["policy_version"]
    ctx.engine.update_weights(ctx.actor.named_weights(), ctx.policy_version)
    if ctx.rank == 0:
        ctx.history.truncate_after(state["history_last_step"])
        ctx.metrics.truncate_after(state["step"])
        ctx.evals.truncate_after(state["step"])
    dist.barrier()
    restore_drafting(ctx)
    if ctx.scheduler is not None:
        ctx.scheduler.load_history(ctx.run_dir)


def restore_drafting(ctx: Context) -> None:
    """Refill the drafter's history window from the run's index, refreshed (rank 0) to the
    rolled-back history first. A missing index means live drafting only, with a warning; a
    corrupt or foreign one stops the run (one line, exit 2) rather than being used."""

    drafting = ctx.engine.drafting
    if drafting is None or not method(drafting.spec.method).history:
        return
    cfg = ctx.cfg
    present = (ctx.run_dir / index.INDEX_DIR).is_dir()
    if ctx.rank == 0 and present:
        index.build(ctx.run_dir, cfg.model.path, cfg.spec.history_epochs)
    dist.barrier()
    loaded = index.load(ctx.run_dir, cfg.model.path, cfg.spec.history_epochs) if present else None
    if loaded is None:
        if ctx.rank == 0:
            import sys
            print(f"warning: {ctx.run_dir}/{index.INDEX_DIR} has no history index; drafting from "
                  f"live siblings until history accumulates (build one with `rhymectl index build "
                  f"{ctx.run_dir}`)", file=sys.stderr)
        return
    drafting.load_history(loaded.responses(as_arrays=True))


def train(ctx: Context, view_factory: ViewFactory | None = None) -> None:
    cfg = ctx.cfg
    total = cfg.train.total_steps
    started = time.time()
    last: dict = {}
    show = view_factory if ctx.rank == 0 and view_factory is not None else None
    if ctx.start_step == 0:
        run_eval(ctx, 0)
    with show(total, ctx.start_step) if show else nullcontext() as view:
        for step in range(ctx.start_step, total):
            step_started = time.perf_counter()
            result = rl_step(ctx, step)
            if ctx.rank == 0:
                t0 = time.perf_counter()
                ctx.history.append(step, result.records)
                result.metrics["time_history_s"] = round(time.perf_counter() - t0, 4)
            if (step + 1) % cfg.run.checkpoint_every == 0 or step + 1 == total:
                t0 = time.perf_counter()
                save(ctx, step + 1)
                result.metrics["time_checkpoint_s"] = round(time.perf_counter() - t0, 4)
            result.metrics["time_step_s"] = round(time.perf_counter() - step_started, 4)
            every = cfg.run.eval_every
            if (every and (step + 1) % every == 0) or step + 1 == total:
                for key, value in run_eval(ctx, step + 1).items():
                    result.metrics[f"eval_{key}"] = value
            if ctx.rank == 0:
                ctx.metrics.append(result.metrics)
                if view is not None:
                    view.update(result.metrics)
            last = result.metrics
    ctx.summary = {"run_dir": str(ctx.run_dir), "steps": total, "last": last,
                   "seconds": round(time.time() - started, 1),
                   "eval": ctx.evals.read() if ctx.evals else []}


def run_eval(ctx: Context, steps_done: int) -> dict:
    """Greedy held-out evaluation; appended to eval.jsonl by rank 0."""
    if not ctx.eval_set:
        return {}
    result = evaluate(ctx, ctx.eval_set)
    if ctx.rank == 0:
        ctx.evals.append({"step": steps_done, **result})
    return result


def save(ctx: Context, steps_done: int) -> None:
    root = ctx.run_dir / "checkpoints"
    if ctx.rank == 0:
        checkpoint.prepare(root, steps_done)
    dist.barrier()
    tmp = checkpoint.tmp_dir(root, steps_done)
    ctx.actor.save(tmp, tmp / "policy" if ctx.rank == 0 else None)
    checkpoint.save_rng(tmp, ctx.rank)
    dist.barrier()
    if ctx.rank == 0:
        state = {"step": steps_done, "epoch": ctx.prompts.epoch_of(steps_done - 1),
                 "policy_version": ctx.policy_version, "history_last_step": steps_done - 1,
                 "world_size": ctx.world_size, "pid": os.getpid()}
        checkpoint.commit(root, steps_done, state, Path(ctx.cfg.model.path), ctx.cfg.run.keep_checkpoints)

        index.build(ctx.run_dir, ctx.cfg.model.path, ctx.cfg.spec.history_epochs)  # for restarts
    dist.barrier()
