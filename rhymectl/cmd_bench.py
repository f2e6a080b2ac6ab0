"""`rhymectl bench ...`: side-by-side measurements against the baselines.

The `bench` group and `bench sched` (placement policies on one rollout step, simulated or
on real rollout workers) live here; `bench spec` (every speculative method on the same
rollouts) in `cmd_bench_spec`, `bench drafter` in `cmd_bench_drafter`.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

import typer

from pipeline.config.schema import RolloutConfig, SchedConfig
from pipeline.errors import UsageError
from rhymectl.output import emit_json, log, out

DEFAULT_POLICIES = "static,histopipe,seer,oracle"

bench_app = typer.Typer(
    help="Side-by-side measurements against the baselines.\n\n"
         "Example: rhymectl bench spec sample_configs/tiny.yaml data.train_size=128 --epochs 3\n\n"
    "Example: rhymectl bench sched runs/tiny --workers 64 --simulate",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


from rhymectl import cmd_bench_spec  # noqa: E402,F401 — registers `bench spec` (listed first)


@bench_app.command("sched", help=(
    "Compare placement policies on one rollout step over W workers: makespan, its ideal "
    "bound under the same cost model and tau (the larger of total work / W and the longest "
    "requests' own critical path), makespan/ideal, makespan/oracle, bubble ratio (idle worker-seconds / worker-seconds) and the seconds "
    "spent finishing the last 10 % of requests, plus a PNG Gantt chart of worker timelines. "
    "The step is drawn from the lengths in RUN_DIR's history or a --trace file (CSV, "
    "JSONL or parquet, one row per request: group, length[, epoch]; other column names via "
    "--trace-columns, response texts counted with --tokenizer) so that every worker holds "
    "--requests-per-worker requests; predictions come from the epochs before it.\n\n"
    "Example: rhymectl bench sched runs/tiny --policies static,histopipe,seer,oracle "
    "--workers 64 --simulate --json\n\n"
    "Example: rhymectl bench sched --trace lengths.csv --workers 1024 --simulate "
    "--spec history+group"))
def sched(
    run_dir: Optional[Path] = typer.Argument(None, metavar="[RUN_DIR]", help="Run directory with history."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Length trace file (.csv, .jsonl or .parquet) "
                                                               "instead of RUN_DIR."),
    trace_columns: Optional[str] = typer.Option(None, "--trace-columns", help="The trace's columns by role: "
                                                "group=COL,length=COL[,epoch=COL] or group=COL,text=COL (with --tokenizer)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer (model dir) counting the "
                                                                      "trace's response texts."),
    policies: str = typer.Option(DEFAULT_POLICIES, "--policies", help="Comma-separated policies."),
    workers: int = typer.Option(8, "--workers", min=1, help="Rollout workers W."),
    simulate: bool = typer.Option(False, "--simulate", help="Project the step with the simulator instead of "
                                                            "running it on W real rollout workers (torchrun ranks)."),
    spec: str = typer.Option("none", "--spec", help="Speculation to model: none or history+group."),
    capacity: int = typer.Option(RolloutConfig().max_num_seqs, "--capacity", min=1,
                                 help="Concurrent requests per worker (KV-cache capacity)."),
    requests_per_worker: int = typer.Option(SchedConfig().sim_requests_per_worker, "--requests-per-worker",
                                            min=1, help="Requests drawn per worker."),
    chunk_tokens: int = typer.Option(SchedConfig().chunk_tokens, "--chunk-tokens", min=1,
                                     help="Tokens per chunk (seer; histopipe's migration points)."),
    epoch: Optional[int] = typer.Option(None, "--epoch", help="Trace epoch to replay [the newest full one]."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draw."),
    tier2_workers_frac: float = typer.Option(SchedConfig().tier2_workers_frac, "--tier2-workers-frac",
                                             min=0.0, max=0.999, help="tier2: share of workers reserved "
                                             "for the longest predicted groups."),
    tier2_max_seqs: int = typer.Option(SchedConfig().tier2_max_seqs, "--tier2-max-seqs", min=1,
                                       help="tier2: sequences per reserved worker."),
    migrate_gap: Optional[int] = typer.Option(None, "--migrate-gap", min=1,
                                              help="A continuation moves to a worker running at least "
                                                   "this many fewer requests (seer; histopipe's "
                                                   "overruns) [from the requests per worker]."),
    jobs: int = typer.Option(0, "--jobs", min=0, help="With --simulate: processes the policies run in "
                                                     "at once (0: one per CPU core) [0]."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Gantt PNG [RUN_DIR/report/bench-sched-wW.png, "
                                                             "or ./bench-sched-TRACE-wW.png]."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from pipeline.bench.figures import write_gantt
    from pipeline.bench.sched import BenchSetup, bench_json, run_bench
    from pipeline.sched.settings import PlacementSettings
    from rhymectl.parsing import check_spec, parse_policies
    from pipeline.sched.trace import read_trace, trace_from_history

    names = parse_policies(policies)
    check_spec(spec)
    if (run_dir is None) == (trace is None):
        raise UsageError("give a RUN_DIR or --trace FILE" if run_dir is None else
                         "give either RUN_DIR or --trace FILE, not both")
    if not simulate and trace is not None:
        raise UsageError("a --trace holds lengths, not prompts: replay it with --simulate, or "
                         "give a RUN_DIR to measure real rollout workers")
    if trace is None and (trace_columns or tokenizer):
        raise UsageError("--trace-columns and --tokenizer describe a --trace FILE; give one")
    columns = None
    if trace_columns:
        from pipeline.sched.trace_import import parse_columns

        columns = parse_columns(trace_columns)
    lengths = trace_from_history(run_dir) if trace is None else read_trace(trace, columns, tokenizer)
    settings = PlacementSettings(chunk_tokens=chunk_tokens, migrate_gap=migrate_gap,
                                 tier2_workers_frac=tier2_workers_frac,
                                 tier2_max_seqs=tier2_max_seqs)
    setup = BenchSetup(policies=names, workers=workers, spec=spec, capacity=capacity,
                       requests_per_worker=requests_per_worker, settings=settings, epoch=epoch,
                       seed=seed, jobs=jobs)
    if simulate:
        with _simulating(len(names)) as advance:
            results = run_bench(lengths, setup, on_done=advance)
    else:
        from pipeline.bench.sched import step_groups
        from pipeline.bench.sched_spawn import run_real

        step_groups(lengths, setup)  # bad input fails here, before any rank starts
        results, extra = run_real(run_dir, setup)
    if plot is None:
        plot = (run_dir / "report" / f"bench-sched-w{workers}.png" if trace is None
                else Path(f"bench-sched-{trace.stem}-w{workers}.png"))
    source = "simulated" if simulate else "real"
    title = (f"{Path(lengths.source).name}: {workers} workers × {requests_per_worker} requests, "
             f"spec {spec}, {source}")
    from contextlib import nullcontext

    from pipeline.loop.lock import held

    inside = trace is None and Path(plot).resolve().is_relative_to(Path(run_dir).resolve())
    with held(run_dir, "rhymectl bench sched") if inside else nullcontext():
        plot_path = write_gantt(results, plot, title)
    if json_out:
        report = bench_json(results, workers, source)
        if not simulate:
            for name, more in extra["policies"].items():
                report["policies"][name].update(more)
            report["cost_model"] = extra["cost_model"]
        emit_json(report)
    else:
        _render(results, workers, title)
    log.print(f"Gantt chart: {plot_path}", markup=False, soft_wrap=True)


@contextmanager
def _simulating(policies: int):
    """A transient progress bar on stderr, advanced as each policy's simulation ends. It
    redraws only then: no refresh thread, so the policies' processes can still be forked.
    Nothing is drawn when stderr is not a terminal (logs, pipes, tests)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    if not log.is_terminal:
        yield lambda name: None
        return

    with Progress(TextColumn("bench sched: simulating"), BarColumn(), MofNCompleteColumn(),
                  console=log, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("", total=policies)
        progress.refresh()

        def advance(name: str) -> None:
            progress.advance(task)
            progress.refresh()

        yield advance


def _render(results, workers: int, title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    # short headers: the table fits 80 columns (idle: bubble ratio; tail s: the last 10 %)
    for column in ("policy", "makespan", "ideal s", "× ideal", "× oracle", "idle", "tail s", "moves"):
        table.add_column(column, justify="right", no_wrap=True)
    def seconds(x: float) -> str:  # 4 significant digits: 0.1235, 12.35, 1858
        return f"{x:.4g}" if x < 1e4 else f"{x:.0f}"

    for name, r in results.items():
        over = "–" if r.over_oracle is None else f"{r.over_oracle:.3f}"
        table.add_row(name, seconds(r.makespan_s), seconds(r.ideal_s), f"{r.makespan_over_ideal:.3f}",
                      over, f"{r.bubble_ratio:.1%}", seconds(r.tail_s), str(r.migrations))
    out.print(table)


from rhymectl import cmd_bench_e2e  # noqa: E402,F401 — registers `bench e2e` on bench_app
from rhymectl import cmd_bench_drafter  # noqa: E402,F401 — registers `bench drafter`
from rhymectl import cmd_bench_replay  # noqa: E402,F401 — registers `bench replay`
