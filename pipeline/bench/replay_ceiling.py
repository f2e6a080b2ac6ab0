"""`rhymectl bench replay --ceiling`: the oracle's critical path on a run's recorded steps.

The oracle drafts the sampling policy's own most likely tokens (`pipeline.draft_ceiling`):
a response's passes under it follow from which of its tokens were the argmax, marked by one
teacher-forced forward of the policy that sampled it. A training run keeps that policy for
the steps sampled by its starting model (policy version 0, `model.path`) and by a
checkpointed one (`checkpoints/step-N/policy`, whose `state.json` names its version), so
the oracle covers those steps only; the methods' critical paths are compared on the same
steps. Cap 0 reproduces `none`'s critical path of every covered step (`check`). Every
method drafts the same recorded responses the oracle is marked on, so `gap_closed` (the
share of history+group's gap to the oracle, at the run's draft cap, that each other method
closes) compares like with like.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Callable, Sequence

from pipeline.bench.replay import ReplayStep
from pipeline.bench.spec_ceiling import argmax_hits, caps_for, load_policy
from pipeline.draft_ceiling import gaps_closed, step_ceiling


def policy_dirs(run_dir: Path, start_model: str) -> dict[int, Path]:
    """Policy version -> the directory holding the weights that sampled with it."""
    from pipeline.errors import UsageError
    from pipeline.train import checkpoint

    found = {0: Path(start_model)}
    root = Path(run_dir) / "checkpoints"
    for step in sorted(root.glob("step-*")) if root.is_dir() else []:
        policy = step / "policy"
        try:
            version = int(checkpoint.read_state(step)["policy_version"])
        except (KeyError, ValueError, UsageError):  # a checkpoint being written or broken
            continue
        if any(policy.glob("*.safetensors")):
            found[version] = policy
    return found


def step_version(step: ReplayStep) -> int | None:
    """The one policy version that sampled the step's responses (None if several)."""
    versions = {int(r.policy_version) for r in step.records}
    return versions.pop() if len(versions) == 1 else None


def replay_ceiling(steps: Sequence[ReplayStep], policies: dict[int, Path], result: dict,
                   first_measured: int, progress: Callable[[str], None] = lambda s: None) -> dict:
    """The oracle's critical path per cap on every measured step whose policy is on disk,
    beside each replayed method's on the same steps.

    result: `pipeline.bench.replay.replay`'s, whose methods' `steps` hold every step's
    critical path in `steps` order. Returns steps (the covered step ids), caps (per cap:
    critical_passes_steps, passes, over_suffix), methods (per method: passes on the covered
    steps), argmax_share, check (cap 0 equals none's critical path on every covered step)
    and gap_closed (`pipeline.draft_ceiling.gaps_closed` at the result's
    num_speculative_tokens, over the covered steps), or {"steps": []} when no measured
    step's policy is on disk."""
    cap = result.get("num_speculative_tokens")
    asked = caps_for(cap)
    by_version: dict[int, list[int]] = {}
    for i, st in enumerate(steps):
        version = step_version(st)
        if st.step >= first_measured and version in policies:
            by_version.setdefault(version, []).append(i)
    covered = sorted(i for idx in by_version.values() for i in idx)
    if not covered:
        return {"steps": []}
    per_step: dict[int, dict[str, int]] = {}
    hits_total = tokens_total = 0
    for version, indices in sorted(by_version.items()):
        model = load_policy(policies[version])
        for i in indices:
            st = steps[i]
            hits = [argmax_hits(model, prompt, response)
                    for prompt, group in zip(st.prompts, st.responses) for response in group]
            hits_total += sum(map(sum, hits))
            tokens_total += sum(map(len, hits))
            per_step[i] = {name: step_ceiling(hits, c) for name, c in asked.items()}
            progress(f"oracle, step {st.step}")
        del model
    methods = {name: sum(r["steps"][i] for i in covered) for name, r in result["methods"].items()}
    caps = {}
    for name in asked:
        path = [per_step[i][name] for i in covered]
        caps[name] = {"critical_passes_steps": path, "passes": sum(path),
                      "critical_passes": median(path)}
        if methods.get("suffix"):
            caps[name]["over_suffix"] = round(sum(path) / methods["suffix"], 4)
    none = [result["methods"]["none"]["steps"][i] for i in covered]
    out = {"steps": [steps[i].step for i in covered], "caps": caps, "methods": methods,
           "argmax_share": round(hits_total / tokens_total, 4) if tokens_total else None,
           "check": [per_step[i]["cap0"] for i in covered] == none}
    if cap is not None:
        oracle = caps[f"cap{cap}"]
        paths = {name: (methods[name], median([r["steps"][i] for i in covered]))
                 for name, r in result["methods"].items()}
        out["gap_closed"] = {"cap": cap, "reference": "history+group", "methods": gaps_closed(
            paths, (oracle["passes"], oracle["critical_passes"]))}
    return out


__all__ = ["policy_dirs", "replay_ceiling", "step_version"]
