"""The commit protocol: when a step counts as done, and what a resume keeps.

One RL step writes, on rank 0 and in this order (`pipeline.loop.run.train`):

    1. history/step-S.parquet     (atomic rename)
    2. eval.jsonl row             (when an evaluation is due; fsynced line)
    3. metrics.jsonl row          (fsynced line)
    4. index/ refresh             (atomic renames)            } on checkpoint steps
    5. checkpoints/step-N/        (every rank's shards, then  } only: commit_step()
       state.json, then one rename: THE COMMIT POINT)         }

A step is done when, and only when, the checkpoint that covers it has been renamed into
place. Everything written after the last commit is provisional: a crash there loses
nothing, because a resume cuts it away and redoes those steps from the checkpoint (the
per-step seeds make them the same steps). Since 1-4 come before 5, a committed checkpoint
never lacks its step's history, metrics or evaluation rows.

`state.json` records what the checkpoint covers (`covers`):
    history_steps   steps 0..history_steps-1 have a step file; history_rows rows in all
    metrics, eval   {"rows", "bytes", "sha256"} of the file's first `bytes` bytes
    files           every file of the checkpoint with its size (the DeepSpeed shards too)

`restore` (on --resume) checks, then repairs:
    - the checkpoint: every listed file present with its size, else exit 2 naming the
      missing file (delete that checkpoint to fall back to the one before);
    - history: every covered step file present, its parquet footer readable and the row
      count as recorded, else exit 2; newer step files are deleted;
    - metrics and eval: the covered prefix must hash as recorded (a damaged line in it, or
      a file from another run, is exit 2); whatever follows, torn or garbled lines
      included, is cut off;
    - the index: rebuilt from the kept history by its own rules (history.index).
With no checkpoint yet, --resume starts the run over: step 0, all provisional files cut.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from pipeline.errors import UsageError
from pipeline.faults import fault
from pipeline import distributed as dist
from pipeline.train import checkpoint

DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
               errno.EROFS: "read-only filesystem"}


def commit_step(ctx, steps_done: int) -> None:
    """Steps 4-5 of the protocol, on every rank (rank 0 writes all but the shards)."""
    from pipeline.history import index

    cfg, root = ctx.cfg, ctx.run_dir / "checkpoints"
    if ctx.rank == 0:
        index.build(ctx.run_dir, cfg.model.path, cfg.spec.history_epochs)
        checkpoint.prepare(root, steps_done)
    dist.barrier()
    tmp = checkpoint.tmp_dir(root, steps_done)
    ctx.actor.save(tmp, tmp / "policy" if ctx.rank == 0 else None)
    checkpoint.save_rng(tmp, ctx.rank)
    if ctx.engine.drafting:  # what decides the next drafts: a resume drafts the same
        ctx.engine.drafting.save(tmp, ctx.rank)
    dist.barrier()
    if ctx.rank == 0:
        fault("mid_checkpoint_write", tmp / "state.json")
        state = {"step": steps_done, "epoch": ctx.prompts.epoch_of(steps_done - 1),
                 "policy_version": ctx.policy_version, "history_last_step": steps_done - 1,
                 "world_size": ctx.world_size, "pid": os.getpid(),
                 "covers": {"history_steps": steps_done,
                            "history_rows": sum(map(ctx.history.rows, ctx.history.steps())),
                            "metrics": ctx.metrics.coverage(), "eval": ctx.evals.coverage()}}
        checkpoint.commit(root, steps_done, state, Path(cfg.model.path),
                          cfg.run.keep_checkpoints)
        fault("after_checkpoint_commit")
    dist.barrier()


def check_resume(run_dir: Path, world_size: int) -> dict | None:
    """Before anything is loaded or written (every rank, read-only): the last checkpoint's
    state, or None when there is none yet; UsageError (exit 2) on any damage above."""
    from pipeline.history.store import HistoryStore
    from pipeline.loop.metrics import MetricsLog

    ckpt = checkpoint.latest(run_dir / "checkpoints")
    if ckpt is None:
        return None
    state = checkpoint.read_state(ckpt)
    damaged = checkpoint.verify(ckpt, state)
    if damaged:
        raise UsageError(f"--resume: checkpoint {ckpt} is damaged ({damaged}); delete that "
                         f"folder to resume from the checkpoint before it, or start over with "
                         f"--force")
    if state["world_size"] != world_size:
        raise UsageError(f"--resume: the checkpoint was written by {state['world_size']} ranks, "
                         f"this run has {world_size}; use --nproc {state['world_size']}")
    covers = state.get("covers")
    if covers is not None:
        check_history(HistoryStore(run_dir, readonly=True), covers, ckpt)
        MetricsLog(run_dir).check(covers["metrics"], ckpt)
        MetricsLog(run_dir, "eval.jsonl").check(covers["eval"], ckpt)
    return state


def restore(ctx, state: dict | None) -> None:
    """Rank 0 cuts history, metrics and eval rows back to what `state`'s checkpoint
    covers (everything, when there is no checkpoint: the run starts over)."""
    if ctx.rank == 0:
        if state is None:
            ctx.history.truncate_after(None)
            ctx.metrics.cut({"rows": 0, "bytes": 0})
            ctx.evals.cut({"rows": 0, "bytes": 0})
        elif "covers" not in state:  # written before state.json recorded its coverage
            ctx.history.truncate_after(state["history_last_step"])
            ctx.metrics.truncate_after(state["step"])
            ctx.evals.truncate_after(state["step"])
        else:
            covers = state["covers"]
            ctx.history.truncate_after(covers["history_steps"] - 1)
            ctx.metrics.cut(covers["metrics"])
            ctx.evals.cut(covers["eval"])
    dist.barrier()


def check_history(store, covers: dict, ckpt: Path) -> None:
    """Every step file the checkpoint covers is there and readable, rows as recorded."""
    have = set(store.steps())
    missing = [s for s in range(covers["history_steps"]) if s not in have]
    if missing:
        raise UsageError(f"--resume: history step file {store.path(missing[0])} is missing but "
                         f"checkpoint {ckpt.name} covers it; restore the file, or start over "
                         f"with --force")
    rows = 0
    for step in range(covers["history_steps"]):  # parquet footers only
        try:
            rows += store.rows(step)
        except UsageError as exc:  # its "roll back with --resume" advice does not apply here
            reason = str(exc.__cause__ or "unreadable").splitlines()[0]
            raise UsageError(f"--resume: history file {store.path(step)} is corrupt or truncated "
                             f"({reason}) but checkpoint {ckpt.name} covers it; restore the "
                             f"file, or start over with --force") from None
    if rows != covers["history_rows"]:
        raise UsageError(f"--resume: history holds {rows} rows in steps 0..{covers['history_steps'] - 1}, "
                         f"checkpoint {ckpt.name} recorded {covers['history_rows']}; the history "
                         f"was changed after it was written: restore it, or start over with --force")


def disk_error(exc: OSError, run_dir: Path) -> str | None:
    """One line for a full disk or an unwritable path, else None (not a disk problem)."""
    code = getattr(exc, "errno", None)
    what = DISK_ERRNOS.get(code)
    if what is None and "No space left" in str(exc):
        what = "no space left on device"
    if what is None:
        return None
    where = exc.filename or run_dir
    last = checkpoint.latest(run_dir / "checkpoints")
    kept = f"the last checkpoint ({last.name}) and the history it covers are" if last else \
        "nothing was committed yet, nothing is"
    return (f"cannot write {where}: {what}; {kept} intact: free space or fix permissions, "
            f"then rerun with --resume")
