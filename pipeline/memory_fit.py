"""Why a memory plan (`pipeline.memory_plan`) does not fit its GPU, and what to change.

The plan is arithmetic; this is its refusal, which the preflight of `rhymectl train` (and
its `--dry-run`) prints: each problem names the phase and its largest holders of memory,
and the settings that would shrink them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.draft_shape import sampled_drafts
from pipeline.memory_types import Item, MemoryPlan

if TYPE_CHECKING:
    from pipeline.config.schema import Config


def problems(plan: MemoryPlan, cfg: Config, vllm_weights: float) -> list[str]:
    """Why `plan` does not fit its device (empty: it fits), each with what to change;
    `vllm_weights`: vLLM's weights per GPU, GiB."""
    device, r = plan.device_gib, cfg.rollout
    share = r.gpu_memory_utilization * device
    out = []
    if vllm_weights >= device:
        out.append(f"vLLM's weights ({vllm_weights:.1f} GiB in {cfg.model.dtype}) do not fit the "
                   f"{device:.1f} GiB GPU; set model.dtype: bfloat16 or raise "
                   f"rollout.tensor_parallel_size (now {r.tensor_parallel_size})")
    elif share <= vllm_weights:
        most, left = fitting_utilization(plan), device - (plan.peak("rollout") - share)
        room = (f"but not above {most:.2f} (the trainer's states, the rejection sampler and "
                f"the CUDA context take the rest)" if most * device > vllm_weights else
                f"but the trainer's states, the rejection sampler and the CUDA context leave "
                f"it only {max(0.0, left):.1f} GiB")
        out.append(f"rollout.gpu_memory_utilization = {r.gpu_memory_utilization:g} gives vLLM "
                   f"{share:.1f} GiB of the {device:.1f} GiB GPU, less than its {vllm_weights:.1f} "
                   f"GiB of weights; raise it well above {vllm_weights / device:.2f} (the rest is "
                   f"its KV cache) {room}")
    phase, peak = plan.peak_phase
    if peak > device:
        items = sorted((i for i in plan.items if getattr(i, phase) > 0),
                       key=lambda i: -getattr(i, phase))
        largest = ", ".join(f"{i.name} {getattr(i, phase):.1f}" for i in items[:3])
        out.append(f"the memory plan needs {peak:.1f} GiB per GPU in the {phase} phase, more than "
                   f"the {device:.1f} GiB GPU (largest: {largest} GiB); to fit: "
                   f"{_or(_remedies(plan, cfg, phase, items, vllm_weights))}")
    return out


def fitting_utilization(plan: MemoryPlan) -> float:
    """The largest rollout.gpu_memory_utilization (two decimals, rounded down) whose rollout
    phase fits the device beside every other item of it: the trainer's states, the
    rejection sampler, the CUDA context."""
    others = plan.peak("rollout") - plan.vllm_fraction * plan.device_gib
    return int(100 * (plan.device_gib - others) / plan.device_gib) / 100


def _remedies(plan: MemoryPlan, cfg: Config, phase: str, items: list[Item],
              vllm_weights: float) -> list[str]:
    """What to change, for the largest items of the phase first."""
    t, stage = cfg.train, cfg.deepspeed.zero_stage
    device = plan.device_gib
    fitting_util = fitting_utilization(plan)
    if plan.world_size == 1:  # nothing to partition over
        states = ["run more ranks (--nproc) with deepspeed.zero_stage 3"]
    elif stage < 3:
        states = [f"raise deepspeed.zero_stage (now {stage})"]
    else:
        states = ["run on more GPUs (ZeRO-3 partitions the states over the ranks)"]
    micro = ([f"lower train.ppo_micro_batch_size (now {plan.micro_batch})"]
             if plan.micro_batch > 1 else [])
    by_item = {
        "activations": (["enable train.gradient_checkpointing"] if not t.gradient_checkpointing
                        else []) + micro + ["lower rollout.max_tokens"],
        "logits": micro + ["lower rollout.max_tokens"],
        "policy weights": states, "gradients": states, "optimizer states": states,
        "reference model": states,
        "vLLM awake": ([f"lower rollout.gpu_memory_utilization to {fitting_util:.2f}"]
                       if fitting_util * device > vllm_weights else []),
        "rejection sampler": ["set spec.draft_probs=false"] * sampled_drafts(cfg)
        + [f"lower spec.num_speculative_tokens (now {cfg.spec.num_speculative_tokens})",
           f"lower rollout.max_num_seqs (now {cfg.rollout.max_num_seqs})"],
        "draft model": ["set spec.draft_device=cpu", "lower rollout.max_tokens"],
    }
    out: list[str] = []
    for item in items[:3]:  # the largest, as the refusal names them
        for remedy in by_item.get(item.name, []):
            if remedy not in out:
                out.append(remedy)
    return out[:3] or ["use GPUs with more memory"]


def _or(options: list[str]) -> str:
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


__all__ = ["fitting_utilization", "problems"]
