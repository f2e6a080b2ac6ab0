"""A training run on one rank: setup → steps → cleanup.

Rank 0 owns the run directory (config, metrics, history, checkpoint commits) and holds its
lock (loop.lock) for the life of the run; every rank holds one vLLM engine and one
DeepSpeed engine over the same policy. What a step writes, in which order, and when it
counts as done: loop.commit.
"""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, ContextManager, Protocol

from pipeline import distributed as dist
from pipeline.config import Config
from pipeline.config.methods import method
from pipeline.errors import RuntimeFailure, UsageError
from pipeline.faults import fault
from pipeline.history import index
from pipeline.history.store import HistoryStore
from pipeline.loop import commit, rundir, shared_fs
from pipeline.loop.lock import RunLock, announce
from pipeline.loop.batches import PromptSource, warmup_batch
from pipeline.loop.context import Context
from pipeline.loop.evaluate import evaluate
from pipeline.loop.metrics import MetricsLog
from pipeline.loop.scheduled import ScheduledRollout
from pipeline.loop.step import rl_step
from pipeline.loop.tail_queue import TailQueue
from pipeline.loop.loggers import Loggers
from pipeline.loop.tp_groups import TPLayout
from pipeline.loop.warmup import describe, warm_up
from pipeline.rollout.engine import RolloutEngine
from pipeline.sched.registry import RolloutPlacement
from pipeline.tasks.chat import PromptEncoder
from pipeline.tasks.data import resolve_reward
from pipeline.tasks.prompts import eval_prompts, train_rows
from pipeline.train import checkpoint
from pipeline.train.actor import Actor

EVAL_FILE = "eval.jsonl"


class StepView(Protocol):
    """Shows finished steps (rank 0); the CLI's is `rhymectl.live.LiveView`."""

    def update(self, record: dict) -> None: ...

    def show_eval(self, record: dict) -> None: ...  # a held-out evaluation (eval_* keys)


# (total steps, steps already done) -> a context manager that yields a StepView
ViewFactory = Callable[[int, int], ContextManager[StepView]]


def run(cfg: Config, resume: bool, force: bool, view: ViewFactory | None = None) -> dict:
    rank, world = dist.init(timeout_min=cfg.run.dist_timeout_min)
    rundir.check_run_dir(cfg, resume, force)  # every rank, before rank 0 writes anything
    lock = take_lock(cfg, rank)
    try:
        shared_fs.check(Path(cfg.run.dir), lock)  # ranks on several nodes: one run.dir?
        rundir.check_run_dir(cfg, resume, force)  # again: a writer may have finished meanwhile
        state = commit.check_resume(Path(cfg.run.dir), world) if resume else None
        dist.barrier()
        dist.bind_cpu_threads()
        ctx = setup(cfg, rank, world, resume, force, state)
        train(ctx, view)
    except OSError as exc:
        line = commit.disk_error(exc, Path(cfg.run.dir))
        if line is None:
            raise
        raise RuntimeFailure(line) from exc
    finally:
        if lock is not None:
            lock.release()
    dist.barrier()
    return ctx.summary if rank == 0 else None


def take_lock(cfg: Config, rank: int) -> RunLock | None:
    """Rank 0 takes the run-directory lock; if it cannot, every rank stops with its line."""
    lock, refusal = None, None
    if rank == 0:
        try:
            lock = RunLock(cfg.run.dir, "rhymectl train").acquire()
            announce(lock)
        except UsageError as exc:
            refusal = str(exc)
    refusal = dist.all_gather(refusal)[0]
    if refusal:
        raise UsageError(refusal)
    return lock


