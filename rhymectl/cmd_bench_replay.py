"""`rhymectl bench replay RUN_DIR`: a run's recorded rollouts drafted again, pass for pass,
by rhymectl's drafters and vLLM's suffix proposer (`pipeline.bench.replay`): target passes
on every step's critical path, without an engine, a model or a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from pipeline.errors import UsageError
from rhymectl.cmd_bench import bench_app
from rhymectl.output import emit_json, log, out

HELP = (
    "Replay RUN_DIR's recorded responses through each method's proposer, step after step "
    "as the run made them: every pass emits the longest prefix of a request's draft that "
    "matches its recorded response, plus one token (vLLM accepts a one-hot draft token "
    "exactly where the target samples it, so the responses are the same whatever is "
    "drafted). Reports per method the target passes of the summed steps, the median step's "
    "critical path (passes until its last response ended), tail passes, tau and acceptance, "
    "and the ratios to vLLM's suffix. No engine or model runs (the run's tokenizer encodes "
    "its prompts), so a GPU run's history can be replayed on any machine, with spec.* "
    "overrides to try other draft settings. What it leaves out: the engine's scheduling "
    "(every request of a step starts in its first pass). Writes RUN_DIR/report/"
    "bench-replay.png unless --plot is given.\n\n"
    "Example: rhymectl bench replay runs/tiny\n\n"
    "Example: rhymectl bench replay runs/tiny spec.num_speculative_tokens=16 --json")


@bench_app.command("replay", help=HELP)
def replay(
    run_dir: Path = typer.Argument(..., help="A run directory written by `rhymectl train`."),
    overrides: Optional[List[str]] = typer.Argument(None, help="spec.* or model.path "
                                                    "overrides, e.g. spec.num_speculative_tokens=16"),
    methods: str = typer.Option("suffix,history+group,history+group+model", "--methods",
                                help="Comma-separated methods (none is always counted)."),
    from_step: Optional[int] = typer.Option(None, "--from-step", help="First step summed "
                                            "(earlier ones only give history) [the first "
                                            "step of the run's second epoch]."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG [RUN_DIR/report/"
                                                             "bench-replay.png]."),
    ceiling: bool = typer.Option(False, "--ceiling", help="Also the oracle's critical path "
                                 "(drafting the policy's own most likely tokens) on the "
                                 "steps whose sampling policy the run kept: its starting "
                                 "model and its checkpoints (one forward per response)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from rhymectl.parsing import parse_methods

    names = [m for m in parse_methods(methods) if m != "none"]
    from pipeline.bench.replay import REPLAYABLE, first_revisit, replay as run_replay
    from pipeline.bench.replay import write_replay_plot
    from pipeline.bench.replay_run import load_run

    bad = [m for m in names if m not in REPLAYABLE]
    if bad:
        raise UsageError(f"--methods: {bad[0]} cannot be replayed (it needs an engine); "
                         f"choose from {', '.join(REPLAYABLE)}")
    if plot is not None and plot.is_dir():
        raise UsageError(f"--plot {plot} is a folder; give a .png file path")
    cfg, steps = load_run(run_dir, list(overrides or []))
    first = first_revisit(steps) if from_step is None else from_step
    result = _run(run_replay, steps, cfg, names, first)
    if ceiling:
        from pipeline.bench.replay_ceiling import policy_dirs, replay_ceiling

        result["ceiling"] = replay_ceiling(steps, policy_dirs(run_dir, cfg.model.path), result,
                                           first, lambda what: log.print(what, markup=False))
    png = plot or run_dir / "report" / "bench-replay.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    write_replay_plot(result, first, png, f"rhymectl bench replay {run_dir.name}: "
                      f"{result['sequences_per_step']:g} sequences a step, "
                      f"{result['num_speculative_tokens']} draft tokens")
    result["plot"] = str(png)
    if json_out:
        emit_json(result)
    else:
        _render(result)
    log.print(f"plot: {png}", markup=False, soft_wrap=True)


def _run(run_replay, steps, cfg, names, first) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from pipeline.rollout.speculation import PolicySource

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  console=log, transient=True) as progress:
        task = progress.add_task("bench replay", total=1 + len(names) * len(steps))
        return run_replay(steps, cfg.spec, names, first,
                          cfg.data.max_prompt_length + cfg.rollout.max_tokens,
                          lambda what: progress.update(task, description=f"bench replay: {what}",
                                                       advance=1),
                          PolicySource(cfg.model.path, cfg.run.seed, cfg.rollout.temperature))


def _render(result: dict) -> None:
    from rich.table import Table

    first, ids = result["first_measured"], result["step_ids"]
    summed = sum(s >= first for s in ids)
    table = Table(title=f"{summed} steps summed (steps {first}..{ids[-1]}), "
                        f"{result['sequences_per_step']:g} sequences a step")
    cols = {"passes": "passes", "critical_passes": "step", "tail_passes": "tail",
            "critical_tau": "crit tau", "tau": "tau", "accept_rate": "accept",
            "vs_suffix": "× suffix", "critical_vs_suffix": "step × suffix"}
    table.add_column("method")
    for head in cols.values():
        table.add_column(head, justify="right")
    table.caption = ("passes: summed steps; step: the median step's critical path; tail: its "
                     "passes with < 25 % of requests running; × suffix: passes over suffix's")
    for name, r in result["methods"].items():
        table.add_row(name, *("" if r.get(c) is None else f"{r[c]:.4g}" for c in cols))
    out.print(table)
    if "ceiling" in result:
        _render_ceiling(result["ceiling"])


def _render_ceiling(ceiling: dict) -> None:
    from rich.table import Table

    from rhymectl.spec_tables import render_gaps

    if not ceiling["steps"]:
        out.print("oracle: no summed step was sampled by a policy the run kept (its starting "
                  "model or a checkpoint)")
        return
    table = Table(title=f"the oracle on steps {', '.join(map(str, ceiling['steps']))} (their "
                        f"sampling policy kept; argmax share {ceiling['argmax_share']:.3f}, "
                        f"cap 0 = none: {ceiling['check']})")
    table.add_column("drafter")
    table.add_column("critical-path passes, summed", justify="right")
    for name, passes in ceiling["methods"].items():
        table.add_row(name, f"{passes}")
    for name, cap in ceiling["caps"].items():
        table.add_row(f"oracle {name}", f"{cap['passes']}")
    out.print(table)
    render_gaps(ceiling.get("gap_closed"))
