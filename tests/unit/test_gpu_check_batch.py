"""scripts/gpu_check.py builds its synthetic rollouts' Batch without pipeline.loop (whose
data stack a bare GPU machine lacks): it must equal what `to_batch` builds from the same
rollouts, or the GPU check would train on something the loop never feeds the actor."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from pipeline.loop.rollouts import Rollout, to_batch
from pipeline.rollout.contract import Completion
from pipeline.tasks.prompts import Prompt

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def loop_rollouts(groups) -> list[Rollout]:
    out = []
    for g, group in enumerate(groups):
        prompt = Prompt(f"p{g}", f"prompt {g}", "")
        for k, (ids, lps, reward) in enumerate(zip(group.responses, group.logprobs,
                                                   group.rewards)):
            completion = Completion(f"{g}-{k}", ids, lps, "length", 0.0)
            out.append(Rollout(prompt, group.prompt, k, completion, reward=reward))
    return out


@pytest.mark.parametrize("size", ["SMOKE", "FULL"])
def test_the_synthetic_batch_is_the_loops_batch(gpu_check, size):
    groups = gpu_check.synthetic_groups(getattr(gpu_check, size))
    mine = gpu_check.to_batch(groups, pad_id=7, adv_estimator="grpo")
    theirs = to_batch(loop_rollouts(groups), pad_id=7, adv_estimator="grpo")
    for field in ("input_ids", "prompt_lens", "total_lens", "advantages", "sampler_logprobs"):
        assert torch.equal(getattr(mine, field), getattr(theirs, field)), field


def test_one_micro_batch_is_as_wide_as_the_memory_plan_assumes(gpu_check):
    size = gpu_check.FULL
    batch = gpu_check.to_batch(gpu_check.synthetic_groups(size), 0, "grpo")
    assert batch.size == size.prompts * size.n
    assert batch.input_ids.shape[1] == size.max_prompt + size.max_tokens
    assert bool((batch.advantages != 0).all())  # random rewards: every group carries signal


def test_a_check_whose_input_failed_is_skipped(gpu_check, capsys):
    report = gpu_check.Report()

    def broken():
        raise gpu_check.Failed("no")

    report.run("a", broken)
    report.run("b", lambda: "ran", needs=("a",))
    report.run("c", lambda: "ran")
    assert capsys.readouterr().out.splitlines() == ["FAIL a: no", "SKIP b: needs a", "PASS c: ran"]
    assert report.failed == ["a"]
