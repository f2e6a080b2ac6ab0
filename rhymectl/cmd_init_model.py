"""`rhymectl init-model`: build the tiny default policy (no download)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rhymectl.output import emit_json, log, out


def register(app: typer.Typer) -> None:
    app.command("init-model", help=(
        "Build the tiny default policy: char tokenizer, ~1M-parameter Llama, SFT warm-up.\n\n"
        "Cached: a second call with the same settings returns at once.\n\n"
        "Example: rhymectl init-model --task sort --out models/tiny-sort --seed 0"))(init_model)


def init_model(
    task: str = typer.Option("sort", help="Built-in task the SFT warm-up uses."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Model directory [models/tiny-TASK]."),
    seed: int = typer.Option(0, help="Seed: same seed, same model."),
    steps: Optional[int] = typer.Option(None, min=1, help="SFT steps [400]."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if cached."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from dataclasses import replace

    from pipeline.policy.bootstrap import InitOptions, check_target, init_model as build
    from pipeline.tasks.base import get_task
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    get_task(task)
    spec = InitOptions(task=task, seed=seed)
    if steps is not None:
        spec = replace(spec, sft=replace(spec.sft, steps=steps))
    target = out_dir or Path("models") / f"tiny-{task}"
    check_target(target, spec, force)  # before the progress bar: one line if refused
    with Progress(TextColumn("SFT warm-up"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn(),
                  console=log, transient=True) as progress:
        bar = progress.add_task("sft", total=spec.sft.steps, loss=float("nan"))

        def on_step(step: int, loss: float) -> None:
            progress.update(bar, completed=step + 1, loss=loss)

        manifest = build(target, spec, force=force, on_sft_step=on_step)
    manifest = {"path": str(target), **manifest}
    if json_out:
        emit_json(manifest)
        return
    sft = manifest["sft"]
    state = "cached, unchanged" if manifest["cached"] else f"built in {manifest['build_seconds']} s"
    out.print(f"[bold]{target}[/] ({state})")
    out.print(f"  parameters      {manifest['parameters']:,}")
    out.print(f"  SFT             {sft['steps']} steps, loss {sft['loss_curve'][0]:.3f} → "
              f"{sft['loss_curve'][-1]:.3f} (mean per tenth: {', '.join(f'{x:.2f}' for x in sft['loss_curve'])})")
    out.print(f"  held-out greedy accuracy  {manifest['heldout']['greedy_accuracy']:.1%} "
              f"on {manifest['heldout']['prompts']} prompts ({task})")
