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
        "Example: rhymectl profile runs/tiny --json\n\n"
        "Example: rhymectl profile --trace dump.parquet --trace-columns "
        "group=prompt_id,length=response_length,epoch=step"))(profile)


def profile(
    run_dir: Optional[Path] = typer.Argument(None, metavar="[RUN_DIR]", help="Run directory written by "
                                                                          "`rhymectl train`."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="A length trace (.csv, .jsonl, .parquet) "
                                                               "instead of RUN_DIR, e.g. another system's dump."),
    trace_columns: Optional[str] = typer.Option(None, "--trace-columns", help="The trace's columns by role: "
                                                "group=COL,length=COL[,epoch=COL] or group=COL,text=COL."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer counting response texts."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG to write [RUN_DIR/report/profile.png, "
                                                             "or ./profile-TRACE.png]."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from pipeline.errors import UsageError
    from pipeline.report.profile import load_lengths, profile as build, write_profile_plot

    if (run_dir is None) == (trace is None):
        raise UsageError("give a RUN_DIR or --trace FILE" if run_dir is None else
                         "give either RUN_DIR or --trace FILE, not both")
    if trace is None:
        if trace_columns or tokenizer:
            raise UsageError("--trace-columns and --tokenizer describe a --trace FILE; give one")
        lengths = load_lengths(run_dir)
        default_plot = run_dir / "report" / "profile.png"
    else:
        from pipeline.sched.trace import read_trace
        from pipeline.sched.trace_import import parse_columns

        columns = parse_columns(trace_columns) if trace_columns else None
        lengths = read_trace(trace, columns, tokenizer).history(before_epoch=2 ** 62)
        run_dir, default_plot = trace, Path(f"profile-{trace.stem}.png")
    report = build(run_dir, lengths)
    plot_path = write_profile_plot(report, lengths, plot or default_plot)
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
    probe = report["sibling_probe"]
    rho = probe["spearman_first_longest"]
    out.print(f"  siblings: over {probe['groups']} groups the first finished (shortest) response "
              f"against the longest: Spearman {'-' if rho is None else f'{rho:.3f}'}, median "
              f"ratio {probe['median_first_over_longest']}")

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
