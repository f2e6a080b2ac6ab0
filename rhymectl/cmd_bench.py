"""`rhymectl bench ...`: side-by-side measurements against the baselines.

`bench spec` regenerates the same epochs' rollouts with every speculative method.
`bench sched` compares placement policies on one rollout step. Only the simulated path
(`--simulate`) exists so far; measuring real rollout workers comes with the scheduler's
integration into training.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

import typer

from pipeline.config.methods import METHODS
from pipeline.config.schema import RolloutConfig, SchedConfig
from pipeline.errors import UsageError
from rhymectl.output import emit_json, log, out

DEFAULT_POLICIES = "static,histopipe,seer,oracle"
DEFAULT_METHODS = ",".join(METHODS)

bench_app = typer.Typer(
    help="Side-by-side measurements against the baselines.\n\n"
         "Example: rhymectl bench spec sample_configs/tiny.yaml data.train_size=128 --epochs 3\n\n"
    "Example: rhymectl bench sched runs/tiny --workers 64 --simulate",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


@bench_app.command("spec", help=(
    "Regenerate the same rollouts with every speculative method and compare: tau (tokens per "
    "target forward pass), acceptance rate, target passes, scheduled tokens, rollout seconds, "
    "tokens per second, speedup over none, floor_s (the generated tokens at the measured cost "
    "per scheduled token: no per-pass overhead, no rejected drafts) and, at temperature 0, "
    "whether responses are token-identical to none's; per step, the critical path in target "
    "passes (passes per step, passes until the last request finished, passes in the tail "
    "where fewer than a quarter of the step's requests run, tau of the last request and in "
    "the tail) and an estimate of the rollout's time on an H100 for a 7B policy from those "
    "passes (a roofline model from published peak figures, not a measurement). Trains "
    "--epochs epochs of CONFIG once "
    "(into --run-dir, reused when it already holds them), checkpointing the policy at each "
    "epoch start; each later epoch's batches are then regenerated from that epoch's "
    "checkpoint, drafting from the epochs before it. `suffix` is vLLM's own method with its "
    "global cache fed the same earlier responses. `none` is always measured (the reference). "
    "Writes a PNG of tau and speedup, by default RUN_DIR/report/bench-spec.png, and one of "
    "running requests by pass on one step for none, suffix and history+group "
    "(bench-spec-running.png beside it).\n\n"
    "Example: rhymectl bench spec sample_configs/tiny.yaml data.train_size=128 --epochs 3 --json\n\n"
    "Example: rhymectl bench spec sample_configs/tiny.yaml rollout.temperature=0 "
    "--methods none,suffix,history+group --epochs 2"))
def spec(
    config: Path = typer.Argument(..., help="YAML config (see sample_configs/)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides, e.g. data.train_size=128"),
    methods: str = typer.Option(DEFAULT_METHODS, "--methods", help="Comma-separated methods."),
    epochs: int = typer.Option(3, "--epochs", help="Epochs to train; epochs 1 .. E-1 are measured."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Training run to create or reuse "
                                                                   "[run.dir + '-bench-spec']."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG [RUN_DIR/report/bench-spec.png]."),
    repeats: int = typer.Option(1, "--repeats", help="Run every method R times, interleaved, "
                                "the order rotating (A B C, B C A, ...); report medians and "
                                "min-max."),
    ceiling: bool = typer.Option(False, "--ceiling", help="Also count the critical path of a "
                                 "drafter that always drafted the policy's own most likely "
                                 "tokens (the oracle), from none's responses and one forward "
                                 "of each checkpoint."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from rhymectl.parsing import parse_methods

    names = parse_methods(methods)  # before the heavy imports: a typo fails at once
    from pipeline.bench.spec_plan import ensure_trained, make_plan
    from pipeline.config import load_config
    from pipeline.loop.preflight import preflight

    if repeats < 1:
        raise UsageError(f"--repeats {repeats}: need at least 1")
    extra = list(overrides or [])
    cfg = load_config(config, extra)
    preflight(cfg, world_size=1)
    plan = make_plan(cfg, epochs, run_dir)
    if ensure_trained(plan, config, extra):
        log.print(f"trained {plan.total_steps} steps into {plan.run_dir}", markup=False)
    else:
        log.print(f"reusing the trained epochs in {plan.run_dir}", markup=False)
    result, plot_path = _measure(plan, names, config, extra, plot, repeats, ceiling)
    if json_out:
        emit_json({**result, "plot": str(plot_path)})
    else:
        _render_spec(result)
    log.print(f"plot: {plot_path}", markup=False, soft_wrap=True)
    if result.get("running_plot"):
        log.print(f"running requests by pass: {result['running_plot']}", markup=False,
                  soft_wrap=True)


def _measure(plan, names, config, overrides, plot, repeats=1, ceiling=False):
    from pipeline.bench.figures import write_plot, write_running_plot
    from pipeline.bench.spec import (GPU_MODEL, build_work, figure_step, run_isolated, summarize,
                                     workload)
    from pipeline.bench.spec_repeats import aggregate, run_order
    from pipeline.drafting.calibration import merge_tables

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    steps = (plan.epochs - 1) * plan.steps_per_epoch  # epochs 1 .. E-1 are regenerated
    runs = []  # one {method: MethodResult} per repeat, methods interleaved
    for rep in range(repeats):
        results = {}
        for name in run_order(names, rep):
            with Progress(*columns, console=log, transient=True) as progress:
                task = progress.add_task(f"bench spec: {name} [{rep + 1}/{repeats}]", total=steps)
                results[name] = r = run_isolated(config, overrides, plan, name,
                                                 lambda: progress.advance(task))
            log.print(f"[{rep + 1}/{repeats}] {name}: {r.requests} responses, {r.generated} "
                      f"tokens in {r.rollout_s:.2f} s", markup=False)
        runs.append({name: results[name] for name in names})
    from transformers import AutoTokenizer

    from pipeline.tasks.chat import PromptEncoder

    encoder = PromptEncoder.from_config(plan.cfg.data,
                                        AutoTokenizer.from_pretrained(plan.cfg.model.path))
    work = build_work(plan, encoder)
    temperature = plan.cfg.rollout.temperature
    summary = aggregate([summarize(results, temperature) for results in runs])
    for name in names:
        states = [rs[name].calibration for rs in runs if rs[name].calibration]
        if states:
            summary[name]["calibration"] = merge_tables(states)
    load = {**workload(plan, work, runs[0]), "repeats": repeats}
    title = (f"{load['task']}: epochs {load['epochs_measured']} × {load['steps_per_epoch']} steps × "
             f"{load['sequences_per_step']} sequences, T={load['temperature']}")
    from pipeline.loop.lock import held

    plot_path = Path(plot or plan.run_dir / "report" / "bench-spec.png")
    index, shown = figure_step(runs[0])
    running_path = plot_path.with_name(f"{plot_path.stem}-running.png") if shown else None
    with held(plan.run_dir, "rhymectl bench spec"):  # writes into the run directory
        write_plot(summary, plot_path, title)
        if shown:
            step = [sw.step for ew in work for sw in ew.steps][index]
            write_running_plot(
                shown, running_path,
                f"{load['task']}: step {step + 1} (the median critical path under none), "
                f"{load['sequences_per_step']} sequences, T={load['temperature']}",
                GPU_MODEL.ridge_tokens, f"{GPU_MODEL.name}: compute-bound above "
                f"{GPU_MODEL.ridge_tokens:.0f} tokens")
    result = {"methods": summary, "workload": load, "gpu_model": GPU_MODEL.as_dict()}
    if ceiling:
        from pipeline.bench.spec_ceiling import oracle_ceiling

        log.print("ceiling: marking none's tokens with each checkpoint's argmax", markup=False)
        result["ceiling"] = oracle_ceiling(work, runs[0]["none"], plan.cfg.rollout.n,
                                           summary.get("suffix"))
    if running_path is not None:
        result["running_plot"] = str(running_path)
    return result, plot_path


def _render_spec(result: dict) -> None:
    from rich.table import Table

    w = result["workload"]
    table = Table(title=f"{w['task']}: epochs {w['epochs_measured']}, {w['requests']} requests, "
                        f"{w['sequences_per_step']} sequences per step, T={w['temperature']}")
    if w.get("repeats", 1) > 1:
        table.caption = f"medians of {w['repeats']} interleaved repeats (min–max)"
    columns = ("method", "tau", "accept", "passes", "sched tokens", "rollout s", "tok/s",
               "speedup", "vs suffix", "floor s", "drafter", "identical")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)

    def spread(m, key, fmt):
        if m.get(key) is None:
            return "–"
        text = fmt.format(m[key])
        if m.get("repeats", 1) > 1 and f"{key}_min" in m:
            text += f" ({fmt.format(m[key + '_min'])}–{fmt.format(m[key + '_max'])})"
        return text

    for name, m in result["methods"].items():
        same = {True: "yes", False: "NO", None: "–"}[m["identical"]]
        table.add_row(name, f"{m['tau']:.2f}", f"{m['accept_rate']:.0%}", str(int(m["passes"])),
                      str(int(m["scheduled_tokens"])), spread(m, "rollout_s", "{:.2f}"),
                      f"{m['tok_per_s']:.0f}", spread(m, "speedup", "{:.2f}×"),
                      spread(m, "vs_suffix", "{:.2f}×"), f"{m['floor_s']:.2f}",
                      f"{m['drafter_frac']:.1%}", same)
    out.print(table)
    _render_critical_path(result)
    _render_ceiling(result.get("ceiling"))
    for name, m in result["methods"].items():
        if m.get("draft_sources"):
            shares = ", ".join(f"{k} tree {v:.0%}" for k, v in m["draft_sources"].items())
            out.print(f"{name}: drafts served by the {shares}", markup=False)
    for name, m in result["methods"].items():
        if m.get("calibration"):
            cal = Table(title=f"{name}: calibration of per-token acceptance (tree path counts)")
            for column in ("tree q", "tokens tested", "predicted", "observed"):
                cal.add_column(column, justify="right")
            for row in m["calibration"]:
                cal.add_row(f"{row['lo']:.2f}–{row['hi']:.2f}", str(row["tried"]),
                            f"{row['predicted']:.3f}", f"{row['observed']:.3f}")
            out.print(cal)


def _render_critical_path(result: dict) -> None:
    """Per method: target passes per step and on the critical path (medians over the
    measured steps), the tail's passes and taus, and the GPU estimate."""
    from rich.table import Table

    gpu = result.get("gpu_model")
    methods = result["methods"]
    if gpu is None or not any("critical_passes" in m for m in methods.values()):
        return
    table = Table(title="target passes per step (medians over steps); tail: fewer than a "
                        "quarter of the step's requests running")
    table.caption = (f"GPU est.: an estimate, not a measurement: each pass priced as on "
                     f"{gpu['name']}, max({gpu['weights_ms']:.2f} ms, scheduled tokens × "
                     f"{gpu['flops_per_token'] / gpu['peak_flops'] * 1e6:.1f} µs); × is none's "
                     f"estimate over the method's")
    # the total passes are in the table above; the tail's GPU seconds in --json
    for column in ("method", "passes/step", "critical", "tail", "crit. tau", "tail tau",
                   "GPU est. s", "GPU est. ×"):
        table.add_column(column, justify="right", no_wrap=True)

    def num(value, fmt):
        return "–" if value is None else fmt.format(value)

    for name, m in methods.items():
        table.add_row(name, num(m.get("passes_per_step"), "{:g}"),
                      num(m.get("critical_passes"), "{:g}"), num(m.get("tail_passes"), "{:g}"),
                      num(m.get("critical_tau"), "{:.2f}"), num(m.get("tail_tau"), "{:.2f}"),
                      num(m.get("gpu_estimate_s"), "{:.2f}"),
                      num(m.get("gpu_estimate_speedup"), "{:.2f}×"))
    out.print(table)


def _render_ceiling(ceiling: dict | None) -> None:
    """The oracle's passes (`--ceiling`), one line per draft cap."""
    if not ceiling:
        return
    out.print(f"ceiling: a drafter that always drafted the policy's most likely token "
              f"({ceiling['argmax_share']:.0%} of none's sampled tokens were)", markup=False)
    for name, c in ceiling["caps"].items():
        ratio = f", {c['over_suffix']:.2f}× suffix's" if "over_suffix" in c else ""
        out.print(f"  {name}: {c['passes']} passes, critical path {c['critical_passes']:g} "
                  f"per step{ratio}", markup=False)
    if not ceiling["check"]:
        out.print("  (cap0 differs from none's measured critical path: a prefill split over "
                  "passes, or a response vLLM cut)", markup=False)


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
