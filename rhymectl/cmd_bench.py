"""`rhymectl bench ...`: side-by-side measurements against the baselines.

`bench sched` compares placement policies on one rollout step. Only the simulated path
(`--simulate`) exists so far; measuring real rollout workers comes with the scheduler's
integration into training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pipeline.config.schema import RolloutConfig, SchedConfig
from pipeline.errors import UsageError
from rhymectl.output import emit_json, log, out

DEFAULT_POLICIES = "static,histopipe,seer,oracle"

bench_app = typer.Typer(
    help="Side-by-side measurements against the baselines.\n\n"
         "Example: rhymectl bench sched runs/tiny --workers 64 --simulate",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


@bench_app.command("sched", help=(
    "Compare placement policies on one rollout step over W workers: makespan, its ideal "
    "bound (the larger of total work / W and the longest request decoded alone), "
    "makespan/ideal, bubble ratio (idle worker-seconds / worker-seconds) and the seconds "
    "spent finishing the last 10 % of requests, plus a PNG Gantt chart of worker timelines. "
    "The step is drawn from the lengths in RUN_DIR's history or a --trace file (CSV or "
    "JSONL, one row per request: group, length[, epoch]) so that every worker holds "
    "--requests-per-worker requests; predictions come from the epochs before it.\n\n"
    "Example: rhymectl bench sched runs/tiny --policies static,histopipe,seer,oracle "
    "--workers 64 --simulate --json\n\n"
    "Example: rhymectl bench sched --trace lengths.csv --workers 1024 --simulate "
    "--spec history+group"))
def sched(
    run_dir: Optional[Path] = typer.Argument(None, metavar="[RUN_DIR]", help="Run directory with history."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Length trace file (.csv or .jsonl) instead of RUN_DIR."),
    policies: str = typer.Option(DEFAULT_POLICIES, "--policies", help="Comma-separated policies."),
    workers: int = typer.Option(8, "--workers", min=1, help="Rollout workers W."),
    simulate: bool = typer.Option(False, "--simulate", help="Project the step with the simulator (required for now)."),
    spec: str = typer.Option("none", "--spec", help="Speculation to model: none or history+group."),
    capacity: int = typer.Option(RolloutConfig().max_num_seqs, "--capacity", min=1,
                                 help="Concurrent requests per worker (KV-cache capacity)."),
    requests_per_worker: int = typer.Option(SchedConfig().sim_requests_per_worker, "--requests-per-worker",
                                            min=1, help="Requests drawn per worker."),
    chunk_tokens: int = typer.Option(SchedConfig().chunk_tokens, "--chunk-tokens", min=1,
                                     help="Tokens per chunk (seer; histopipe's migration points)."),
    epoch: Optional[int] = typer.Option(None, "--epoch", help="Trace epoch to replay [the newest full one]."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draw."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Gantt PNG [RUN_DIR/report/bench-sched-wW.png, "
                                                             "or ./bench-sched-TRACE-wW.png]."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from pipeline.sched.bench import (BenchSetup, bench_json, check_spec, parse_policies, run_bench,
                                      write_gantt)
    from pipeline.sched.trace import read_trace, trace_from_history

    names = parse_policies(policies)
    check_spec(spec)
    if (run_dir is None) == (trace is None):
        raise UsageError("give a RUN_DIR or --trace FILE" if run_dir is None else
                         "give either RUN_DIR or --trace FILE, not both")
    if not simulate:
        raise UsageError("measuring real rollout workers is not implemented yet; pass --simulate "
                         "to project the step with the simulator")
    lengths = trace_from_history(run_dir) if trace is None else read_trace(trace)
    setup = BenchSetup(policies=names, workers=workers, spec=spec, capacity=capacity,
                       requests_per_worker=requests_per_worker, chunk_tokens=chunk_tokens,
                       epoch=epoch, seed=seed)
    results = run_bench(lengths, setup)
    if plot is None:
        plot = (run_dir / "report" / f"bench-sched-w{workers}.png" if trace is None
                else Path(f"bench-sched-{trace.stem}-w{workers}.png"))
    title = (f"{Path(lengths.source).name}: {workers} workers × {requests_per_worker} requests, "
             f"spec {spec}, simulated")
    plot_path = write_gantt(results, plot, title)
    if json_out:
        emit_json(bench_json(results, workers))
    else:
        _render(results, workers, title)
    log.print(f"Gantt chart: {plot_path}", markup=False, soft_wrap=True)


def _render(results, workers: int, title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    for column in ("policy", "makespan s", "ideal s", "× ideal", "bubbles", "last 10 % s", "moves"):
        table.add_column(column, justify="right", no_wrap=True)
    for name, r in results.items():
        table.add_row(name, f"{r.makespan_s:.3f}", f"{r.ideal_s:.3f}", f"{r.makespan_over_ideal:.3f}",
                      f"{r.bubble_ratio:.1%}", f"{r.tail_s:.3f}", str(r.migrations))
    out.print(table)
