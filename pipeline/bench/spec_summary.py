"""The report of `rhymectl bench spec`: per method, the counts and seconds that
pipeline.bench.spec measured (its module docstring defines every key), the critical path
step by step, the GPU estimate, and the workload they were measured on."""

from __future__ import annotations

import platform
from statistics import median

from pipeline import costs
from pipeline.bench.spec import (FIGURE_METHODS, GPU_MODEL, GPU_PASSES, STEP_KEYS, EpochWork,
                                 MethodResult)
from pipeline.bench.spec_plan import Plan
from pipeline.costs import CostModel
from pipeline.drafting.stats import source_shares


def summarize(results: dict[str, MethodResult], temperature: float) -> dict[str, dict]:
    """The per-method numbers of the report (see the module docstring)."""
    base = results["none"]
    base_cost = costs.fit(decode_samples(base),
                          CostModel(0.0, base.rollout_s / max(1, base.scheduled_tokens)))
    base_gpu = GPU_PASSES.estimate(step_passes(base.steps), base.gpu_engine())["s"]
    out = {}
    for name, r in results.items():
        decode = r.seq_passes - r.prefill_seq_passes
        emitted = r.generated - r.requests
        cost = costs.fit(decode_samples(r), base_cost)
        out[name] = {
            "tau": round(costs.tau(emitted, decode), 4),
            "accept_rate": round(costs.accept_rate(emitted, decode, r.draft_tokens), 4),
            "passes": r.passes,
            "scheduled_tokens": r.scheduled_tokens,
            "rollout_s": round(r.rollout_s, 3),
            "tok_per_s": round(r.generated / r.rollout_s, 1) if r.rollout_s else 0.0,
            "speedup": round(base.rollout_s / r.rollout_s, 3) if r.rollout_s else 0.0,
            "floor_s": round(r.generated * cost.per_token_s, 3),
            "identical": (r.outputs == base.outputs) if temperature == 0 else None,
            # beyond the contract: where the time goes
            "generated_tokens": r.generated,
            "drafter_s": round(r.drafter_s, 3),
            "drafter_frac": round(r.drafter_s / r.rollout_s, 4) if r.rollout_s else 0.0,
            "pass_base_ms": round(cost.base_s * 1e3, 3),
            "pass_per_token_ms": round(cost.per_token_s * 1e3, 5),
        }
        out[name].update(step_summary(r.steps))
        out[name].update(gpu_estimate(r, base_gpu))
        if r.sources:
            out[name]["draft_sources"] = source_shares(r.sources)
        if r.draft_warmup:
            out[name]["draft_warmup"] = r.draft_warmup
        for part, seconds in (r.drafter_parts or {}).items():
            out[name][f"drafter_{part}_s"] = round(seconds, 3)
    return out


def step_summary(steps: list[dict]) -> dict:
    """STEP_KEYS: the median over steps (of the steps that have a value) and the per-step
    values (KEY_steps; taus None where undefined: no tail, an unknown length)."""
    out = {}
    for key in STEP_KEYS:
        values = [s["passes" if key == "passes_per_step" else key] for s in steps]
        known = [v for v in values if v is not None]
        med = median(known) if known else None
        out[key] = round(med, 4) if isinstance(med, float) else med
        out[f"{key}_steps"] = [round(v, 4) if isinstance(v, float) else v for v in values]
    return out


def step_passes(steps: list[dict], tail: bool = False) -> list[tuple[int, int]]:
    """(scheduled tokens, running requests) of every pass of `steps`, or of their tail
    passes (the last tail_passes of each step)."""
    out = []
    for s in steps:
        first = len(s["tokens"]) - s["tail_passes"] if tail else 0
        out.extend(zip(s["tokens"][first:], s["running"][first:]))
    return out


def gpu_estimate(r: MethodResult, base_s: float) -> dict:
    """The method's passes priced by GPU_PASSES (see the module docstring)."""
    engine = r.gpu_engine()
    est = GPU_PASSES.estimate(step_passes(r.steps), engine)
    total = est["s"]
    tail = GPU_PASSES.estimate(step_passes(r.steps, tail=True), engine)["s"]
    return {"gpu_estimate_s": round(total, 4), "gpu_estimate_tail_s": round(tail, 4),
            "gpu_estimate_speedup": round(base_s / total, 3) if total else 0.0,
            "gpu_estimate_with_drafter_s": round(total + r.drafter_s, 4),
            "gpu_estimate_roofline_s": round(est["roofline_s"], 4),
            "gpu_estimate_host_s": round(est["host_s"], 4),
            "gpu_estimate_graphs_s": round(est["graphs_s"], 4),
            **{f"gpu_estimate_{g}_passes": n for g, n in est["passes"].items()},
            "gpu_estimate_model": GPU_MODEL.name, **model_estimate(r, total, base_s)}


def model_estimate(r: MethodResult, total_s: float, base_s: float) -> dict:
    """A draft model's forwards priced on GPU_MODEL (see the module docstring of
    pipeline.bench.spec); empty for a method without one."""
    if not r.model:
        return {}
    model_s = r.model["step_reads"] * GPU_MODEL.weights_s
    with_model = total_s + model_s
    return {"model_passes": r.model["passes"], "model_steps": r.model["steps"],
            "gpu_estimate_model_s": round(model_s, 4),
            "gpu_estimate_with_model_s": round(with_model, 4),
            "gpu_estimate_model_speedup": round(base_s / with_model, 3) if with_model else 0.0}


def figure_step(results: dict[str, MethodResult]) -> tuple[int, dict[str, dict]]:
    """The measured step the running-requests figure shows, the same for every method: the
    first whose critical path under none is the (lower) median; and FIGURE_METHODS' records
    of it. (-1, {}) without steps."""
    critical = [s["critical_passes"] for s in results["none"].steps]
    if not critical:
        return -1, {}
    i = critical.index(sorted(critical)[(len(critical) - 1) // 2])
    return i, {name: results[name].steps[i] for name in FIGURE_METHODS
               if name in results and i < len(results[name].steps)}


def decode_samples(r: MethodResult) -> list[tuple[int, float]]:
    """(scheduled tokens, seconds) of the passes without a prompt prefill: the cost of a
    decode pass is what speculation trades in (prefill passes are the same for all)."""
    return [(tokens, seconds) for tokens, seconds, prefill in r.samples if not prefill]


def workload(plan: Plan, work: list[EpochWork], results: dict[str, MethodResult]) -> dict:
    import torch

    cfg, base = plan.cfg, results["none"]
    steps = [sw for ew in work for sw in ew.steps]
    return {
        "run_dir": str(plan.run_dir), "model": cfg.model.path, "task": cfg.data.task,
        "epochs_trained": plan.epochs, "epochs_measured": [ew.epoch for ew in work],
        "steps_per_epoch": plan.steps_per_epoch, "steps": len(steps),
        "prompts_per_step": cfg.data.train_batch_size, "n": cfg.rollout.n,
        "sequences_per_step": cfg.data.train_batch_size * cfg.rollout.n,
        "requests": base.requests, "generated_tokens_none": base.generated,
        "mean_response_tokens": round(base.generated / max(1, base.requests), 1),
        "temperature": cfg.rollout.temperature, "max_tokens": cfg.rollout.max_tokens,
        "num_speculative_tokens": cfg.spec.num_speculative_tokens,
        "thin_draft_tokens": cfg.spec.thin_draft_tokens,
        "history_epochs": cfg.spec.history_epochs,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch_threads": torch.get_num_threads(),
    }
