"""What `rhymectl bench spec` measures: the methods, the training run that provides the
per-epoch policies and history, and the work regenerated from it.

The bench trains E epochs once (or reuses a run directory that holds them), keeping a
policy checkpoint at every epoch boundary. The work of epoch e >= 1 is that epoch's
training batches (same prompts, same groups, same per-step seeds), regenerated from the
checkpoint taken when epoch e began; the history a method may draft from is the epochs
before e, exactly what the training run had seen at that point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.config import Config, load_config
from pipeline.errors import UsageError
from pipeline.history.store import HistoryStore
from pipeline.loop.batches import PromptSource
from pipeline.loop.launch import run_subprocess
from pipeline.loop.rundir import config_fingerprint
from pipeline.tasks.prompts import train_rows


@dataclass(frozen=True)
class Plan:
    """The training run behind the bench."""

    cfg: Config
    run_dir: Path
    epochs: int
    steps_per_epoch: int

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def train_overrides(self) -> list[str]:
        """Keys a run may change on resume (they do not alter what is learned)."""
        s = self.steps_per_epoch
        return [f"train.total_steps={self.total_steps}", f"run.checkpoint_every={s}",
                f"run.keep_checkpoints={self.epochs + 1}", "run.eval_every=0",
                f"run.dir={self.run_dir}"]

    def checkpoint(self, epoch: int) -> Path:
        """The policy at the start of `epoch` (epoch >= 1)."""
        return self.run_dir / "checkpoints" / f"step-{epoch * self.steps_per_epoch:06d}" / "policy"


def make_plan(cfg: Config, epochs: int, run_dir: Path | None) -> Plan:
    if epochs < 2:
        raise UsageError(f"--epochs {epochs}: need at least 2 (epoch 0 builds the history the "
                         f"later epochs draft from)")
    source = PromptSource(list(train_rows(cfg.data)), cfg.data.train_batch_size, cfg.data.seed,
                          cfg.data.shuffle)
    run_dir = Path(run_dir) if run_dir is not None else Path(f"{cfg.run.dir}-bench-spec")
    return Plan(cfg, run_dir, epochs, source.steps_per_epoch)


def missing_epochs(plan: Plan) -> list[int]:
    """Epochs >= 1 whose starting checkpoint or history is not in the run directory yet."""
    steps = set(HistoryStore(plan.run_dir, readonly=True).steps())
    missing = []
    for e in range(1, plan.epochs):
        span = range(e * plan.steps_per_epoch, (e + 1) * plan.steps_per_epoch)
        if not (plan.checkpoint(e) / "config.json").is_file() or not steps.issuperset(span):
            missing.append(e)
    return missing


def ensure_trained(plan: Plan, config_path: Path, overrides: list[str]) -> bool:
    """Train (or finish training) the bench's run; False when it was already complete.

    A run directory holding a different run (another config) is refused, not overwritten.
    """
    if not missing_epochs(plan):
        _check_same_run(plan)
        return False
    resume = force = False
    if (plan.run_dir / "run.json").is_file():
        _check_same_run(plan)
        # the same run: continue it, or restart it if it stopped before its first checkpoint
        resume = _has_checkpoint(plan)
        force = not resume
    elif plan.run_dir.is_dir() and any(plan.run_dir.iterdir()):
        raise UsageError(f"--run-dir {plan.run_dir} is not empty and holds no rhymectl run; "
                         f"choose another directory")
    run_subprocess(config_path, [*overrides, *plan.train_overrides()], resume, force)
    return True


def _has_checkpoint(plan: Plan) -> bool:
    return any((p / "state.json").is_file() for p in (plan.run_dir / "checkpoints").glob("step-*"))


def _check_same_run(plan: Plan) -> None:
    try:
        old = json.loads((plan.run_dir / "run.json").read_text())
    except (OSError, ValueError):
        raise UsageError(f"--run-dir {plan.run_dir} holds no readable run.json; choose another "
                         f"directory") from None
    fingerprint = config_fingerprint(plan.cfg)
    if old.get("config") != fingerprint and not _same_but_spec(plan, fingerprint):
        raise UsageError(f"--run-dir {plan.run_dir} holds a run with another config (fingerprint "
                         f"{old.get('config')}, this one {fingerprint}); pass "
                         f"the same CONFIG and overrides, or another --run-dir")


def _same_but_spec(plan: Plan, fingerprint: str) -> bool:
    """True when the run differs from the bench's config only in `spec`: speculation never
    changes what is learned, and the bench measures every method with the `spec` settings
    it is given, so a run trained with another budget or draft cap still serves."""
    try:
        run_cfg = load_config(plan.run_dir / "config.yaml")
    except (OSError, UsageError):  # unreadable, not YAML, or invalid (ConfigError)
        return False
    return config_fingerprint(replace(run_cfg, spec=plan.cfg.spec)) == fingerprint


__all__ = ["Plan", "ensure_trained", "make_plan", "missing_epochs"]