def setup(cfg: Config, rank: int, world: int, resume: bool, force: bool,
          state: dict | None = None) -> Context:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the live view is the progress display

    if cfg.run.threads:
        import torch
        torch.set_num_threads(cfg.run.threads)
    run_dir = Path(cfg.run.dir)
    # what the input can refuse, before the run directory is written
    encoder = PromptEncoder.from_config(cfg.data, AutoTokenizer.from_pretrained(cfg.model.path))
    prompts = PromptSource(list(train_rows(cfg.data)), cfg.data.train_batch_size, cfg.data.seed,
                           cfg.data.shuffle)
    reward_fn = resolve_reward(cfg.data.reward or cfg.data.task, cfg.data.partial_credit)
    warmup = warmup_batch(cfg, world)
    if rank == 0:
        rundir.start(cfg, resume, force)
    dist.barrier()
    actor = Actor.build(cfg, world)
    engine = RolloutEngine.from_config(cfg)
    if engine.drafting:  # history is read from the run (the step's prompts), not held whole
        engine.drafting.use_run(run_dir)
    ctx = Context(cfg, rank, world, engine, actor, encoder, prompts, reward_fn, run_dir)
    ctx.tp = TPLayout(world, cfg.rollout.tensor_parallel_size)
    ctx.placement = RolloutPlacement.from_config(cfg.sched, ctx.tp.groups)
    if ctx.placement.coordinated:
        ctx.scheduler = ScheduledRollout(cfg, ctx.tp, ctx.placement)
    tail = cfg.sched.tail_batching
    if tail.overprovision > 0:
        ctx.tail = TailQueue(prompts, tail.overprovision, tail.max_waits, world)
    ctx.eval_set = eval_prompts(cfg.data, {p.id for p in prompts.prompts})
    ctx.warmup_set = warmup
    if rank == 0:
        ctx.history = HistoryStore(run_dir)
        ctx.metrics = MetricsLog(run_dir)
        ctx.evals = MetricsLog(run_dir, EVAL_FILE)
    if resume:
        restore(ctx, state)
    if rank == 0:
        ctx.loggers = Loggers.open(cfg, run_dir, ctx.start_step, resume)
    return ctx


def restore(ctx: Context, state: dict | None) -> None:
    """Load the checkpoint `state` describes (checked by loop.commit.check_resume); history,
    metrics and evaluation rows are cut back to what it covers. None: start over."""
    commit.restore(ctx, state)
    if state is not None:
        ckpt = ctx.run_dir / "checkpoints" / f"step-{state['step']:06d}"
        ctx.actor.load(ckpt)
        checkpoint.load_rng(ckpt, ctx.rank)
        ctx.start_step = state["step"]
        ctx.policy_version = state["policy_version"]
        ctx.engine.update_weights(ctx.actor.named_weights(), ctx.policy_version)
    restore_drafting(ctx, ckpt if state is not None else None)
    if ctx.scheduler is not None:
        ctx.scheduler.load_history(ctx.run_dir)
    if ctx.tail is not None and ctx.start_step:
        dist.barrier()  # rank 0 has cut the history back to the checkpoint
        trained = HistoryStore(ctx.run_dir, readonly=True).groups_by_step()
        ctx.tail.replay(trained.get(s, set()) for s in range(ctx.start_step))


def restore_drafting(ctx: Context, ckpt: Path | None) -> None:
    """The drafter's and the budget's state from checkpoint `ckpt` (the state it would have
    had uninterrupted; a checkpoint written without it, with a warning: drafts, and so
    samples at T > 0, then differ from the uninterrupted run's); then refresh the run's
    index (rank 0) to the rolled-back history, which the drafter reads prompt by prompt. A
    missing index means reading every step file, with a warning; a corrupt or foreign one
    stops the run (one line, exit 2) rather than being used."""
    cfg = ctx.cfg
    if ctx.engine.drafting is None:
        return
    if ckpt is not None:
        try:
            found = ctx.engine.drafting.load(ckpt, ctx.rank)
        except ValueError as exc:
            raise UsageError(f"--resume: {exc}; delete that checkpoint to resume from the one "
                             f"before it, or start over with --force") from None
        if not found and ctx.rank == 0:
            print(f"warning: {ckpt} holds no drafter state (written by an earlier version): "
                  f"the resumed run drafts, and so samples, otherwise than the uninterrupted "
                  f"one would have", file=sys.stderr)
    if not method(cfg.spec.method).history:
        return
    present = (ctx.run_dir / index.INDEX_DIR).is_dir()
    if ctx.rank == 0 and present:
        index.build(ctx.run_dir, cfg.model.path, cfg.spec.history_epochs)
    dist.barrier()
    if present:  # a corrupt or foreign index is refused here, before it is read
        index.check(ctx.run_dir, cfg.model.path)
    elif ctx.rank == 0:
        print(f"warning: {ctx.run_dir}/{index.INDEX_DIR} has no history index; the drafter "
              f"reads history from every step file instead, which is slower (build one with "
              f"`rhymectl index build {ctx.run_dir}`)", file=sys.stderr)


