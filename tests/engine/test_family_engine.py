"""The Qwen2 stand-in of `init-model --family qwen2` on the real engine: vLLM loads it
through the rollout adapter, stops a chat-templated greedy response at <|im_end|>, and
agrees with transformers token for token (biases, GQA, rotary, untied and padded vocab)."""

from __future__ import annotations

import json

import pytest

QUESTIONS = 6


@pytest.fixture(scope="module")
def engine(qwen2_model):
    from pipeline.config.schema import ModelConfig, RolloutConfig
    from pipeline.rollout.engine import RolloutEngine

    return RolloutEngine(ModelConfig(path=str(qwen2_model)), RolloutConfig(), max_model_len=512, seed=0)


def test_the_folder_is_a_qwen2_release(qwen2_model):
    config = json.loads((qwen2_model / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"] is False
    manifest = json.loads((qwen2_model / "rhymectl_model.json").read_text())
    assert manifest["special_tokens"] == {"<|endoftext|>": 8192, "<|im_start|>": 8193, "<|im_end|>": 8194}
    assert manifest["vocab"] == {"tokenizer": 8195, "embedding_rows": 8320}
    assert json.loads((qwen2_model / "generation_config.json").read_text())["eos_token_id"] == [8194, 8192]
    assert manifest["sft"]["loss_last"] < manifest["sft"]["loss_first"] / 3


def test_greedy_chat_responses_stop_at_im_end_and_match_transformers(engine, qwen2_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.policy.family_build import chat_prompt
    from pipeline.policy.sft import greedy_generate
    from pipeline.rollout.engine import Sampling
    from pipeline.tasks.math_rewards import FORMAT_CREDIT, gsm8k_reward
    from pipeline.tasks.sample_data import sample_split

    tok = AutoTokenizer.from_pretrained(qwen2_model)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    rows = sample_split("gsm8k")["test"][:QUESTIONS]
    prompts = [chat_prompt(tok, r["question"]) for r in rows]
    groups = engine.generate([tok(p, add_special_tokens=False)["input_ids"] for p in prompts],
                             Sampling(n=1, temperature=0.0, max_tokens=200)).groups
    completions = [g[0] for g in groups]
    assert [(c.finish_reason, c.token_ids[-1]) for c in completions] == [("stop", im_end)] * QUESTIONS
    assert all(im_end not in c.token_ids[:-1] for c in completions)
    texts = [tok.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    rewards = [gsm8k_reward(r["question"], t, r["answer"], partial_credit=True) for r, t in zip(rows, texts)]
    assert min(rewards) >= FORMAT_CREDIT, texts  # an answer in GSM8K's format, right or not
    hf = AutoModelForCausalLM.from_pretrained(qwen2_model)
    assert greedy_generate(hf, tok, prompts, 200, add_special_tokens=False, stop_ids=[im_end]) == texts
