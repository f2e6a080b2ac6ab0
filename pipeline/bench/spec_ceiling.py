"""`rhymectl bench spec --ceiling`: the critical path of a drafter that always drafted the
policy's own most likely tokens, beside the measured methods.

Every measured step's responses as `none` sampled them (the policy's own samples) are
marked token by token: is the sampled token the policy's argmax there, by one
teacher-forced forward of the checkpoint that sampled it (transformers, the model's
dtype)? `pipeline.draft_ceiling` turns the marks into the oracle's passes per response;
a step lasts as long as its slowest response. Cap 0 (no drafts) must give `none`'s
measured critical path in every step: `check` says whether it does.
"""

from __future__ import annotations

from statistics import median
from typing import Sequence

from pipeline.draft_ceiling import step_ceiling

# the oracle's draft caps: 0 (the check), the default full pass, the thin-pass cap, none
CAPS: dict[str, int | None] = {"cap0": 0, "cap8": 8, "cap16": 16, "unbounded": None}


def argmax_hits(model, prompt: Sequence[int], response: Sequence[int]) -> list[bool]:
    """hits[j]: response[j] is the model's most likely token after prompt + response[:j]."""
    import torch

    if not response:
        return []
    ids = torch.tensor([list(prompt) + list(response[:-1])])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:]
    return (logits.argmax(-1) == torch.tensor(list(response))).tolist()


def load_policy(policy_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype="auto")
    return model.eval()


def oracle_ceiling(work, none, n: int, reference: dict | None = None) -> dict:
    """The oracle's per-step critical path for every cap in CAPS.

    work: `spec.build_work`'s epochs (policy and prompts per step); none: `none`'s
    `MethodResult` on them (outputs in step, prompt, sample order); n: responses per
    prompt; reference: `summarize`'s entry for `suffix`, for the ratios. Returns, per cap,
    critical_passes (median step), passes (over the steps), critical_passes_steps and, with
    a reference, over_suffix (passes / suffix's passes); argmax_share: the share of
    sampled tokens that were the argmax; check: cap 0 equals none's measured steps."""
    outputs = iter(none.outputs)
    per_step: dict[str, list[int]] = {name: [] for name in CAPS}
    hits_total = tokens_total = 0
    for ew in work:
        model = load_policy(ew.policy_dir)
        for sw in ew.steps:
            hits = [argmax_hits(model, prompt, next(outputs))
                    for prompt in sw.prompt_ids for _ in range(n)]
            hits_total += sum(map(sum, hits))
            tokens_total += sum(map(len, hits))
            for name, cap in CAPS.items():
                per_step[name].append(step_ceiling(hits, cap))
        del model
    measured = [s["critical_passes"] for s in none.steps]
    out = {"caps": {}, "argmax_share": round(hits_total / tokens_total, 4) if tokens_total else None,
           "check": per_step["cap0"] == measured}
    for name, steps in per_step.items():
        entry = {"critical_passes": median(steps) if steps else None, "passes": sum(steps),
                 "critical_passes_steps": steps}
        if reference and reference.get("passes"):
            entry["over_suffix"] = round(sum(steps) / reference["passes"], 4)
        out["caps"][name] = entry
    return out


__all__ = ["CAPS", "argmax_hits", "load_policy", "oracle_ceiling"]
