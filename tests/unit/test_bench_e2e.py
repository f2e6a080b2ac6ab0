"""bench e2e without engines: the run order, override validation (exit 2 naming the key),
and the report's shape and arithmetic from hand-written run directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.bench.e2e import Plan, RunResult, parse_seeds
from pipeline.bench.e2e_summary import summarize
from pipeline.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def plan(tmp_path, seeds=(0, 1)) -> Plan:
    return Plan(REPO / "sample_configs/tiny.yaml", ("rollout.n=4",),
                ("spec.method=none", "sched.policy=static"), 2, seeds, 1, tmp_path)


def test_arms_alternate_across_seeds_and_get_their_overrides(tmp_path):
    p = plan(tmp_path, seeds=(3, 4, 5))
    assert p.order() == [("baseline", 3), ("accelerated", 3), ("accelerated", 4),
                         ("baseline", 4), ("baseline", 5), ("accelerated", 5)]
    base = p.arm_overrides("baseline", 4)
    assert base[:3] == ["rollout.n=4", "spec.method=none", "sched.policy=static"]
    assert "run.seed=4" in base and f"run.dir={tmp_path / 'baseline-seed4'}" in base
    acc = p.arm_overrides("accelerated", 4)
    assert "spec.method=none" not in acc and "train.total_steps=2" in acc


def test_parse_seeds():
    assert parse_seeds("0,1, 2") == (0, 1, 2)
    for bad in ("", "a,b", "1,1"):
        with pytest.raises(UsageError, match="--seeds"):
            parse_seeds(bad)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "rhymectl", "bench", "e2e",
                           str(REPO / "sample_configs/tiny.yaml"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("baseline, message", [
    ("spec.methd=none", "error: --baseline: unknown key spec.methd in spec; did you mean spec.method?"),
    ("spec.method=fast", "error: --baseline: spec.method"),
    ("sched.policy", "error: --baseline: override 'sched.policy' is not key=value"),
    ("", "error: --baseline is empty"),
])
def test_a_bad_baseline_exits_2_naming_the_key(tmp_path, baseline, message):
    proc = cli("--baseline", baseline, "--run-dir", str(tmp_path / "b"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(message), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


def test_a_baseline_that_changes_nothing_is_refused(tmp_path):
    proc = cli("--baseline", "spec.method=history+group", "--run-dir", str(tmp_path / "b"))
    assert proc.returncode == 2 and "changes nothing" in proc.stderr


def test_bad_steps_and_seeds_exit_2(tmp_path):
    assert "--steps 0" in cli("--steps", "0").stderr
    proc = cli("--seeds", "x")
    assert proc.returncode == 2 and "--seeds" in proc.stderr


def write_run(run_dir: Path, step_s: float, rollout_s: float, tokens: int, per_prompt: list[float]):
    run_dir.mkdir(parents=True)
    rows = [{"step": s, "reward_mean": 0.5 + 0.1 * s, "accuracy": 0.4, "gen_tokens": tokens,
             "time_rollout_s": rollout_s, "time_train_s": step_s - rollout_s - 0.1,
             "time_sync_s": 0.1, "time_step_s": step_s} for s in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"step": s, "prompts": len(per_prompt), "accuracy": 0.5, "reward_mean": 0.6, "k": 4,
              "mean_at_k_reward": sum(per_prompt) / len(per_prompt), "mean_at_k_reward_se": 0.01,
              "mean_at_k_accuracy": 0.5, "mean_at_k_accuracy_se": 0.02,
              "per_prompt_reward": per_prompt} for s in (0, 2)]
    (run_dir / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


def test_summary_shape_and_arithmetic(tmp_path):
    p = plan(tmp_path)
    results = []
    # baseline: 4 s steps, 2 s rollout; accelerated: 3 s steps (seed 0) / 2.5 s (seed 1), 1 s rollout
    for seed, acc_step in ((0, 3.0), (1, 2.5)):
        write_run(p.run_dir("baseline", seed), 4.0, 2.0, 1000, [0.5, 0.6, 0.7 + 0.01 * seed])
        write_run(p.run_dir("accelerated", seed), acc_step, 1.0, 800, [0.5, 0.63, 0.7 - 0.01 * seed])
        results += [RunResult("baseline", seed, p.run_dir("baseline", seed), 30.0),
                    RunResult("accelerated", seed, p.run_dir("accelerated", seed), 25.0)]
    report = summarize(p, results)
    assert set(report) == {"arms", "speedup_e2e", "speedup_rollout", "heldout_diff"}  # no passes
    assert set(report["arms"]) == {"baseline", "accelerated"}
    assert set(report["speedup_e2e"]) == {"median", "min", "max"}
    assert {"mean", "ci95", "p"} <= set(report["heldout_diff"]) and len(report["heldout_diff"]["ci95"]) == 2
    assert report["speedup_e2e"] == {"median": pytest.approx((8 / 6 + 8 / 5) / 2, abs=1e-4),
                                     "min": pytest.approx(8 / 6, abs=1e-4), "max": 1.6}
    ro = report["speedup_rollout"]
    assert ro["median"] == 2.0 and ro["per_token"]["median"] == pytest.approx(2.0 / 1.25, abs=1e-4)
    assert ro["rollout_share_baseline"] == 0.5 and ro["amdahl_bound"] == pytest.approx(4 / 3, abs=1e-4)
    base = report["arms"]["baseline"]
    assert base["step_time_median_s"] == 4.0 and base["total_s"]["median"] == 8.0
    assert base["rollout_share"] == 0.5
    assert base["phases_s_per_step"] == {"rollout": 2.0, "train": 1.9, "sync": 0.1, "other": 0.0}
    assert base["curves"]["reward_mean"] == [0.6, 0.7] and base["heldout"]["step"] == [0, 2]
    assert base["runs"][0]["by_epoch"] == {"0": {"steps": 2, "rollout_s": 4.0, "gen_tokens": 2000,
                                                 "rollout_ms_per_token": 2.0, "spec_tau_mean": None}}
    d = report["heldout_diff"]
    assert d["mean"] == pytest.approx((0.5 + 0.63 + 0.695) / 3 - (0.5 + 0.6 + 0.705) / 3, abs=1e-6)
    assert d["ci95"][0] < d["mean"] < d["ci95"][1] and 0 <= d["p"] <= 1 and d["runs"] == [2, 2]


def test_the_warm_up_is_paid_in_the_total_time_and_the_passes(tmp_path):
    """A draft warm-up before the first step counts once: its seconds in total_s (not in the
    step times), its rollout's passes in passes and critical_passes, whose ratios to the
    baseline's are reported per seed."""
    p = plan(tmp_path, seeds=(0,))
    write_run(p.run_dir("baseline", 0), 4.0, 2.0, 1000, [0.5, 0.6])
    write_run(p.run_dir("accelerated", 0), 3.0, 1.0, 1000, [0.5, 0.6])
    for arm, passes, warm in (("baseline", 100, None), ("accelerated", 60, 30)):
        path = p.run_dir(arm, 0) / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for r in rows:
            r.update(spec_passes=passes, spec_critical_passes=passes // 2)
        if warm:
            rows[0].update(warmup_spec_passes=warm, warmup_spec_critical_passes=warm // 3,
                           time_warmup_rollout_s=1.5, time_warmup_train_s=0.5)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = summarize(p, [RunResult("baseline", 0, p.run_dir("baseline", 0), 30.0),
                           RunResult("accelerated", 0, p.run_dir("accelerated", 0), 25.0)])
    acc = report["arms"]["accelerated"]["runs"][0]
    assert acc["total_s"] == 8.0 and acc["warmup_s"] == 2.0 and acc["step_time_median_s"] == 3.0
    assert acc["passes"] == 150 and acc["critical_passes"] == 70
    assert report["passes_over_baseline"]["median"] == 0.75
    assert report["critical_passes_over_baseline"]["median"] == 0.7
    assert report["speedup_e2e"]["median"] == 1.0  # 8 s each: the warm-up ate the gain
