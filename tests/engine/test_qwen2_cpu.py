"""`sample_configs/qwen2-cpu.yaml` on 2 ranks: a real model family (Qwen2 architecture,
byte-level BPE, ChatML chat template, untied embeddings, q/k/v and gate/up fused on vLLM's
side) on GSM8K-format rows with the gsm8k reward, under ZeRO-3 with a reference model and
gradient checkpointing, history+group drafts and seer placement.

- After every weight sync the engine samples from the weights the trainer holds: vLLM's
  log-probs of the sampled tokens equal the trainer's (`train_sampler_logprob_diff`, every
  step here). The learning rate is raised so that one stale or misnamed tensor would show:
  one step moves the policy by far more than the tolerance.
- A run resumed from its step-2 checkpoint writes, bit for bit, the rows an uninterrupted
  run writes (tokens, rewards, losses, evaluations; wall-clock fields aside, and the
  placement's timing-driven counters). The resumed run is a copy of the uninterrupted one
  without its step-3 checkpoint, so the resume must also cut back the step-3 rows on disk
  (every kill point on the way there is test_faults.py's, one process per point). This
  comparison runs without speculation: at temperature 1, vLLM's rejection sampler draws
  from each request's seeded generator a number of times that depends on the drafts, and
  the drafts depend on which siblings share an engine, which seer decides by timing; so
  two uninterrupted runs with drafts are equal in distribution, not token for token. (Greedy output is token-identical with and
  without drafts: `test_drafting_greedy_identity.py` runs it on this model too.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))  # run_audit sits next to scripts/kill_trials.py
import run_audit as audit  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.deepspeed]

CONFIG = REPO / "sample_configs/qwen2-cpu.yaml"
SMALL = ["train.total_steps=3", "run.checkpoint_every=2", "run.eval_every=0",
         "data.eval_size=4", "run.eval_n=1", "train.lr=1.0e-3"]
# timing-driven: seer's placement (migrations, chunks, its cost fit) and the bubble ratio
TIMING = ("sched_", "rollout_bubble_ratio", "rollout_migrations", "rollout_chunks")
# the sampler check against the previous policy, whose weights a checkpoint does not hold:
# the first step after a resume has nothing to compare with, as step 1 has not
PREVIOUS_POLICY = ("train_sampler_staleness", "train_sampler_logprob_diff_previous",
                   "train_sampler_policy_step")


def train(model: Path, run_dir: Path, *extra: str,
          resume: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RHYMECTL_FAULT"}
    cmd = [sys.executable, "-m", "rhymectl", "train", str(CONFIG), f"model.path={model}",
           f"run.dir={run_dir}", *SMALL, *extra, "--nproc", "2", *["--resume"] * resume]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(snap: dict) -> dict:
    return {**snap, "metrics": [{k: v for k, v in r.items() if not k.startswith(TIMING)}
                                for r in snap["metrics"]]}


def test_the_shipped_config_trains_on_two_ranks_with_the_sampler_in_step(qwen2_model, tmp_path):
    run_dir = tmp_path / "run"
    proc = train(qwen2_model, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = rows(run_dir)
    assert [r["step"] for r in metrics] == [1, 2, 3]
    for r in metrics:  # the fused-weight name mapping, after every sync
        assert r["train_sampler_logprob_diff"] < 1e-4, r
    assert metrics[-1]["train_kl"] > 0  # the policy moved away from the reference model
    assert sum(r["spec_accepted_tokens"] for r in metrics) > 0  # drafts were verified
    assert any(k.startswith("sched_") for k in metrics[0])  # seer placed the groups
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 3] and evals[0]["prompts"] == 4
    config = (run_dir / "config.yaml").read_text()
    assert "chat_template: auto" in config and "zero_stage: 3" in config


@pytest.mark.slow
def test_a_resumed_run_is_bit_identical_to_an_uninterrupted_one(qwen2_model, tmp_path):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    proc = train(qwen2_model, reference, "spec.method=none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.copytree(reference, resumed)
    shutil.rmtree(resumed / "checkpoints/step-000003")  # the step-2 checkpoint is the latest
    assert [r["step"] for r in rows(resumed)] == [1, 2, 3]
    proc = train(qwen2_model, resumed, "spec.method=none", resume=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (resumed / "checkpoints/step-000003/state.json").is_file()  # step 3 ran again
    want, got = without_timing(audit.snapshot(reference)), without_timing(audit.snapshot(resumed))
    first_resumed = got["metrics"][2]
    assert not any(k in first_resumed for k in PREVIOUS_POLICY), first_resumed
    assert all(k in want["metrics"][2] for k in PREVIOUS_POLICY), want["metrics"][2]
    for k in PREVIOUS_POLICY:
        want["metrics"][2].pop(k)
    assert audit.problems(audit.compare(want, got, exact=True)) == 0
    assert got == want
    assert all(r["train_sampler_logprob_diff"] < 1e-4 for r in rows(resumed))
