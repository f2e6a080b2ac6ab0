"""When the loop asks vLLM for logprobs (the sampler check), and what training gets then."""

from __future__ import annotations

import pytest
import torch

from pipeline.config import load_config
from pipeline.config.load import ConfigError
from pipeline.loop.rollouts import Rollout, to_batch
from pipeline.loop.step import sampling
from pipeline.rollout.contract import Completion
from pipeline.tasks.prompts import Prompt


def checked(every: int, steps: range) -> list[int]:
    cfg = load_config(None, [f"rollout.logprob_check_every={every}"])
    return [s for s in steps if sampling(cfg, s).logprobs]


def test_every_nth_step_by_step_number():
    assert checked(10, range(25)) == [0, 10, 20]
    # a run resumed at step 13 checks the steps an uninterrupted run checks
    assert checked(10, range(13, 25)) == [20]
    assert checked(1, range(5)) == [0, 1, 2, 3, 4]
    assert checked(0, range(25)) == []  # never


def test_the_check_does_not_change_the_seeds():
    on = load_config(None, ["rollout.logprob_check_every=1"])
    off = load_config(None, ["rollout.logprob_check_every=0"])
    assert sampling(on, 10).seed == sampling(off, 10).seed != sampling(on, 11).seed


def test_a_negative_interval_is_refused():
    with pytest.raises(ConfigError, match="logprob_check_every"):
        load_config(None, ["rollout.logprob_check_every=-1"])


def rollout(pid: str, prompt: list[int], tokens: list[int], logprobs: list[float]) -> Rollout:
    return Rollout(Prompt(pid, "p", "a"), prompt, 0,
                   Completion("r", tokens, logprobs, "stop", 0.0), reward=float(len(tokens)))


def test_batch_carries_sampler_logprobs_only_when_every_response_has_them():
    with_lp = [rollout("a", [1, 2], [3, 4, 5], [-0.1, -0.2, -0.3]),
               rollout("a", [1, 2], [6], [-0.4])]
    b = to_batch(with_lp, 0, "grpo")
    # column j scores token j + 1: the response starts at column len(prompt) - 1
    assert torch.allclose(b.sampler_logprobs[0], torch.tensor([0.0, -0.1, -0.2, -0.3]))
    assert torch.allclose(b.sampler_logprobs[1], torch.tensor([0.0, -0.4, 0.0, 0.0]))
    without = [rollout("a", [1, 2], [3, 4, 5], []), rollout("a", [1, 2], [6], [])]
    bare = to_batch(without, 0, "grpo")
    assert bare.sampler_logprobs is None
    assert torch.equal(bare.input_ids, b.input_ids) and torch.equal(bare.advantages, b.advantages)
