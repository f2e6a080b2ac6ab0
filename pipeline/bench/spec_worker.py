"""One method of `rhymectl bench spec`, in its own process (see `spec.run_isolated`).

    python -m pipeline.bench.spec_worker CONFIG RUN_DIR EPOCHS METHOD RESULT_JSON [key=value ...]

stdout carries one `spec.PROGRESS_LINE` per regenerated step and nothing else (anything
else that prints is sent to stderr); the result goes to RESULT_JSON.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from pipeline.atomic import write_json_atomic
from pipeline.bench.spec import PROGRESS_LINE, build_work, run_method, warmup_prompts
from pipeline.bench.spec_warmup import draft_warmup_work
from pipeline.bench.spec_plan import make_plan
from pipeline.config import load_config
from pipeline.process_exit import exit_now
from pipeline.tasks.chat import PromptEncoder


def main(argv: list[str]) -> None:
    from transformers import AutoTokenizer

    progress, sys.stdout = sys.stdout, sys.stderr

    def advance() -> None:
        progress.write(PROGRESS_LINE)
        progress.flush()

    config, run_dir, epochs, method, result_path, *overrides = argv
    plan = make_plan(load_config(Path(config), overrides), int(epochs), Path(run_dir))
    encoder = PromptEncoder.from_config(plan.cfg.data,
                                        AutoTokenizer.from_pretrained(plan.cfg.model.path))
    work = build_work(plan, encoder)
    result = run_method(plan, method, work, advance, warmup_prompts(plan, encoder),
                        draft_warmup_work(plan, encoder))
    write_json_atomic(result_path, dataclasses.asdict(result))


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now(0)
