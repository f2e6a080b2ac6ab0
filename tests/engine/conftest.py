"""The engine tier's model: a real tiny policy, built once per session (a short SFT, about
a minute) under pytest's temp root."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.policy.bootstrap import InitOptions, init_model

TEST_SFT_STEPS = 300


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A real tiny policy (tokenizer + Llama + short SFT) in Hugging-Face format."""
    out = tmp_path_factory.mktemp("models") / "tiny-sort"
    options = InitOptions(task="sort", seed=0, eval_rows=32)
    options = replace(options, sft=replace(options.sft, steps=TEST_SFT_STEPS), sft_rows=4000)
    init_model(out, options)
    return out
