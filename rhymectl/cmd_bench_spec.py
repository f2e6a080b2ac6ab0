"""`rhymectl bench spec`: every speculative method regenerates the same epochs' rollouts,
side by side (`pipeline.bench.spec`), with the critical path, the GPU estimate and, with
`--ceiling`, the oracle drafter's passes (`pipeline.bench.spec_ceiling`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from pipeline.config.methods import METHODS
from pipeline.errors import UsageError
from rhymectl.cmd_bench import bench_app
from rhymectl.output import emit_json, log, out
from rhymectl.spec_tables import render_seeds, render_spec

DEFAULT_METHODS = ",".join(METHODS)


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
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma-separated run.seed "
                                        "values: one training run per seed (RUN_DIR-seedS), "
                                        "every method measured on each, and passes over "
                                        "suffix's summarised over the seeds (median, min-max): "
                                        "at T > 0 a method's passes depend on the draw, which "
                                        "--repeats does not change. [the config's run.seed]"),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from rhymectl.parsing import parse_methods

    names = parse_methods(methods)  # before the heavy imports: a typo fails at once
    if repeats < 1:
        raise UsageError(f"--repeats {repeats}: need at least 1")
    extra = list(overrides or [])
    if seeds is not None:
        from pipeline.bench.e2e import parse_seeds

        _over_seeds(config, extra, names, epochs, run_dir, plot, repeats, ceiling,
                    parse_seeds(seeds), json_out)
        return
    result, plot_path = _trained_and_measured(config, extra, names, epochs, run_dir, plot,
                                              repeats, ceiling)
    if json_out:
        emit_json({**result, "plot": str(plot_path)})
    else:
        render_spec(result)
    log.print(f"plot: {plot_path}", markup=False, soft_wrap=True)
    if result.get("running_plot"):
        log.print(f"running requests by pass: {result['running_plot']}", markup=False,
                  soft_wrap=True)


def _trained_and_measured(config, extra, names, epochs, run_dir, plot, repeats, ceiling,
                          seed: int | None = None):
    """Train (or reuse) the bench's run, then measure every method on it. With a seed, the
    run is `run.seed` = seed's, in RUN_DIR-seedS (the plot's name ends in -seedS too)."""
    from pipeline.bench.spec_plan import ensure_trained, make_plan
    from pipeline.config import load_config
    from pipeline.loop.preflight import preflight

    if seed is not None:
        extra = [*extra, f"run.seed={seed}"]
    cfg = load_config(config, extra)
    preflight(cfg, world_size=1)
    plan = make_plan(cfg, epochs, run_dir)
    if seed is not None:
        plan = make_plan(cfg, epochs, plan.run_dir.with_name(f"{plan.run_dir.name}-seed{seed}"))
        plot = plot and plot.with_name(f"{plot.stem}-seed{seed}{plot.suffix}")
    if ensure_trained(plan, config, extra):
        log.print(f"trained {plan.total_steps} steps into {plan.run_dir}", markup=False)
    else:
        log.print(f"reusing the trained epochs in {plan.run_dir}", markup=False)
    return _measure(plan, names, config, extra, plot, repeats, ceiling)


def _over_seeds(config, extra, names, epochs, run_dir, plot, repeats, ceiling, seeds,
                json_out) -> None:
    """`--seeds`: the bench once per seed, then the methods' passes over the seeds."""
    from pipeline.bench.spec_seeds import across_seeds
    from pipeline.config import load_config
    from pipeline.loop.preflight import preflight

    for seed in seeds:  # every seed's config checked before the first trains
        preflight(load_config(config, [*extra, f"run.seed={seed}"]), world_size=1)
    results = {}
    for seed in seeds:
        log.print(f"seed {seed}", markup=False)
        result, plot_path = _trained_and_measured(config, extra, names, epochs, run_dir, plot,
                                                  repeats, ceiling, seed)
        results[seed] = {**result, "plot": str(plot_path)}
        log.print(f"plot: {plot_path}", markup=False, soft_wrap=True)
    summary = across_seeds({s: r["methods"] for s, r in results.items()},
                           {s: r.get("ceiling", {}).get("gap_closed") for s, r in results.items()})
    png = _seeds_plot(summary, results, plot)
    log.print(f"over the seeds: {png}", markup=False, soft_wrap=True)
    if json_out:
        emit_json({"seeds": {str(s): r for s, r in results.items()}, "across_seeds": summary,
                   "plot": str(png)})
        return
    for seed, result in results.items():
        out.print(f"seed {seed}", markup=False)
        render_spec(result)
    render_seeds(summary)


def _seeds_plot(summary: dict, results: dict, plot: Path | None) -> Path:
    """The PNG over the seeds: PLOT-seeds.png, by default beside the first seed's plot."""
    from pipeline.bench.figures import write_seeds_plot

    first = Path(plot) if plot else Path(next(iter(results.values()))["plot"])
    path = first.with_name(f"{first.stem}-seeds{first.suffix}")
    load = next(iter(results.values())).get("workload", {})
    title = (f"{load.get('task', 'bench spec')}: seeds {', '.join(map(str, results))}, "
             f"T={load.get('temperature', '?')} (dots: one seed each)")
    return write_seeds_plot(summary, path, title)


def _measure(plan, names, config, overrides, plot, repeats=1, ceiling=False):
    from pipeline.bench.figures import write_plot, write_running_plot
    from pipeline.bench.spec import GPU_MODEL, GPU_PASSES, build_work, run_isolated
    from pipeline.bench.spec_summary import figure_step, summarize, workload
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
    result = {"methods": summary, "workload": load,
              "gpu_model": {**GPU_MODEL.as_dict(), **GPU_PASSES.as_dict()}}
    if ceiling:
        from pipeline.bench.spec_ceiling import oracle_ceiling

        log.print("ceiling: marking none's tokens with each checkpoint's argmax", markup=False)
        result["ceiling"] = oracle_ceiling(work, runs[0]["none"], plan.cfg.rollout.n,
                                           summary.get("suffix"), summary,
                                           plan.cfg.spec.num_speculative_tokens)
    if running_path is not None:
        result["running_plot"] = str(running_path)
    return result, plot_path
