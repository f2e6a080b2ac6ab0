"""Held-out evaluation: greedy accuracy and mean@k at the rollout temperature, with
standard errors over prompts, on a fixed reward with known answers (a scripted engine
stands in for vLLM: this tests the arithmetic and the plumbing, not the sampler)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.config import load_config
from pipeline.loop import evaluate as ev
from pipeline.tasks.chat import PromptEncoder, PromptFormat
from pipeline.tasks.prompts import Prompt
from pipeline.rollout.contract import Completion, RolloutResult, RolloutStats

REPO_CONFIG = Path(__file__).resolve().parents[2] / "sample_configs/tiny.yaml"


class CharTokenizer:
    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class ScriptedEngine:
    """Greedy: the right answer for prompts whose answer is in `greedy_right`. Sampled
    (temperature > 0): the i-th of k samples is right when i < right[prompt]."""

    def __init__(self, greedy_right: set[str], right: dict[str, int]):
        self.greedy_right, self.right, self.calls = greedy_right, right, []

    def generate(self, prompt_ids, spec):
        self.calls.append(spec)
        groups = []
        for ids in prompt_ids:
            answer = "".join(chr(i) for i in ids).split(":")[1]
            if spec.temperature == 0:
                texts = [answer if answer in self.greedy_right else "x"]
            else:
                texts = [answer if i < self.right[answer] else "x" for i in range(spec.n)]
            groups.append([Completion(str(j), [ord(c) for c in t], [0.0] * len(t), "stop", 0.0)
                           for j, t in enumerate(texts)])
        return RolloutResult(groups, RolloutStats())


def reward(prompt: str, response: str, answer: str) -> float:
    """1 for the exact answer, 0.25 for anything else."""
    return 1.0 if response == answer else 0.25


def context(engine, k: int, temperature: float = 0.7):
    cfg = load_config(REPO_CONFIG, [f"run.eval_n={k}", f"rollout.temperature={temperature}"])
    return SimpleNamespace(cfg=cfg, rank=0, world_size=1, tp=None, engine=engine,
                           encoder=PromptEncoder(CharTokenizer(), PromptFormat(None, None, "none")),
                           reward_fn=reward)


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    monkeypatch.setattr(ev.dist, "all_gather", lambda obj: [obj])


def test_mean_at_k_on_known_answers():
    # four prompts, k = 4; right samples per prompt 4, 2, 1, 0 -> accuracy 1, .5, .25, 0
    answers = ["a", "b", "c", "d"]
    prompts = [Prompt(f"p{i}", f"q:{a}", a) for i, a in enumerate(answers)]
    engine = ScriptedEngine({"a", "b"}, {"a": 4, "b": 2, "c": 1, "d": 0})
    out = ev.evaluate(context(engine, 4), prompts)

    per_acc = [1.0, 0.5, 0.25, 0.0]
    per_reward = [a + (1 - a) * 0.25 for a in per_acc]
    assert out["per_prompt_accuracy"] == per_acc
    assert out["per_prompt_reward"] == pytest.approx(per_reward)
    assert out["mean_at_k_accuracy"] == pytest.approx(0.4375)
    sd = math.sqrt(sum((a - 0.4375) ** 2 for a in per_acc) / 3)
    assert out["mean_at_k_accuracy_se"] == pytest.approx(sd / 2)
    assert out["mean_at_k_reward"] == pytest.approx(sum(per_reward) / 4)
    assert out["mean_at_k_reward_se"] == pytest.approx(0.75 * sd / 2)  # reward = .25 + .75 acc
    # greedy: two of four right
    assert out["accuracy"] == 0.5 and out["reward_mean"] == pytest.approx((1 + 1 + .25 + .25) / 4)
    assert out["accuracy_se"] == pytest.approx(math.sqrt(0.25 / 4))
    assert out["k"] == 4 and out["prompts"] == 4 and out["temperature"] == 0.7
    greedy, sampled = engine.calls
    assert greedy.temperature == 0 and greedy.n == 1
    assert sampled.n == 4 and sampled.temperature == 0.7 and sampled.seed is not None


def test_eval_n_zero_is_greedy_only():
    prompts = [Prompt("p0", "q:a", "a")]
    engine = ScriptedEngine({"a"}, {"a": 1})
    out = ev.evaluate(context(engine, 0), prompts)
    assert len(engine.calls) == 1 and "mean_at_k_reward" not in out and out["accuracy"] == 1.0


def test_the_same_seed_at_every_evaluation():
    """Common random numbers: step 0 and step N draw from the same streams."""
    prompts = [Prompt("p0", "q:a", "a")]
    engine = ScriptedEngine(set(), {"a": 1})
    ctx = context(engine, 2)
    ev.evaluate(ctx, prompts)
    ev.evaluate(ctx, prompts)
    assert engine.calls[1].seed == engine.calls[3].seed


def test_rank_shares_are_put_back_in_prompt_order():
    # prompts 0..4 over 2 ranks: rank 0 had 0, 2, 4; rank 1 had 1, 3
    assert ev._interleave([[0, 2, 4], [1, 3]]) == [0, 1, 2, 3, 4]
    assert ev._interleave([[], []]) == []


def test_mean_se():
    assert ev.mean_se([]) == (0.0, 0.0)
    assert ev.mean_se([0.3]) == (0.3, 0.0)
    m, se = ev.mean_se([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and se == pytest.approx(math.sqrt(5 / 3 / 4))


def test_eval_n_is_validated():
    with pytest.raises(Exception, match="run.eval_n"):
        load_config(REPO_CONFIG, ["run.eval_n=-1"])
