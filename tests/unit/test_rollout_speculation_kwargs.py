"""`spec` settings to vLLM's speculative_config (no engine: the sampler patch is stubbed)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from pipeline.config.schema import DRAFTER_SPEC_FACTOR, SUFFIX_SPEC_FACTOR, SpecConfig
from pipeline.drafting.build import drafter_config
from pipeline.drafting.inputs import DrafterConfig
from pipeline.rollout import speculation


@pytest.fixture(autouse=True)
def _no_vllm(monkeypatch):
    monkeypatch.setattr(speculation.cpu_sampler_fix, "apply", lambda: False)


def test_max_spec_factor_defaults_per_method_and_an_explicit_one_sets_both():
    # null: vLLM's own default for suffix, rhymectl's measured default for its drafter
    suffix = speculation.llm_kwargs(SpecConfig(method="suffix", num_speculative_tokens=8))
    assert suffix == {"speculative_config": {"method": "suffix", "num_speculative_tokens": 8,
                                             "suffix_decoding_max_spec_factor": 1.0}}
    assert drafter_config(SpecConfig(method="history+group")).max_spec_factor == 1.0
    assert DrafterConfig().max_spec_factor == DRAFTER_SPEC_FACTOR == 1.0
    assert drafter_config(SpecConfig(method="history", max_spec_factor=0.5)).max_spec_factor == 0.5
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


def test_the_suffix_default_is_vllms_own():
    """Read from the installed vLLM's source (importing vLLM takes seconds): the default of
    SpeculativeConfig.suffix_decoding_max_spec_factor."""
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vLLM is not installed")
    source = Path(spec.origin).parent / "config" / "speculative.py"
    defaults = {node.target.id: node.value for node in ast.walk(ast.parse(source.read_text()))
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.value is not None}
    assert ast.literal_eval(defaults["suffix_decoding_max_spec_factor"]) == SUFFIX_SPEC_FACTOR
