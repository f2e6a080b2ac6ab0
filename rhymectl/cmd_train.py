"""`rhymectl train CONFIG [key=value ...]`: the GRPO loop (or `--dry-run` to validate)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rhymectl.live import LiveView
from rhymectl.output import emit_json, log, out


def register(app: typer.Typer) -> None:
    app.command("train", help=(
        "Run synchronous GRPO with the config file CONFIG and dotted key=value overrides.\n\n"
        "Example: rhymectl train sample_configs/tiny.yaml rollout.n=8 train.total_steps=10\n\n"
        "Example: rhymectl train sample_configs/tiny.yaml --dry-run"))(train)


def train(
    config: Path = typer.Argument(..., help="YAML config (see sample_configs/)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides, e.g. rollout.n=4"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate everything, print the resolved config, run nothing."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory [run.dir]."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last complete checkpoint."),
    force: bool = typer.Option(False, "--force", help="Replace a run directory that holds a different run."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Start torchrun with N ranks on this node."),
    nnodes: Optional[int] = typer.Option(
        None, "--nnodes", min=1, help="With --dry-run: check for a job of N nodes with --nproc "
        "ranks each (default: the job's own torchrun or Slurm environment)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    gpu_mem_gib: Optional[float] = typer.Option(
        None, "--gpu-mem-gib", min=1, help="Check the memory plan against GPUs of N GiB "
        "(default: the detected GPU; for a machine without one)."),
) -> None:
    from pipeline.config import load_config, to_dict, to_yaml
    from pipeline.loop.preflight import job_ranks, preflight

    extra = list(overrides or [])
    if run_dir is not None:
        extra.append(f"run.dir={run_dir}")
    cfg = load_config(config, extra)
    sizing = {} if gpu_mem_gib is None else {"device_gib": gpu_mem_gib}
    world, per_node = job_ranks(nproc, nnodes, dry_run)
    facts = preflight(cfg, world_size=world, local_world=per_node, **sizing)
    if dry_run:
        from pipeline.loop.rundir import check_run_dir
        from rhymectl.memory_view import plan_lines, unavailable_line

        check_run_dir(cfg, resume, force)  # what the run would say about run.dir
        plan, unplanned = memory_plan(cfg, world, gpu_mem_gib)
        if json_out:
            emit_json({"config": to_dict(cfg), "checks": facts,
                       "memory_plan": plan.to_dict() if plan else {"unavailable": unplanned}})
        else:
            out.print(to_yaml(cfg), end="", markup=False)
            for line in plan_lines(plan, out.width) if plan else [unavailable_line(unplanned)]:
                out.print(line, markup=False, highlight=False)
            out.print("# checks passed: " + ", ".join(f"{k}={v}" for k, v in facts.items()))
        return
    from pipeline.loop.launch import launch

    result = launch(cfg, config_path=config, overrides=extra, resume=resume, force=force,
                    nproc=nproc, view=lambda total, done: LiveView(total, log, start_step=done))
    if result is None:
        return  # another rank reports
    if json_out:
        emit_json(result)
    else:
        out.print(f"[bold]{result['run_dir']}[/]: {result['steps']} steps in {result['seconds']} s")
        for line in heldout_lines(result.get("eval") or []):
            out.print(line, markup=False, highlight=False)


def memory_plan(cfg, world_size: int, gpu_mem_gib: Optional[float]):
    """(the plan, None), or (None, why there is none: a model the plan cannot count)."""
    from pipeline.loop.memory import plan_for
    from pipeline.model_shape import PlanUnavailable

    try:
        return plan_for(cfg, world_size, gpu_mem_gib), None
    except PlanUnavailable as exc:
        return None, str(exc)


def heldout_lines(evals: list[dict]) -> list[str]:
    """The end-of-training summary of eval.jsonl: mean@k (with standard errors, and the change
    in standard errors of the difference) and greedy accuracy, first → last evaluation."""
    if len(evals) < 2:
        return []
    first, last = evals[0], evals[-1]
    span = f"step {first['step']} → {last['step']}, {last['prompts']} held-out prompts, none in the RL batches"
    lines = []
    if "mean_at_k_reward" in first and "mean_at_k_reward" in last:
        k, t = last.get("k"), last.get("temperature")
        for key, name in (("mean_at_k_reward", "reward"), ("mean_at_k_accuracy", "accuracy")):
            a, b = first[key], last[key]
            se = (first[f"{key}_se"] ** 2 + last[f"{key}_se"] ** 2) ** 0.5
            z = f", {(b - a) / se:+.1f} SE" if se > 0 else ""
            lines.append(f"  held-out mean@{k} {name} (T={t}): {a:.3f} ± {first[f'{key}_se']:.3f} → "
                         f"{b:.3f} ± {last[f'{key}_se']:.3f}{z} ({span})")
    lines.append(f"  held-out greedy accuracy {first['accuracy']:.1%} → {last['accuracy']:.1%}; "
                 f"greedy reward {first['reward_mean']:.3f} → {last['reward_mean']:.3f} ({span})")
    return lines
