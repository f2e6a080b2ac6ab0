"""`spec` settings to vLLM's speculative_config (no engine: the sampler patch is stubbed)."""

from __future__ import annotations

import pytest

from pipeline.config.schema import SpecConfig
from pipeline.drafting.build import MAX_SPEC_FACTOR, drafter_config
from pipeline.rollout import speculation


@pytest.fixture(autouse=True)
def _no_vllm(monkeypatch):
    monkeypatch.setattr(speculation.cpu_sampler_fix, "apply", lambda: False)


def test_max_spec_factor_defaults_per_method_and_an_explicit_one_sets_both():
    # null: vLLM's own default for suffix, rhymectl's measured default for its drafter
    suffix = speculation.llm_kwargs(SpecConfig(method="suffix", num_speculative_tokens=8))
    assert suffix == {"speculative_config": {"method": "suffix", "num_speculative_tokens": 8}}
    assert drafter_config(SpecConfig(method="history+group")).max_spec_factor == MAX_SPEC_FACTOR
    spec = SpecConfig(method="suffix", max_spec_factor=2.0)
    cfg = speculation.llm_kwargs(spec)["speculative_config"]
    assert cfg["suffix_decoding_max_spec_factor"] == 2.0
    assert drafter_config(SpecConfig(method="history", max_spec_factor=2.0)).max_spec_factor == 2.0


def test_other_methods_ignore_the_suffix_setting():
    assert speculation.llm_kwargs(None) == {}
    assert speculation.llm_kwargs(SpecConfig(method="none", max_spec_factor=2.0)) == {}
    ngram = speculation.llm_kwargs(SpecConfig(method="ngram", max_spec_factor=2.0))
    assert "suffix_decoding_max_spec_factor" not in ngram["speculative_config"]
    custom = speculation.llm_kwargs(SpecConfig(method="history+group", max_spec_factor=2.0))
    assert custom["speculative_config"]["method"] == "custom_class"
