"""The tiny policy bootstrap and the vLLM adapter, on the real engine."""

from __future__ import annotations

import json

import pytest
import torch


def test_init_model_is_cached_and_deterministic(tiny_model, tmp_path):
    from dataclasses import replace

    from pipeline.policy.bootstrap import InitOptions, init_model

    manifest = json.loads((tiny_model / "rhymectl_model.json").read_text())
    assert 500_000 < manifest["parameters"] < 5_000_000
    assert manifest["sft"]["loss_last"] < manifest["sft"]["loss_first"]
    assert (tiny_model / "model.safetensors").is_file() and (tiny_model / "tokenizer.json").is_file()
    # Same spec → cache hit without rebuilding; two small builds with one seed are identical.
    spec = InitOptions(task="sort", seed=3, eval_rows=8, sft_rows=200)
    spec = replace(spec, sft=replace(spec.sft, steps=5, batch_tokens=256, target_loss=None,
                                     target_exact=None))
    a = init_model(tmp_path / "a", spec)
    b = init_model(tmp_path / "b", spec)
    assert not a["cached"] and init_model(tmp_path / "a", spec)["cached"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    other = replace(spec, seed=4)
    init_model(tmp_path / "c", other)
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != (tmp_path / "a" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def engine(tiny_model):
    from pipeline.config.schema import ModelConfig, RolloutConfig
    from pipeline.rollout.engine import RolloutEngine

    return RolloutEngine(ModelConfig(path=str(tiny_model)), RolloutConfig(), max_model_len=256, seed=0)


PROMPTS = ["sort 230:", "sort 98765:", "sort 4:", "sort 5151:", "sort 90210:"]


def greedy_pair(engine, model_dir, prompts, max_tokens=60):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.policy.sft import greedy_generate
    from pipeline.rollout.engine import Sampling

    tok = AutoTokenizer.from_pretrained(model_dir)
    groups = engine.generate([tok(p)["input_ids"] for p in prompts],
                             Sampling(n=1, temperature=0.0, max_tokens=max_tokens)).groups
    vllm_text = [tok.decode(g[0].token_ids, skip_special_tokens=True) for g in groups]
    hf = AutoModelForCausalLM.from_pretrained(model_dir)
    return vllm_text, greedy_generate(hf, tok, prompts, max_tokens), hf


def test_vllm_and_transformers_agree_greedily(engine, tiny_model):
    vllm_text, hf_text, _ = greedy_pair(engine, tiny_model, PROMPTS)
    assert vllm_text == hf_text
    assert any(t.strip() for t in vllm_text)


def test_weight_push_changes_vllm_to_the_pushed_weights(engine, tiny_model, tmp_path):
    """Perturbed weights pushed in place: vLLM's greedy output then equals transformers'
    greedy output for the same perturbed weights, and differs from the original model's."""
    from transformers import AutoModelForCausalLM

    before, _, _ = greedy_pair(engine, tiny_model, PROMPTS)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    perturbed = tmp_path / "perturbed"
    model.save_pretrained(perturbed)
    for f in tiny_model.glob("tokenizer*"):
        (perturbed / f.name).write_bytes(f.read_bytes())
    engine.update_weights(model.named_parameters(), version=1)
    after, hf_after, _ = greedy_pair(engine, perturbed, PROMPTS)
    assert after == hf_after
    assert after != before
    engine.update_weights(AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters(), version=2)
    restored, _, _ = greedy_pair(engine, tiny_model, PROMPTS)
    assert restored == before


def test_sampled_groups_have_logprobs_and_finish_reasons(engine, tiny_model):
    from dataclasses import replace

    from transformers import AutoTokenizer

    from pipeline.rollout.engine import Sampling

    tok = AutoTokenizer.from_pretrained(tiny_model)
    spec = Sampling(n=4, temperature=1.0, max_tokens=24, seed=7)
    groups = engine.generate([tok(p)["input_ids"] for p in PROMPTS[:2]], spec).groups
    assert [len(g) for g in groups] == [4, 4]
    for g in groups:
        for c in g:
            assert len(c.logprobs) == len(c.token_ids) > 0
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
            assert c.finish_reason != "length" or len(c.token_ids) == 24
    again = engine.generate([tok(p)["input_ids"] for p in PROMPTS[:2]], spec).groups
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in groups]
    # without logprobs (the loop's steps between sampler checks): the same samples
    bare = engine.generate([tok(p)["input_ids"] for p in PROMPTS[:2]],
                           replace(spec, logprobs=False)).groups
    assert [[c.token_ids for c in g] for g in bare] == [[c.token_ids for c in g] for g in groups]
    assert all(c.logprobs == [] for g in bare for c in g)


def test_pass_meter_counts_every_target_pass(engine, tiny_model):
    """Without speculation every decode pass emits exactly one token per sequence: the
    meter's tau is 1, no draft tokens, and the passes cover the longest response."""
    from transformers import AutoTokenizer

    from pipeline.rollout.engine import Sampling

    tok = AutoTokenizer.from_pretrained(tiny_model)
    result = engine.generate([tok(p)["input_ids"] for p in PROMPTS],
                             Sampling(n=3, temperature=1.0, max_tokens=40, seed=5))
    groups, c = result.groups, result.stats.passes
    lengths = [len(x.token_ids) for g in groups for x in g]
    generated, requests = sum(lengths), len(lengths)
    assert c.prefill_seq_passes == requests
    assert c.seq_passes - c.prefill_seq_passes == generated - requests
    assert c.tau(generated, requests) == 1.0 and c.draft_tokens == 0
    assert c.passes >= max(lengths) and len(c.samples) == c.passes
    assert c.scheduled_tokens > generated  # prompt tokens were scheduled too
    assert all(seconds > 0 for _, seconds, _ in c.samples)
