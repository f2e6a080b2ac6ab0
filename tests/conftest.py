"""Shared fixtures. The tiny model is built once per session (a short SFT, ~1 minute) under
pytest's temp root; tests that start vLLM or DeepSpeed carry the `engine` / `deepspeed`
markers so `make test-fast` can skip them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
TEST_SFT_STEPS = 300


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A real tiny policy (tokenizer + Llama + short SFT) in Hugging-Face format.
    RHYMECTL_TEST_MODEL=DIR uses an already built one instead (a busy machine saves the SFT)."""
    if os.environ.get("RHYMECTL_TEST_MODEL"):
        return Path(os.environ["RHYMECTL_TEST_MODEL"])
    from dataclasses import replace

    from pipeline.policy.bootstrap import InitSpec, init_model

    out = tmp_path_factory.mktemp("models") / "tiny-sort"
    spec = InitSpec(task="sort", seed=0, eval_rows=32)
    spec = replace(spec, sft=replace(spec.sft, steps=TEST_SFT_STEPS), sft_rows=4000)
    init_model(out, spec)
    return out
