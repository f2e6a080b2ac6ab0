"""Where step metrics go besides `metrics.jsonl`: TensorBoard and Weights & Biases.

`run.loggers` names them: `jsonl` (always on, `pipeline.loop.metrics.MetricsLog`), `console`
(the live view), `tensorboard`, `wandb`. The last two are optional extras
(`pip install 'rhymectl[tensorboard]'`, `'rhymectl[wandb]'`): they are imported only when
chosen, and `check` (run by `--dry-run` and before every run) turns a missing package into
one line. Only rank 0 logs. Both write under the run directory:

    <run_dir>/tensorboard/   event files (`torch.utils.tensorboard.SummaryWriter`)
    <run_dir>/wandb/         W&B's files; with run.wandb_mode: offline nothing leaves the
                             machine (`wandb sync <run_dir>/wandb/offline-run-*` uploads later)

Scalars are the numeric values of each metrics record, tagged by their key, at x = step.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pipeline.errors import UsageError

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
# logger -> the module it needs, and the extra that installs it
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


def check(loggers) -> None:
    """UsageError (one line) when a chosen logger's package is not installed."""
    for name in loggers:
        if name in EXTRAS:
            module, extra = EXTRAS[name]
            if importlib.util.find_spec(module) is None:
                raise UsageError(f"run.loggers includes {name} but the {module!r} package is not "
                                 f"installed; pip install 'rhymectl[{extra}]' (or `pip install "
                                 f"{module}`), or remove {name} from run.loggers")


def scalars(record: dict) -> dict[str, float]:
    """The numeric metrics of a record (bools and the step itself excluded)."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardLogger:
    def __init__(self, run_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: after a resume, TensorBoard hides events past the checkpoint, as the
        # JSONL log is rolled back to it.
        self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR),
                                    purge_step=start_step + 1 if start_step else None)

    def log(self, record: dict) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, global_step=int(record["step"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, run_dir: Path, cfg, config_dict: dict, resume: bool):
        import wandb

        # The run id is the run directory's, so --resume continues the same W&B run.
        self.run = wandb.init(project=cfg.run.wandb_project, mode=cfg.run.wandb_mode,
                              dir=str(run_dir), name=run_dir.name, config=config_dict,
                              id=_wandb_id(run_dir), resume="allow" if resume else None)

    def log(self, record: dict) -> None:
        self.run.log(scalars(record), step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


def _wandb_id(run_dir: Path) -> str:
    import hashlib

    return hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]


class Loggers:
    """The chosen extra loggers of rank 0; `log` each finished step's record, `close` at end."""

    def __init__(self, items: list):
        self.items = items

    @classmethod
    def open(cls, cfg, run_dir: Path, start_step: int, resume: bool) -> "Loggers":
        from pipeline.config import to_dict

        check(cfg.run.loggers)
        items: list = []
        if "tensorboard" in cfg.run.loggers:
            items.append(TensorBoardLogger(run_dir, start_step))
        if "wandb" in cfg.run.loggers:
            (run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
            items.append(WandbLogger(run_dir, cfg, to_dict(cfg), resume))
        return cls(items)

    def log(self, record: dict) -> None:
        for item in self.items:
            item.log(record)

    def close(self) -> None:
        for item in self.items:
            item.close()
