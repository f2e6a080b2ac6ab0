"""`rhymectl bench drafter`: the drafter's per-pass cost at production shape, against vLLM's
suffix proposer, on synthetic token streams (no model, no GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from pipeline.errors import UsageError
from rhymectl.cmd_bench import bench_app
from rhymectl.output import emit_json, log, out

HELP = (
    "Drive rhymectl's drafter (RhymeProposer.propose, as vLLM's runner calls it after every "
    "target pass) and vLLM's suffix proposer over the same synthetic RL step: --live "
    "requests, --group per prompt, log-normal response lengths of mean --mean-len tokens, "
    "Zipf-like token ids below --vocab, spans repeated across siblings and epochs at the "
    "--rhyme rate, --history-epochs earlier epochs of history per prompt. A window of "
    "--passes decode passes from output token --start on is timed (the rollout before it is "
    "handed over in one untimed call); the proposers alternate --window passes at a time "
    "and are rebuilt --repeats times. Reports per proposer the ms per pass (median, p99; wall "
    "and CPU), tau and acceptance, the build time and memory of the step's history, and "
    "for rhymectl the parts of a pass and the work done in the background while the GPU "
    "pass (--gpu-ms, a sleep here) runs. --soak S instead runs S steps with fresh prompts "
    "each, reading history from a run directory on disk, and reports memory per step. "
    "spec.KEY=VALUE arguments change rhymectl's drafter settings (chains, budget, caps ...) "
    "as in a config. --model CONFIG also times the draft model of history+group+model for "
    "a policy of that shape (the model part of a pass, reported on its own). Writes "
    "OUT/bench-drafter-LIVExLEN.json and .png.\n\n"
    "Example: rhymectl bench drafter --live 128 --mean-len 1024 --passes 50 --repeats 2\n\n"
    "Example: rhymectl bench drafter --live 512 --group 16 --mean-len 8192 --vocab 152064 "
    "--history-epochs 2 --passes 200 --repeats 3 --json --out docs")


def _live(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--live {text!r}: give request counts, e.g. 512 or 128,512") from None
    return sorted(set(values)) if values else []


def _tag(live: list[int], mean_len: int) -> str:
    length = f"{mean_len // 1024}k" if mean_len % 1024 == 0 else str(mean_len)
    return f"{'-'.join(map(str, live))}x{length}"


@bench_app.command("drafter", help=HELP)
def drafter(
    live: str = typer.Option("512", "--live", help="Requests in flight (comma-separated: "
                                                   "one point each)."),
    group: int = typer.Option(16, "--group", help="Responses per prompt (GRPO group)."),
    mean_len: int = typer.Option(8192, "--mean-len", help="Mean response length, tokens "
                                                          "(log-normal; up to 16384)."),
    vocab: int = typer.Option(152064, "--vocab", help="Vocabulary size (token ids)."),
    rhyme: float = typer.Option(0.6, "--rhyme", help="Share of response spans copied from the "
                                                     "prompt's shared stream (siblings, epochs)."),
    history_epochs: int = typer.Option(2, "--history-epochs", help="Earlier epochs of history "
                                                                   "per prompt."),
    seed: int = typer.Option(0, "--seed", help="Seed of the workload."),
    passes: int = typer.Option(200, "--passes", help="Timed decode passes per proposer and "
                                                     "repeat (the window)."),
    repeats: int = typer.Option(3, "--repeats", help="Times each proposer is rebuilt and run."),
    start: Optional[int] = typer.Option(None, "--start", help="Output tokens every request has "
                                                              "when the window starts "
                                                              "[mean-len / 4]."),
    k: int = typer.Option(8, "--k", help="num_speculative_tokens (both proposers)."),
    window: int = typer.Option(10, "--window", help="Passes a proposer runs before the other "
                                                    "takes its turn."),
    gpu_ms: float = typer.Option(20.0, "--gpu-ms", help="Milliseconds a target pass takes "
                                                        "(slept between passes)."),
    inline: bool = typer.Option(False, "--inline", help="Also run rhymectl's drafter with its "
                                                        "background work inline."),
    floor: bool = typer.Option(False, "--floor", help="Also time one bare suffix-tree query "
                                                      "per request and pass (history only, "
                                                      "no chains, memo or budget): the least "
                                                      "any drafter asking every row pays."),
    model: Optional[Path] = typer.Option(None, "--model", help="Also time the draft model "
                                         "that history+group+model starts for a policy of "
                                         "this Hugging Face config.json (or model "
                                         "directory): k tokens for every request each "
                                         "pass, on spec.draft_device (random weights)."),
    model_passes: Optional[int] = typer.Option(None, "--model-passes", help="Timed passes "
                                               "of the model lane a repeat [--passes]."),
    soak: int = typer.Option(0, "--soak", help="Instead: this many steps with fresh prompts, "
                                               "memory per step (0: off)."),
    out_dir: Path = typer.Option(Path("."), "--out", help="Folder for the JSON and PNG."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="spec.KEY=VALUE settings of rhymectl's drafter (history+group) and the "
                   "floor lane's queries, as in a config, e.g. spec.chain_drafts=false"),
) -> None:
    from pipeline.bench.drafter_plan import make_plan

    plan = make_plan(_live(live), group, mean_len, vocab, rhyme, history_epochs, seed, passes,
                     repeats, k, start, window, gpu_ms, inline, floor, overrides or [],
                     None if model is None else str(model), model_passes)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file; give a folder")
    if soak < 0:
        raise UsageError(f"--soak {soak}: give a number of steps (0: off)")
    name = f"bench-drafter-{'soak-' if soak else ''}{_tag(_live(live), mean_len)}"
    if soak:
        report = _soak(plan, soak)
        png = None
    else:
        report = _measure(plan)
        from pipeline.bench.drafter_plot import write_drafter_plot

        png = write_drafter_plot(report, out_dir / f"{name}.png")
        report["plot"] = png.name
    from pipeline.atomic import write_json_atomic

    path = write_json_atomic(out_dir / f"{name}.json", report)
    if json_out:
        emit_json(report)
    else:
        _render_soak(report) if soak else _render(report)
    log.print(f"wrote {path}" + (f" and {png}" if png else ""), markup=False, soft_wrap=True)


def _progress(total: int, title: str):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=log, transient=True), total, title


def _measure(plan) -> dict:
    from pipeline.bench.drafter import run

    progress, total, title = _progress(plan.total_passes, "bench drafter")
    with progress:
        task = progress.add_task(title, total=total)

        def advance(what: str, n: int) -> None:
            progress.update(task, description=f"bench drafter: {what}", advance=n)

        return run(plan, advance)


def _soak(plan, steps: int) -> dict:
    from pipeline.bench.drafter_soak import soak

    progress, total, title = _progress(steps, "bench drafter --soak")
    with progress:
        task = progress.add_task(title, total=total)
        return soak(plan, steps, lambda what, n: progress.update(
            task, description=f"bench drafter --soak: {what}", advance=n))


def _render(report: dict) -> None:
    from rich.table import Table

    w, m = report["workload"], report["machine"]
    for pt in report["points"]:
        table = Table(title=f"{pt['live']} live requests ({pt['prompts']} prompts x {w['group']}), "
                            f"{w['mean_len']}-token responses, {pt['history_tokens']:,} history "
                            f"tokens, rhyme {w['rhyme']}")
        table.caption = (f"{report['window']}; medians of {w['repeats']} interleaved repeats; "
                         f"{m['cpus']} CPUs, load {m['loadavg_before'][0]} -> "
                         f"{m['loadavg_after'][0]}")
        for column in ("proposer", "ms/pass", "p99", "CPU ms", "tau", "accept", "build s",
                       "history GB"):
            table.add_column(column, justify="right", no_wrap=True)
        for name in w["lanes"]:
            s = pt[name]
            table.add_row(name, f"{s['per_pass_ms']['median']:.2f}", f"{s['per_pass_ms']['p99']:.2f}",
                          f"{s['per_pass_cpu_ms']['median']:.2f}", f"{s['tau']:.3f}",
                          f"{s['accept_rate']:.1%}", f"{s['build_s']:.1f}",
                          f"{s['history_bytes'] / 1e9:.2f}")
        out.print(table)
        if "model" in w:
            d = w["model"]
            out.print(f"model lane: a {d['shape']['layers']}-layer draft of width "
                      f"{d['shape']['hidden_size']} (MLP {d['shape']['intermediate_size']}), "
                      f"{d['own_parameters'] / 1e6:.0f}M parameters of its own beside the "
                      f"policy's embedding and head, drafting over {d['draft_vocab']:,} "
                      f"tokens on {d['device']}; random weights: its tau means nothing",
                      markup=False)
        ours = pt["ours"]
        parts = ", ".join(f"{k} {v:.2f}" for k, v in ours["parts_ms"].items())
        out.print(f"rhymectl / suffix: {pt['ours_over_suffix']:.2f}; rhymectl's pass: {parts} ms; "
                  f"background {ours['background_ms']['median']:.2f} ms a pass "
                  f"(p99 {ours['background_ms']['p99']:.2f})", markup=False)


def _render_soak(report: dict) -> None:
    from rich.table import Table

    table = Table(title=report["title"])
    for column in ("step", "RSS GB", "history tokens", "in memory", "build s", "wait s"):
        table.add_column(column, justify="right")
    for row in report["steps"]:
        table.add_row(str(row["step"]), f"{row['rss_bytes'] / 1e9:.2f}",
                      f"{row['history_tokens']:,}", f"{row['window_memory_tokens']:,}",
                      f"{row['build_s']:.1f}", f"{row['ready_wait_s']:.2f}")
    out.print(table)
