"""The memory plan of a run: model.path's config.json, the device size, DeepSpeed's estimate.

`pipeline.memory_plan` does the arithmetic; this module gathers its inputs. The device is
the `device_gib` asked for (`--gpu-mem-gib`), else the smallest visible CUDA device, else
none (a CPU run: the plan is shown, nothing is refused).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from pipeline.config import Config
from pipeline.memory_plan import GIB, MemoryPlan, build_plan
from pipeline.model_shape import ModelShape, PlanUnavailable
from pipeline.train.ds_estimate import model_states_gib

NO_DEVICE = "none (CPU run; pass --gpu-mem-gib to check a GPU plan)"


def detected_device() -> Optional[tuple[float, str]]:
    """(GiB, name) of this rank's CUDA device (LOCAL_RANK), or of the smallest visible one
    when no rank is set; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    local = os.environ.get("LOCAL_RANK")
    indices = [int(local)] if local is not None else range(torch.cuda.device_count())
    props = min((torch.cuda.get_device_properties(i) for i in indices),
                key=lambda d: d.total_memory)
    return props.total_memory / GIB, props.name


def plan_for(cfg: Config, world_size: int, device_gib: Optional[float] = None,
             deepspeed: bool = True) -> MemoryPlan:
    """The plan of one of `world_size` ranks (with DeepSpeed's own estimate of the model
    states when `deepspeed`); PlanUnavailable when model.path has no config.json that
    describes a model the plan can count."""
    path = Path(cfg.model.path).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanUnavailable(f"{path} cannot be read ({type(exc).__name__})") from None
    if not isinstance(config, dict):
        raise PlanUnavailable(f"{path} is not a JSON object")
    shape = ModelShape.from_config(config)
    if device_gib is not None:
        size, device = device_gib, f"{device_gib:g} GiB (--gpu-mem-gib)"
    elif (found := detected_device()) is not None:
        size, device = found[0], f"{found[0]:.1f} GiB ({found[1]}, detected)"
    else:
        size, device = None, NO_DEVICE
    estimate = (model_states_gib(cfg.deepspeed.zero_stage, shape.params, shape.largest_layer,
                                 world_size) if deepspeed and cfg.deepspeed.bf16 else None)
    return build_plan(shape, cfg, world_size, size, device, estimate)


def memory_problems(cfg: Config, world_size: int, device_gib: Optional[float] = None) -> list[str]:
    """Why the plan cannot fit the device (empty: it fits, there is no device, or the model
    cannot be counted: the plan then only informs)."""
    try:
        return list(plan_for(cfg, world_size, device_gib, deepspeed=False).problems)
    except PlanUnavailable:
        return []
