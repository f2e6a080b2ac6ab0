"""`rhymectl index build|stats RUN_DIR`: the drafter's persistent history index."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pipeline.errors import UsageError
from rhymectl.output import emit_json, log, out

index_app = typer.Typer(
    help="The history index: each prompt's last K epochs of responses, kept compact in "
         "RUN_DIR/index/ for the speculative drafter.\n\n"
         "Example: rhymectl index build runs/tiny && rhymectl index stats runs/tiny",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def register(app: typer.Typer) -> None:
    app.add_typer(index_app, name="index")


@index_app.command("build", help=(
    "Build RUN_DIR/index from RUN_DIR/history, or refresh it by reading only the history steps "
    "newer than it. It rebuilds from all steps when history was rolled back or rewritten (a "
    "resume) or K changed, and refuses an index built for another tokenizer or model config, "
    "or a corrupt one, unless --rebuild. K and the model default to the run's config.yaml "
    "(spec.history_epochs, model.path).\n\n"
    "Example: rhymectl index build runs/tiny --epochs 2 --json"))
def build(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="Run directory written by `rhymectl train`."),
    epochs: Optional[int] = typer.Option(None, "--epochs", min=1, help="K: epochs kept per prompt (default: spec.history_epochs)."),
    model: Optional[Path] = typer.Option(None, "--model", help="Model directory whose tokenizer made the ids (default: model.path)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Rebuild from all history steps, replacing any index."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from pipeline.history import index

    model_dir, k = _from_config(run_dir, model, epochs, need_epochs=True)
    stats = index.build(run_dir, model_dir, k, rebuild=rebuild)
    if stats.warning:
        log.print(f"warning: {stats.warning}", markup=False, soft_wrap=True)
    if json_out:
        emit_json(stats.as_dict())
        return
    how = "incremental" if stats.rebuilt is None else f"rebuilt: {stats.rebuilt}"
    _render(stats)
    out.print(f"  read {stats.steps_read} history steps ({how})", markup=False)


@index_app.command("stats", help=(
    "Verify RUN_DIR/index (checksum, schema, row count and, when config.yaml or --model names "
    "the model, its tokenizer and config fingerprint) and report what it holds: prompts, "
    "responses, tokens, memory, file size, K, last step and epochs, and whether it is current "
    "(no history step newer than it; stale_steps counts those that are).\n\n"
    "Example: rhymectl index stats runs/tiny --json"))
def stats(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="Run directory written by `rhymectl train`."),
    model: Optional[Path] = typer.Option(None, "--model", help="Model directory to verify against (default: model.path)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from pipeline.history import index

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory; pass a run directory written by "
                         f"`rhymectl train`")
    if not (run_dir / index.INDEX_DIR).exists():
        raise UsageError(f"{run_dir} has no history index; build it with "
                         f"`rhymectl index build {run_dir}`")
    model_dir, _ = _from_config(run_dir, model, None, need_epochs=False)
    loaded = index.load(run_dir, model_dir)
    if loaded is None:
        raise UsageError(f"{run_dir} has no history index; build it with "
                         f"`rhymectl index build {run_dir}`")
    s = loaded.stats()
    if json_out:
        emit_json({**s.as_dict(), "verified_against": None if model_dir is None else str(model_dir)})
        return
    _render(s)
    if s.current:
        out.print("  current", markup=False)
    else:
        out.print(f"  stale: {s.stale_reason}; refresh with `rhymectl index build {run_dir}`",
                  markup=False)
    if model_dir is None:
        log.print("fingerprint not verified: no model.path in config.yaml; pass --model DIR",
                  markup=False, soft_wrap=True)


def _from_config(run_dir: Path, model: Path | None, epochs: int | None, *,
                 need_epochs: bool) -> tuple[Path | None, int | None]:
    """--model / --epochs, else model.path / spec.history_epochs of RUN_DIR/config.yaml.

    The file is read and validated by the config loader; the two keys must be written in
    it (a default is not the run's model). For stats (need_epochs False) a missing
    config.yaml means: do not verify the fingerprint.
    """
    from pipeline.config import load_config
    from pipeline.config.load import read_yaml

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory; pass a run directory written by "
                         f"`rhymectl train`")
    if model is not None and (epochs is not None or not need_epochs):
        return model, epochs
    path = run_dir / "config.yaml"
    if not path.is_file():
        if not need_epochs:
            return None, None
        raise UsageError(f"{run_dir} is not a run directory (no config.yaml); pass one written "
                         f"by `rhymectl train`, or give --model DIR and --epochs K")
    tree = read_yaml(path)  # one-line UsageErrors for unreadable or non-mapping files
    cfg = load_config(path)  # every invalid key or value at once
    written = {section: set(tree[section]) if isinstance(tree.get(section), dict) else set()
               for section in ("model", "spec")}
    if model is None:
        if "path" in written["model"]:
            model = Path(cfg.model.path)
        elif need_epochs:
            raise UsageError(f"{path} has no model.path; pass --model DIR")
    if epochs is None and need_epochs:
        if "history_epochs" not in written["spec"]:
            raise UsageError(f"{path} has no spec.history_epochs; pass --epochs K")
        epochs = cfg.spec.history_epochs
    return model, epochs


def _render(s) -> None:
    kib = 1024
    out.print(f"{s.path}: {s.prompts} prompts, {s.responses} responses, {s.tokens} tokens; "
              f"memory {s.memory_bytes / kib:.1f} KiB, file {s.file_bytes / kib:.1f} KiB", markup=False)
    out.print(f"  K {s.history_epochs}, epochs {s.epochs}, last step {s.last_step}; fingerprint "
              f"tokenizer {s.fingerprint['tokenizer']}, model {s.fingerprint['model']}", markup=False)
