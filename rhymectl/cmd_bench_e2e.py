"""`rhymectl bench e2e`: end-to-end training speedup against a baseline, at equal learning."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rhymectl.cmd_bench import bench_app
from rhymectl.output import emit_json, log, out

HELP = (
    "Train the accelerated config (CONFIG with its overrides, as given) and a baseline (the "
    "same plus the --baseline overrides) for the same --steps and --seeds, each (arm, seed) in "
    "a fresh training process, the arms alternating which goes first seed by seed. "
    "Reports per arm the step-time median and total, seconds per step by phase, the rollout "
    "share and the reward and held-out mean@k curves; between the arms the end-to-end and "
    "rollout-phase speedups (median, min, max over seeds; baseline time / accelerated time), "
    "the Amdahl bound the rollout speedup implies at the baseline's rollout share, and the "
    "difference of final held-out mean@k reward with its 95 % interval and two-sided p "
    "(Welch t-test on per-run means; see pipeline/bench/compare.py). Writes ROOT/bench-e2e.json "
    "and a PNG (ROOT/bench-e2e.png).\n\n"
    "Example: rhymectl bench e2e sample_configs/tiny.yaml --steps 20 --seeds 0,1,2\n\n"
    "Example: rhymectl bench e2e sample_configs/tiny.yaml --baseline 'spec.method=none "
    "sched.policy=static' --steps 10 --seeds 0,1,2 --nproc 2 --json")


@bench_app.command("e2e", help=HELP)
def e2e(
    config: Path = typer.Argument(..., help="YAML config of the accelerated arm."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides for both arms"),
    baseline: str = typer.Option("spec.method=none sched.policy=static", "--baseline",
                                 help="Overrides (space-separated) that turn CONFIG into the baseline."),
    steps: int = typer.Option(20, "--steps", help="Training steps per run."),
    seeds: str = typer.Option("0,1,2", "--seeds", help="Comma-separated run.seed values."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Ranks per run (torchrun)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Folder for the runs "
                                                                    "[run.dir + '-bench-e2e']."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG [RUN_DIR/bench-e2e.png]."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from pipeline.atomic import write_json_atomic
    from pipeline.bench.e2e import make_plan, run_all
    from pipeline.bench.figures import write_e2e_plot
    from pipeline.bench.e2e_summary import summarize

    plan = make_plan(config, list(overrides or []), baseline, steps, seeds, nproc, run_dir)
    log.print(f"bench e2e: {len(plan.order())} runs of {steps} steps into {plan.root} "
              f"(baseline: {' '.join(plan.baseline)})", markup=False)
    results = run_all(plan, lambda r: log.print(
        f"  {r.arm} seed {r.seed}: {r.wall_s:.1f} s (with start-up and evaluations)", markup=False))
    report = summarize(plan, results)
    write_json_atomic(plan.root / "bench-e2e.json", report)
    title = (f"{config.name} {' '.join(plan.overrides)}: {steps} steps × seeds "
             f"{','.join(map(str, plan.seeds))}, {nproc} rank{'s' if nproc > 1 else ''}")
    plot_path = write_e2e_plot(report, plot or plan.root / "bench-e2e.png", title)
    if json_out:
        emit_json(report)
    else:
        render(report)
    log.print(f"plot: {plot_path}; JSON: {plan.root / 'bench-e2e.json'}", markup=False,
              soft_wrap=True)


def render(report: dict) -> None:
    from rich.table import Table

    table = Table(title="bench e2e (times: medians over seeds of per-run values)")
    columns = ("arm", "step s (median)", "total s", "rollout share", "s/step by phase",
               "final held-out mean@k reward", "final greedy acc")
    for column in columns:
        table.add_column(column, justify="right")
    for arm, a in report["arms"].items():
        phases = ", ".join(f"{k} {v:.2f}" for k, v in a["phases_s_per_step"].items() if v >= 0.005)
        h = a["heldout"]
        last = (f"{h['mean_at_k_reward'][-1]:.3f} ± {h['mean_at_k_reward_se'][-1]:.3f}"
                if h["step"] and h["mean_at_k_reward"][-1] is not None else "–")
        greedy = f"{h['greedy_accuracy'][-1]:.3f}" if h["step"] else "–"
        table.add_row(arm, f"{a['step_time_median_s']:.2f}", f"{a['total_s']['median']:.1f}",
                      f"{a['rollout_share']:.1%}", phases, last, greedy)
    out.print(table)
    e2e, ro, d = report["speedup_e2e"], report["speedup_rollout"], report["heldout_diff"]
    out.print(f"speedup end to end {e2e['median']:.3f}× (min {e2e['min']:.3f}, max {e2e['max']:.3f}); "
              f"rollout phase {ro['median']:.3f}× (per generated token {ro['per_token']['median']}×); "
              f"Amdahl bound at the baseline's rollout share {ro['rollout_share_baseline']:.1%}: "
              f"{ro['amdahl_bound']:.3f}× (measured / bound {ro['e2e_over_bound']:.3f})",
              markup=False)
    for key, what in (("passes_over_baseline", "target passes"),
                      ("critical_passes_over_baseline", "target passes on the steps' critical paths")):
        if key in report:
            r = report[key]
            out.print(f"{what}, accelerated / baseline (a draft warm-up included): "
                      f"{r['median']:.3f}× (min {r['min']:.3f}, max {r['max']:.3f})", markup=False)
    if d.get("mean") is None:
        out.print(f"held-out: {d.get('note')}", markup=False)
    else:
        out.print(f"held-out mean@k reward, accelerated − baseline: {d['mean']:+.4f}, 95 % CI "
                  f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}], p = {d['p']:.3f} ({d['method']})",
                  markup=False)
