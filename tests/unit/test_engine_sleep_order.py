"""The step drives vLLM's sleep mode in the order vLLM defines.

`SleepingLLM` stands in for `vllm.LLM` with the semantics of its sleep levels
(`vllm/entrypoints/llm.py`, `vllm/v1/worker/gpu_worker.py`): level 1 copies the weights to
the host and discards the KV cache, level 2 discards both, `wake_up(tags)` re-allocates
(level 1: the backed-up weights come back; level 2: garbage until weights are loaded).
It refuses to generate unless fully awake with loaded weights, and to load weights into
memory that is asleep. The real adapter (`RolloutEngine`, sleep mode on, as on CUDA) and
the real step (`rl_step`) run two steps and an evaluation around it: every rollout must
sample the policy the trainer produced last.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.unit.vllm_runner_stand_in import runner_stand_in
from pipeline.config import load_config
from pipeline.loop.batches import PromptSource
from pipeline.loop.context import Context
from pipeline.loop.evaluate import evaluate
from pipeline.loop.step import rl_step
from pipeline.rollout.engine import RolloutEngine
from pipeline.rollout.residency import EngineAsleep
from pipeline.tasks.chat import PromptEncoder, PromptFormat
from pipeline.tasks.prompts import Prompt

CONFIG = Path(__file__).resolve().parents[2] / "sample_configs/tiny.yaml"


class SleepingLLM:
    def __init__(self):
        self.weights: str | None = "policy-0"  # what the weight memory holds
        self.where = "device"  # device | host (level 1) | gone (level 2)
        self.kv_cache = True
        self.backup: str | None = None
        self.sampled: list[str] = []  # the weights each generate call sampled from
        self.calls: list[str] = []
        runner = runner_stand_in(self._reload)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner))))

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(f"sleep({level})")
        if level == 1:
            self.backup, self.where = self.weights, "host"
        else:
            self.weights, self.where = None, "gone"
        self.kv_cache = False

    def wake_up(self, tags=None) -> bool:
        tags = list(tags or ["weights", "kv_cache"])
        self.calls.append(f"wake_up({','.join(tags)})")
        if "weights" in tags and self.where != "device":
            self.weights = self.backup if self.where == "host" else "garbage"
            self.where = "device"
        if "kv_cache" in tags:
            self.kv_cache = True
        return self.where == "device" and self.kv_cache

    def _reload(self, weights_iterator) -> None:
        assert self.where == "device", "weights loaded into memory that is asleep"
        for name, tensor in weights_iterator:
            self.weights = f"policy-{int(tensor.item())}"
        self.calls.append("load")

    def reset_prefix_cache(self, *args) -> bool:
        return True

    def generate(self, requests, params, use_tqdm=False):
        assert self.where == "device" and self.kv_cache, "generate while asleep"
        assert self.weights not in (None, "garbage"), "generate with discarded weights"
        self.sampled.append(self.weights)
        self.calls.append("generate")
        return [SimpleNamespace(request_id=str(i), metrics=None, outputs=[SimpleNamespace(
            token_ids=[5, 6], logprobs=None, finish_reason="stop")]) for i in range(len(requests))]


class CharTokenizer:
    pad_token_id, eos_token_id = 0, 1

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 50 + 2 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i + 60) for i in ids)


class CountingActor:
    """The trainer's side: each update makes policy `version + 1`."""

    teacher_k = 0  # no draft model to teach

    def __init__(self):
        self.version = 0

    def update(self, batch, keep_policy: bool = False) -> dict:
        self.version += 1
        return {"loss": 0.0}

    def take_teachers(self) -> list:
        return []

    def named_weights(self):
        yield "w", torch.tensor(float(self.version))


def context(tmp_path, llm) -> Context:
    cfg = load_config(CONFIG, ["rollout.n=2", "data.train_batch_size=2", "train.ppo_mini_batch_size=2",
                                  "run.eval_n=0"])
    engine = RolloutEngine.__new__(RolloutEngine)
    engine._bind(llm, None, sleep_mode=True)  # sleep mode on, as with CUDA
    rows = [{"id": str(i), "prompt": f"sort {i}{i + 1}:", "answer": "x"} for i in range(4)]
    return Context(cfg, 0, 1, engine, CountingActor(), PromptEncoder(
        CharTokenizer(), PromptFormat(None, None, "none")), PromptSource(rows, 2, 0),
        lambda prompt, response, answer: 0.5, tmp_path)


def test_every_rollout_samples_the_policy_trained_last(one_rank, tmp_path):
    llm = SleepingLLM()
    ctx = context(tmp_path, llm)
    for step in range(2):
        rl_step(ctx, step)
    evaluate(ctx, [Prompt("e", "sort 9:", "x")])
    assert llm.sampled == ["policy-0", "policy-1", "policy-2"]
    assert llm.calls == ["generate", "sleep(2)", "wake_up(weights)", "load",
                         "wake_up(kv_cache)"] * 2 + ["generate"]


def test_generating_while_asleep_is_refused_before_vllm_is_asked(one_rank, tmp_path):
    llm = SleepingLLM()
    ctx = context(tmp_path, llm)
    ctx.engine.sleep()
    with pytest.raises(EngineAsleep, match="kv_cache and weights are asleep"):
        evaluate(ctx, [Prompt("e", "sort 9:", "x")])
    ctx.engine.residency.wake(["weights", "kv_cache"])  # awake, but no weights loaded
    with pytest.raises(EngineAsleep, match="no new ones were loaded"):
        evaluate(ctx, [Prompt("e", "sort 9:", "x")])
    assert "generate" not in llm.calls


def test_the_stand_in_catches_the_level_one_order():
    """The stand-in can fail: sleeping at level 1 after the rollout, loading into the
    sleeping engine and then waking restores the old policy (or loads into nothing)."""
    llm = SleepingLLM()
    llm.sleep(level=1)
    with pytest.raises(AssertionError, match="asleep"):
        llm._reload(iter([("w", torch.tensor(1.0))]))
    llm.wake_up()
    llm.generate([0], None)
    assert llm.sampled == ["policy-0"]  # the backed-up, old weights
