"""`rhymectl bench spec --ceiling`: the critical path of a drafter that always drafted the
policy's own most likely tokens, beside the measured methods.

Every measured step's responses as `none` sampled them (the policy's own samples) are
marked token by token: is the sampled token the policy's argmax there, by one
teacher-forced forward of the checkpoint that sampled it (transformers, the model's
dtype)? `pipeline.draft_ceiling` turns the marks into the oracle's passes per response;
a step lasts as long as its slowest response. Cap 0 (no drafts) must give `none`'s
measured critical path in every step: `check` says whether it does. With the measured
methods, `gap_closed` says how much of history+group's gap to the oracle (at the run's draft
cap) each other method closes, in total passes and on the median step; the oracle's marks
are `none`'s responses, the methods' their own draws of the same requests.
"""

from __future__ import annotations

from statistics import median
from typing import Sequence

from pipeline.draft_ceiling import gaps_closed, step_ceiling

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


def caps_for(cap: int | None) -> dict[str, int | None]:
    """CAPS, with the run's own draft cap (`spec.num_speculative_tokens`) among them."""
    caps = dict(CAPS)
    if cap is not None:
        caps.setdefault(f"cap{cap}", cap)
    return caps


def oracle_ceiling(work, none, n: int, reference: dict | None = None,
                   methods: dict | None = None, cap: int | None = None) -> dict:
    """The oracle's per-step critical path for every cap of `caps_for(cap)`.

    work: `spec.build_work`'s epochs (policy and prompts per step); none: `none`'s
    `MethodResult` on them (outputs in step, prompt, sample order); n: responses per
    prompt; reference: `summarize`'s entry for `suffix`, for the ratios; methods:
    `summarize`'s entries, with cap (the run's draft cap) for gap_closed. Returns, per cap,
    critical_passes (median step), passes (over the steps), critical_passes_steps and, with
    a reference, over_suffix (passes / suffix's passes); argmax_share: the share of
    sampled tokens that were the argmax; check: cap 0 equals none's measured steps;
    gap_closed (with methods and cap): per method, `pipeline.draft_ceiling.gaps_closed`."""
    outputs = iter(none.outputs)
    caps = caps_for(cap)
    per_step: dict[str, list[int]] = {name: [] for name in caps}
    hits_total = tokens_total = 0
    for ew in work:
        model = load_policy(ew.policy_dir)
        for sw in ew.steps:
            hits = [argmax_hits(model, prompt, next(outputs))
                    for prompt in sw.prompt_ids for _ in range(n)]
            hits_total += sum(map(sum, hits))
            tokens_total += sum(map(len, hits))
            for name, c in caps.items():
                per_step[name].append(step_ceiling(hits, c))
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
    oracle = out["caps"].get(f"cap{cap}", {})
    if methods and oracle.get("critical_passes") is not None:
        out["gap_closed"] = {"cap": cap, "reference": "history+group", "methods": gaps_closed(
            {name: (m["passes"], m["critical_passes"]) for name, m in methods.items()
             if m.get("critical_passes") is not None},
            (oracle["passes"], oracle["critical_passes"]))}
    return out


__all__ = ["CAPS", "argmax_hits", "caps_for", "load_policy", "oracle_ceiling"]
