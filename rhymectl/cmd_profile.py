"""`rhymectl profile RUN_DIR`: response lengths, rank stability and predictions from history."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rhymectl.output import emit_json, log, out

BAR_WIDTH = 40


def register(app: typer.Typer) -> None:
    app.command("profile", help=(
        "Profile the response lengths in RUN_DIR's history: their distribution per prompt, how "
        "stable each prompt's length rank is between adjacent epochs (Spearman; share of "
        "prompts whose rank moves by more than 10 %), the predicted length per prompt and the "
        "predictor's error on the following epoch. Writes a PNG, by default "
        "RUN_DIR/report/profile.png.\n\n"
        "Example: rhymectl profile runs/tiny --json"))(profile)


def profile(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="Run directory written by `rhymectl train`."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG to write [RUN_DIR/report/profile.png]."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from pipeline.report.profile import load_lengths, profile as build, write_profile_plot

    lengths = load_lengths(run_dir)
    report = build(run_dir, lengths)
    plot_path = write_profile_plot(report, lengths, plot or run_dir / "report" / "profile.png")
    if json_out:
        emit_json({**report, "plot": str(plot_path)})
        return
    _render(report)
    log.print(f"plot: {plot_path}", markup=False, soft_wrap=True)


def _render(report: dict) -> None:
    from rich.table import Table

    s = report["length"]
    out.print(f"[bold]{report['run_dir']}[/]: {report['responses']} responses to "
              f"{report['prompts']} prompts over epochs {report['epochs']}")
    out.print(f"  length mean {s['mean']}, p50 {s['p50']}, p90 {s['p90']}, p99 {s['p99']}, "
              f"max {s['max']} (p99/p50 {s['p99_over_p50']})")
    counts, edges = report["histogram"]["counts"], report["histogram"]["edges"]
    top = max(counts) or 1
    hist = Table(title="response length (tokens)", box=None, pad_edge=False)
    for column, justify in (("tokens", "right"), ("responses", "right"), ("", "left")):
        hist.add_column(column, justify=justify)
    for count, lo, hi in zip(counts, edges, edges[1:]):
        hist.add_row(f"{lo:g}–{hi - 1:g}", str(count), "█" * round(BAR_WIDTH * count / top))
    out.print(hist)

    ranks = Table(title="rank stability between adjacent epochs")
    for column in ("epochs", "prompts", "Spearman", "rank moved >10 %"):
        ranks.add_column(column, justify="right", no_wrap=True)
    for r in report["rank_stability"]:
        moved = "-" if r["moved_over_10pct"] is None else f"{r['moved_over_10pct']:.1%}"
        ranks.add_row(f"{r['epochs'][0]}→{r['epochs'][1]}", str(r["prompts"]),
                      "-" if r["spearman"] is None else f"{r['spearman']:.3f}", moved)
    if not report["rank_stability"]:
        ranks.add_row("one epoch recorded", "", "", "")
    out.print(ranks)

    pred = report["predictor"]
    errors = Table(title=f"predictor on the next epoch (last {pred['last_epochs']} epochs, decay "
                         f"{pred['decay']}, fallback {pred['fallback']} tokens)",
                   caption="kn: prompts with history; fb: the fallback for every prompt")
    columns = {"epoch": "{}", "prompts": "{}", "known": "{}", "mae": "{:.2f}", "mae_known": "{:.2f}",
               "mape_known": "{:.1%}", "spearman_known": "{:.3f}", "mae_fallback_only": "{:.2f}"}
    for column in ("epoch", "prompts", "known", "MAE", "MAE kn", "MAPE kn", "ρ kn", "MAE fb"):
        errors.add_column(column, justify="right", no_wrap=True)
    for e in pred["next_epoch_errors"]:
        errors.add_row(*("-" if e[k] is None else fmt.format(e[k]) for k, fmt in columns.items()))
    out.print(errors)

    longest = Table(title="longest predicted prompts")
    for column in ("prompt", "responses", "mean", "max", "predicted"):
        longest.add_column(column, justify="right")
    for pid, p in list(report["per_prompt"].items())[:10]:
        longest.add_row(pid, str(p["responses"]), str(p["mean"]), str(p["max"]), str(p["predicted"]))
    out.print(longest)
