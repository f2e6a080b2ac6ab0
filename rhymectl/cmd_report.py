"""`rhymectl report RUN_DIR`: plots of a run from its metrics.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rhymectl.output import emit_json, log, out


def register(app: typer.Typer) -> None:
    app.command("report", help=(
        "Plot reward and accuracy, response lengths and seconds per phase of the run in "
        "RUN_DIR (from its metrics.jsonl) as PNG files, by default in RUN_DIR/report/.\n\n"
        "Example: rhymectl report runs/tiny --out /tmp/tiny-report --json"))(report)


def report(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="Run directory written by `rhymectl train`."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Folder for the PNGs [RUN_DIR/report]."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from pipeline.loop.metrics import format_line
    from pipeline.report.plots import load_metrics, write_report

    records = load_metrics(run_dir)
    paths = write_report(run_dir, out_dir, records=records)
    if json_out:
        emit_json({"run_dir": str(run_dir), "plots": [str(p) for p in paths],
                   "steps": len(records), "last": records[-1]})
        return
    for path in paths:
        out.print(str(path))
    log.print(f"{len(records)} steps; last: {format_line(records[-1])}", markup=False, soft_wrap=True)