def train(ctx: Context, view_factory: ViewFactory | None = None) -> None:
    """The steps, each written in the order loop.commit sets out."""
    cfg = ctx.cfg
    total = cfg.train.total_steps
    started = time.time()
    last: dict = {}
    console_on = "console" in cfg.run.loggers
    show = view_factory if ctx.rank == 0 and view_factory is not None and console_on else None
    fresh = ctx.start_step == 0  # a resumed run's draft is warm: its checkpoint's
    evaluated = [] if fresh and cfg.spec.draft_warmup == "eval" else None
    first = run_eval(ctx, 0, evaluated) if fresh else {}
    if ctx.rank == 0 and first:
        ctx.evals.append(first)
    warm = warm_up(ctx, evaluated) if fresh else {}
    if warm and ctx.rank == 0:
        print(describe(warm, cfg.spec.draft_warmup_updates), file=sys.stderr, flush=True)
    with show(total, ctx.start_step) if show else nullcontext() as view:
        if view is not None and first:
            view.show_eval({"step": 0, **{f"eval_{k}": v for k, v in first.items()
                                          if k != "step" and not k.startswith("per_prompt_")}})
        for step in range(ctx.start_step, total):
            step_started = time.perf_counter()
            result = rl_step(ctx, step)
            result.metrics.update(warm)  # the first step's row carries the warm-up
            warm = {}
            if ctx.rank == 0:
                t0 = time.perf_counter()
                ctx.history.append(step, result.records)
                result.metrics["time_history_s"] = round(time.perf_counter() - t0, 4)
            every = cfg.run.eval_every
            row = {}
            if (every and (step + 1) % every == 0) or step + 1 == total:
                row = run_eval(ctx, step + 1)
                for key, value in row.items():
                    if key != "step" and not key.startswith("per_prompt_"):
                        result.metrics[f"eval_{key}"] = value
            result.metrics["time_step_s"] = round(time.perf_counter() - step_started, 4)
            if ctx.rank == 0:
                if row:
                    ctx.evals.append(row)
                ctx.metrics.append(result.metrics)
                ctx.loggers.log(result.metrics)
                fault("after_metrics_append")
            if (step + 1) % cfg.run.checkpoint_every == 0 or step + 1 == total:
                t0 = time.perf_counter()
                commit.commit_step(ctx, step + 1)  # the commit point of every step so far
                result.metrics["time_checkpoint_s"] = round(time.perf_counter() - t0, 4)
            if view is not None:
                view.update(result.metrics)
            last = result.metrics
    if ctx.loggers:
        ctx.loggers.close()
    ctx.summary = {"run_dir": str(ctx.run_dir), "steps": total, "last": last,
                   "seconds": round(time.time() - started, 1),
                   "eval": [{k: v for k, v in e.items() if not k.startswith("per_prompt_")}
                            for e in (ctx.evals.read() if ctx.evals else [])]}


def run_eval(ctx: Context, steps_done: int, keep: list | None = None) -> dict:
    """Held-out evaluation (greedy and mean@k): the eval.jsonl row rank 0 appends ({} without
    prompts), per-prompt lists included. keep: see `evaluate`."""
    if not ctx.eval_set:
        return {}
    result = evaluate(ctx, ctx.eval_set, keep)
    fault("mid_eval")
    return {"step": steps_done, **result}
