"""What `rhymectl bench replay` reads of a run directory: its resolved config, its history
records and, to key them, its prompts' token ids encoded as the run encoded them (the
config's data set, chat template and tokenizer). Read only; nothing is written there."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.bench.replay import ReplayStep, steps_of
from pipeline.errors import UsageError

# what a replay may change: how drafts are made, and where the tokenizer is; the recorded
# responses fix everything else (data, sampling, model)
CHANGEABLE = ("spec.", "model.path=")


def load_run(run_dir: Path, overrides: Sequence[str]) -> tuple[object, list[ReplayStep]]:
    """The run's config (with `overrides`) and its recorded steps, oldest first."""
    from transformers import AutoTokenizer

    from pipeline.config import load_config
    from pipeline.history.store import HistoryStore, prompt_hash
    from pipeline.policy.checks import check_model_dir
    from pipeline.tasks.chat import PromptEncoder
    from pipeline.tasks.prompts import distinct, train_rows

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.yaml); give the run.dir "
                         "of a run `rhymectl train` wrote")
    fixed = [o for o in overrides if not o.startswith(CHANGEABLE)]
    if fixed:
        raise UsageError(f"{fixed[0]}: a replay drafts the run's recorded responses again, so "
                         "only spec.* keys and model.path can be changed")
    cfg = load_config(path, list(overrides))
    records = HistoryStore(run_dir, readonly=True).read_all()
    if not records:
        raise UsageError(f"{run_dir} holds no rollout history yet; train at least one step")
    check_model_dir(cfg.model.path)
    seen = {r.prompt_id for r in records}
    prompts = [p for p in distinct(train_rows(cfg.data)) if p.id in seen]
    encoder = PromptEncoder.from_config(cfg.data, AutoTokenizer.from_pretrained(cfg.model.path))
    ids = encoder.encode_many([p.text for p in prompts])
    return cfg, steps_of(records, {prompt_hash(x): list(x) for x in ids})


__all__ = ["CHANGEABLE", "load_run"]
