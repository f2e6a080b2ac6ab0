"""The one registry of speculative methods, and that the config, the drafter and the CLI
read it rather than lists of their own."""

from __future__ import annotations

import typing

import pytest

from pipeline.config.methods import DRAFTER_METHODS, METHODS, REGISTRY, method
from pipeline.config.schema import SpecConfig
from pipeline.drafting.inputs import DrafterConfig
from rhymectl import cmd_bench_spec


def test_the_registry_names_each_method_once_with_what_serves_it():
    assert METHODS == ("none", "ngram", "suffix", "history", "group", "history+group",
                       "history+group+model")
    assert DRAFTER_METHODS == ("history", "group", "history+group", "history+group+model")
    assert [n for n, m in REGISTRY.items() if m.model] == ["history+group+model"]
    assert [REGISTRY[n].vllm_method for n in ("none", "ngram", "suffix")] == [None, "ngram", "suffix"]
    assert (method("history+group").history, method("history+group").siblings) == (True, True)
    assert (method("group").history, method("group").siblings) == (False, True)
    with pytest.raises(KeyError, match="unknown speculative method 'eagle'"):
        method("eagle")


def test_config_drafter_and_cli_read_the_registry():
    assert typing.get_args(typing.get_type_hints(SpecConfig)["method"]) == METHODS
    assert cmd_bench_spec.DEFAULT_METHODS.split(",") == list(METHODS)
    for name in DRAFTER_METHODS:
        cfg = DrafterConfig.for_method(name)
        assert (cfg.use_history, cfg.use_siblings) == (method(name).history, method(name).siblings)
