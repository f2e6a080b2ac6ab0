"""From the run directories of `bench e2e` to its report (see `summarize` for the shape).

Step time is `time_step_s` of metrics.jsonl: the RL step itself (rollout, reward, train,
sync, gather, index, history append, checkpoint), without process start-up and without the
held-out evaluations, which are not part of training and are reported as `wall_s` apart.
A run's `total_s` adds the draft model's warm-up before its first step (`warmup_s`, the
first row's `time_warmup_*_s`), paid once; its target passes (`passes`, and `critical_passes`:
each step's passes until its last response finished, summed) add the warm-up rollout's.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pipeline.bench.compare import amdahl_bound, compare_heldout, ratio_summary
from pipeline.loop.metrics import MetricsLog

STEP = "time_step_s"


def read_run(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(metrics.jsonl records, eval.jsonl records) of one run."""
    from pipeline.report.plots import load_metrics

    return load_metrics(run_dir), MetricsLog(run_dir, "eval.jsonl").read()


def run_stats(records: list[dict], evals: list[dict]) -> dict:
    """One run: totals, the phase split, rollout per generated token, the last evaluation."""
    steps = [r[STEP] for r in records]
    warmup = sum(float(v) for r in records for k, v in r.items()
                 if k.startswith("time_warmup_") and k.endswith("_s"))
    total = sum(steps) + warmup
    phases: dict[str, float] = {}
    for r in records:
        for key, value in r.items():
            if key.startswith("time_") and key.endswith("_s") and key != STEP:
                phases[key[5:-2]] = phases.get(key[5:-2], 0.0) + float(value)
    phases["other"] = max(0.0, total - sum(phases.values()))
    tokens = sum(r.get("gen_tokens", 0) for r in records)
    taus = [r["spec_tau"] for r in records if "spec_tau" in r]
    last = evals[-1] if evals else {}
    return {
        "steps": len(records), "total_s": round(total, 3), "warmup_s": round(warmup, 3),
        "passes": _passes(records, "spec_passes"),
        "critical_passes": _passes(records, "spec_critical_passes"),
        "step_time_median_s": round(statistics.median(steps), 4),
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "rollout_share": round(phases.get("rollout", 0.0) / total, 4) if total else 0.0,
        "gen_tokens": tokens,
        "rollout_ms_per_token": round(1e3 * phases.get("rollout", 0.0) / tokens, 4) if tokens else None,
        "spec_tau_mean": round(statistics.fmean(taus), 3) if taus else None,
        "final_heldout": {k: v for k, v in last.items() if not k.startswith("per_prompt_")},
        "by_epoch": by_epoch(records),
    }


def _passes(records: list[dict], key: str) -> float | None:
    """`key` summed over the steps and the warm-up (`warmup_` + key); None without
    speculation metrics."""
    if not any(key in r for r in records):
        return None
    return round(sum(float(r.get(key, 0)) + float(r.get(f"warmup_{key}", 0)) for r in records), 3)


def by_epoch(records: list[dict]) -> dict:
    """Rollout seconds, generated tokens, ms per token and mean tau per epoch (str keys):
    epoch 0 has no history to draft from, later epochs do."""
    out: dict[str, dict] = {}
    for r in records:
        e = out.setdefault(str(r.get("epoch", 0)), {"steps": 0, "rollout_s": 0.0, "gen_tokens": 0,
                                                    "taus": []})
        e["steps"] += 1
        e["rollout_s"] += float(r.get("time_rollout_s", 0.0))
        e["gen_tokens"] += int(r.get("gen_tokens", 0))
        if "spec_tau" in r:
            e["taus"].append(r["spec_tau"])
    for e in out.values():
        taus = e.pop("taus")
        e["rollout_s"] = round(e["rollout_s"], 3)
        e["rollout_ms_per_token"] = round(1e3 * e["rollout_s"] / e["gen_tokens"], 4) if e["gen_tokens"] else None
        e["spec_tau_mean"] = round(statistics.fmean(taus), 3) if taus else None
    return out


def arm_summary(runs: list[dict], records: list[list[dict]], evals: list[list[dict]],
                overrides: list[str]) -> dict:
    """One arm over its seeds: medians, the phase split, mean curves."""
    all_steps = [r[STEP] for rs in records for r in rs]
    phase_names = list(dict.fromkeys(k for run in runs for k in run["phases_s"]))
    n_steps = len(all_steps)
    per_step = {k: sum(run["phases_s"].get(k, 0.0) for run in runs) / n_steps for k in phase_names}
    step_mean = sum(all_steps) / n_steps
    return {
        "overrides": overrides,
        "seeds": [run["seed"] for run in runs],
        "step_time_median_s": round(statistics.median(all_steps), 4),
        "total_s": ratio_summary([run["total_s"] for run in runs]),
        "phases_s_per_step": {k: round(v, 4) for k, v in per_step.items()},
        "phase_share": {k: round(v / step_mean, 4) for k, v in per_step.items()},
        "rollout_share": round(per_step.get("rollout", 0.0) / step_mean, 4),
        "curves": _curves(records),
        "heldout": _heldout_curves(evals),
        "runs": runs,
    }


