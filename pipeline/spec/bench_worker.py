"""One method of `rhymectl bench spec`, in its own process (see `bench.run_isolated`).

    python -m pipeline.spec.bench_worker CONFIG RUN_DIR EPOCHS METHOD RESULT_JSON [key=value ...]
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers import AutoTokenizer

    from pipeline.atomic import write_json_atomic
    from pipeline.config import load_config
    from pipeline.spec.bench import build_work, run_method, warmup_prompts
    from pipeline.spec.bench_plan import make_plan
    from rhymectl.output import log

    config, run_dir, epochs, method, result_path, *overrides = argv
    plan = make_plan(load_config(Path(config), overrides), int(epochs), Path(run_dir))
    tokenizer = AutoTokenizer.from_pretrained(plan.cfg.model.path)
    work = build_work(plan, tokenizer)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=log, transient=True) as progress:
        task = progress.add_task(f"bench spec: {method}", total=sum(len(ew.steps) for ew in work))
        result = run_method(plan, method, work, lambda: progress.advance(task),
                            warmup_prompts(plan, tokenizer))
    write_json_atomic(result_path, dataclasses.asdict(result))


if __name__ == "__main__":
    main(sys.argv[1:])
