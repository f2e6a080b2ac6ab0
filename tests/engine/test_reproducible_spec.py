"""Reproducible speculation on the real engines: a seeded run under history+group+model at
T = 1 with the critical budget (whose caps follow what it learnt) is the same run whatever
the drafter thread's timing, also when it is killed after a checkpoint and resumed, with
or without the run's history index: token for token (docs/speculation.md, "Reproducible
speculation"). The draft model's warm-up before the first step, its online training, its
per-request choice and its checkpointed state are held to the same standard.

At T = 1 vLLM's rejection sampler draws its random numbers per draft position, so the
responses follow the drafts: equal histories need equal drafts, so equal tokens after a
resume also show that the drafter's history came back (from the index the resume
refreshed, or, without one, from the step files). Runs are compared on the sampled tokens
of every response and on each step's counts of target passes, draft tokens and accepted
tokens; seconds are not compared.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.drafting.background import DELAY_ENV

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import run_audit as audit  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.deepspeed]

STEPS = 4
ARGS = ["data.train_size=8", "data.train_batch_size=4", "train.ppo_mini_batch_size=4",
        "rollout.n=4", "rollout.max_tokens=64", "data.max_prompt_length=24", "data.eval_size=2",
        "rollout.temperature=1.0", f"train.total_steps={STEPS}",
        "run.checkpoint_every=2", "run.eval_every=0", "spec.budget=critical",
        "spec.method=history+group+model", "rollout.logprob_check_every=1",
        "spec.draft_warmup=rollout", "spec.draft_warmup_prompts=4",
        "spec.draft_warmup_updates=20"]
# what must match: the counts of each step's speculation, never its seconds
COUNTS = ("spec_passes", "spec_critical_passes", "spec_drafted_tokens",
          "spec_accepted_tokens", "spec_tau", "spec_tail_passes", "spec_model_chosen",
          "spec_model_drafted_tokens", "spec_model_accepted_tokens", "draft_loss_after",
          "draft_distilled_tokens", "spec_history_prompts", "warmup_spec_passes",
          "warmup_spec_accepted_tokens", "draft_warmup_loss_after")


def train(model: Path, run_dir: Path, env_extra: dict | None = None,
          fault: str | None = None, resume: bool = False) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("RHYMECTL_FAULT", DELAY_ENV)}
    env.update(env_extra or {})
    if fault:
        env["RHYMECTL_FAULT"] = fault
    cmd = [sys.executable, "-m", "rhymectl", "train", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={model}", f"run.dir={run_dir}", *ARGS]
    return subprocess.run(cmd + ["--resume"] * resume, capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=900)


def outcome(run_dir: Path) -> tuple[list, list]:
    """Every response's sampled tokens in order, and each step's speculation counts."""
    rows = sorted(audit.snapshot(run_dir)["history"],
                  key=lambda r: (r["step"], r["prompt_id"], r["sample_index"]))
    tokens = [(r["step"], r["prompt_id"], r["sample_index"], tuple(r["response_ids"])) for r in rows]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    counts = [{k: m.get(k) for k in COUNTS} for m in metrics]
    return tokens, counts


# The critical budget with the draft model: caps that follow what it learnt, and the model's
# choice. `tree` (which presumes the next drafts in the drafter thread) and `throughput` are
# held to the same under thread timing that differs between two ranks (test_tp_rollout:
# both ranks of a TP group draft alike under every budget), and presuming on, off and
# slowed at random by tests/unit/test_drafting_reproducible.py.
def test_a_slowed_killed_and_resumed_run_is_the_uninterrupted_run_token_for_token(tiny_model,
                                                                               tmp_path):
    """The critical budget (its calibration and rates learnt over steps 1-2) beside the
    draft model (trained after steps 1-2). The second run's drafter thread sleeps at random
    before each step of its jobs, so its waits fall at other points; it is SIGKILLed right
    after the step-2 checkpoint and resumed, slowed again, with the run's index (refreshed
    at the resume), and killed in step 4's rollout; its step 3 is the undisturbed run's.
    Then its index is deleted and it resumes from the step-2 checkpoint once more (its
    history read from the step files, with a warning): the same responses, passes and
    drafts as the undisturbed run, steps 1-2 (timing) and 3-4 (timing and resume)."""
    whole = tmp_path / "whole"
    proc = train(tiny_model, whole)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = outcome(whole)
    assert len(a[0]) == STEPS * 4 * 4 and len(a[1]) == STEPS
    assert sum(c["spec_accepted_tokens"] for c in a[1][2:]) > 0  # steps 3-4 drafted
    assert sum(c["spec_model_accepted_tokens"] for c in a[1][2:]) > 0  # the model too
    # the draft learnt the policy's distribution at every response token (spec.draft_distill)
    whole_metrics = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
    assert all(m["draft_distilled_tokens"] == m["gen_tokens"] > 0 for m in whole_metrics)
    # steps 3-4 (epoch 1) draft from their prompts' epoch-0 history; step 1 has none
    assert [c["spec_history_prompts"] for c in a[1]][::2] == [0, 4]
    # the draft warmed up first, on prompts the run does not train on, in the first row only
    assert "draft model warmed up on 16 responses" in proc.stderr
    warm = whole_metrics[0]
    assert warm["draft_warmup_loss_after"] < warm["draft_warmup_loss_before"]
    assert warm["warmup_spec_passes"] > 0 and warm["draft_warmup_distilled_tokens"] > 0
    assert not any(k.startswith(("warmup_", "draft_warmup_")) for m in whole_metrics[1:] for k in m)

    slowed = {DELAY_ENV: "0.002"}
    cut = tmp_path / "cut"
    proc = train(tiny_model, cut, slowed, fault="after_checkpoint_commit")
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert (cut / "checkpoints/step-000002/drafting/rank-0.json").is_file()
    assert (cut / "checkpoints/step-000002/drafting/model-rank-0.safetensors").is_file()
    proc = train(tiny_model, cut, slowed, fault="after_rollout:2", resume=True)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert "holds no drafter state" not in proc.stderr and "has no history index" not in proc.stderr
    assert "warmed up" not in proc.stderr  # its checkpoint holds the warmed-up draft
    b = outcome(cut)
    assert b[1][:2] == a[1][:2]  # steps 1-2 under other timing
    assert [t for t in b[0] if t[0] == 2] == [t for t in a[0] if t[0] == 2]  # step 3, resumed
    assert b[1][2] == a[1][2]

    shutil.rmtree(cut / "index")
    proc = train(tiny_model, cut, slowed, resume=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "has no history index" in proc.stderr
    assert outcome(cut) == a
    metrics = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert all(m["train_sampler_logprob_diff"] < 1e-4 for m in metrics)  # the trained weights
    meta = json.loads((cut / "index/meta.json").read_text())  # rebuilt by the last commit
    assert meta["last_step"] == STEPS - 1 and meta["rows"] == STEPS * 4 * 4