def summarize(plan, results) -> dict:
    """plan: `e2e.Plan`; results: its `RunResult`s. The bench's JSON object:

    {"arms": {"baseline": {...}, "accelerated": {...}},
     "speedup_e2e": {"median", "min", "max"},           baseline / accelerated step time
     "speedup_rollout": {"median", "min", "max", "per_token": {...}, "rollout_share_baseline",
                         "amdahl_bound", "e2e_over_bound"},
     "passes_over_baseline", "critical_passes_over_baseline": {"median", "min", "max"},
                                                         accelerated / baseline target passes
                                                         (both arms speculating only)
     "heldout_diff": {"mean", "ci95", "p", ...}}         final mean@k reward, acc. - base.
    Per-seed ratios pair each seed's two runs (neighbours in time).
    """
    by = {(r.arm, r.seed): r for r in results}
    arms, per_prompt = {}, {}
    for arm in ("baseline", "accelerated"):
        runs, records, evals = [], [], []
        for seed in plan.seeds:
            result = by[(arm, seed)]
            recs, evs = read_run(result.run_dir)
            stats = run_stats(recs, evs)
            runs.append({"seed": seed, "run_dir": str(result.run_dir),
                         "wall_s": round(result.wall_s, 2), **stats})
            records.append(recs)
            evals.append(evs)
        arms[arm] = arm_summary(runs, records, evals, plan.arm_overrides(arm))
        per_prompt[arm] = [e[-1].get("per_prompt_reward") if e else None for e in evals]
    base, acc = arms["baseline"]["runs"], arms["accelerated"]["runs"]
    e2e = [b["total_s"] / a["total_s"] for b, a in zip(base, acc)]
    rollout = [b["phases_s"]["rollout"] / a["phases_s"]["rollout"] for b, a in zip(base, acc)]
    per_token = [b["rollout_ms_per_token"] / a["rollout_ms_per_token"] for b, a in zip(base, acc)
                 if b["rollout_ms_per_token"] and a["rollout_ms_per_token"]]
    share = statistics.median(b["rollout_share"] for b in base)
    speedup_rollout = ratio_summary(rollout)
    bound = amdahl_bound(share, speedup_rollout["median"])
    speedup_e2e = ratio_summary(e2e)
    speedup_rollout.update({
        "per_token": ratio_summary(per_token), "rollout_share_baseline": round(share, 4),
        "amdahl_bound": round(bound, 4),
        "e2e_over_bound": round(speedup_e2e["median"] / bound, 4)})
    return {"arms": arms, "speedup_e2e": speedup_e2e, "speedup_rollout": speedup_rollout,
            **{f"{key}_over_baseline": ratio_summary([a[key] / b[key] for b, a in zip(base, acc)])
               for key in ("passes", "critical_passes")
               if all(r[key] for r in base) and all(r[key] is not None for r in acc)},
            "heldout_diff": heldout_diff(per_prompt)}


def heldout_diff(per_prompt: dict) -> dict:
    """compare_heldout on the final per-prompt mean@k reward of every run; an explanation
    instead of numbers when the runs have no mean@k evaluation."""
    base, acc = per_prompt["baseline"], per_prompt["accelerated"]
    if any(v is None for v in base + acc):
        return {"mean": None, "ci95": None, "p": None,
                "note": "no mean@k evaluation in some run (run.eval_n=0 or no held-out prompts)"}
    return {"metric": "final held-out mean@k reward, accelerated - baseline",
            **compare_heldout(base, acc)}


def _curves(records: list[list[dict]]) -> dict:
    """Per step, across seeds: mean training reward and accuracy, median step seconds."""
    steps = sorted({r["step"] for rs in records for r in rs})
    by_step = {s: [r for rs in records for r in rs if r["step"] == s] for s in steps}
    return {"step": steps,
            "reward_mean": [round(statistics.fmean(r["reward_mean"] for r in by_step[s]), 4) for s in steps],
            "accuracy": [round(statistics.fmean(r["accuracy"] for r in by_step[s]), 4) for s in steps],
            "time_step_s": [round(statistics.median(r[STEP] for r in by_step[s]), 4) for s in steps],
            "time_rollout_s": [round(statistics.median(r.get("time_rollout_s", 0.0) for r in by_step[s]), 4)
                               for s in steps]}


def _heldout_curves(evals: list[list[dict]]) -> dict:
    """Per evaluation step, across seeds: mean of mean@k reward and accuracy with the SE of
    that mean (per-run SEs combined: sqrt(sum se^2) / seeds), and greedy accuracy."""
    steps = sorted({e["step"] for es in evals for e in es})
    out: dict[str, list] = {"step": steps, "greedy_accuracy": []}
    for key in ("mean_at_k_reward", "mean_at_k_accuracy"):
        out[key], out[f"{key}_se"] = [], []
    for s in steps:
        rows = [e for es in evals for e in es if e["step"] == s]
        out["greedy_accuracy"].append(round(statistics.fmean(e["accuracy"] for e in rows), 4))
        for key in ("mean_at_k_reward", "mean_at_k_accuracy"):
            have = [e for e in rows if key in e]
            out[key].append(round(statistics.fmean(e[key] for e in have), 4) if have else None)
            out[f"{key}_se"].append(round(sum(e[f"{key}_se"] ** 2 for e in have) ** 0.5 / len(have), 4)
                                    if have else None)
    return out
