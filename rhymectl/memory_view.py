"""The memory plan as `train --dry-run` prints it: a rich table (per item: rollout phase,
train phase; the peak), the device and the verdict, DeepSpeed's estimate beside the plan's
model states, and one line of basis per item. Every line is a YAML comment, so the dry run's
stdout stays a loadable config."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table

from pipeline.memory_plan import MemoryPlan


def plan_lines(plan: MemoryPlan, width: int = 80) -> list[str]:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("memory plan (GiB per GPU)")
    table.add_column("rollout", justify="right")
    table.add_column("train", justify="right")
    for item in plan.items:
        rollout = (f"{item.rollout:.1f}" if item.rollout is not None
                   else f"{plan.vllm_fraction:.0%} of GPU")
        table.add_row(item.name, rollout, f"{item.train:.1f}")
    rollout, train = plan.peak("rollout"), plan.peak("train")
    table.add_section()
    table.add_row("peak", "-" if rollout is None else f"{rollout:.1f}", f"{train:.1f}")
    text = io.StringIO()
    Console(file=text, width=max(40, width - 2), color_system=None).print(table)
    lines = [f"# {line}".rstrip() for line in text.getvalue().splitlines()]
    lines.append(f"# device: {plan.device}{verdict(plan)}")
    lines.append(f"# model states (weights, gradients, optimizer; train phase): "
                 f"{plan.model_states_gib:.1f} GiB; {deepspeed_line(plan)}")
    lines += [f"#   {item.name}: {item.basis}" for item in plan.items]
    lines += [f"# note: {note}" for note in plan.notes]
    return lines


def verdict(plan: MemoryPlan) -> str:
    if plan.device_gib is None:
        return ""
    phase, peak = plan.peak_phase
    if plan.fits:
        return (f": fits, peak {peak:.1f} GiB in the {phase} phase "
                f"({plan.device_gib - peak:.1f} GiB to spare)")
    return f": does NOT fit ({'; '.join(plan.problems)})"


def deepspeed_line(plan: MemoryPlan) -> str:
    if plan.deepspeed is not None:
        gib, source = plan.deepspeed
        return f"{source}: {gib:.1f} GiB"
    return "DeepSpeed has no estimator for this set-up (ZeRO-2/3 with bf16 only)"


def unavailable_line(reason: str) -> str:
    return f"# memory plan: not available ({reason})"
