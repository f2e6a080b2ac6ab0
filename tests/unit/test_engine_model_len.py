"""The engine's max_model_len leaves room for a pass's drafts: vLLM's runner skips the
proposer for the whole batch when the longest sequence plus num_speculative_tokens exceeds
max_model_len, and the drafter then misses that pass's tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config.schema import SpecConfig
from pipeline.rollout.engine_args import engine_model_len


def runner_drafts(max_seq_len: int, k: int, max_model_len: int) -> bool:
    """vLLM 0.32's condition (`_input_fits_in_drafter` in gpu_model_runner.py), read from
    the installed source so that a change there fails here."""
    import inspect
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    src = inspect.getsource(GPUModelRunner._input_fits_in_drafter)
    assert "max_seq_len + num_drafter_query_tokens" in src and \
        "<= self.effective_drafter_max_model_len" in src, src
    return max_seq_len + k <= max_model_len


@pytest.mark.parametrize("k", [1, 8, 32])
def test_every_pass_of_a_speculating_run_drafts(tmp_path: Path, k: int):
    need = 32 + 160  # data.max_prompt_length + rollout.max_tokens
    model_len = engine_model_len(tmp_path, need, SpecConfig(method="history+group",
                                                            num_speculative_tokens=k))
    # the longest a sequence gets in a pass: need - 1 tokens so far, k drafts verified
    assert runner_drafts(need - 1 + k, k, model_len)
    assert not runner_drafts(need - 1 + k, k, need)  # what the engine had before


def test_no_headroom_without_speculation_and_never_past_the_models_context(tmp_path: Path):
    assert engine_model_len(tmp_path, 192, SpecConfig()) == 192  # method none
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 200}))
    spec = SpecConfig(method="suffix", num_speculative_tokens=8)
    assert engine_model_len(tmp_path, 192, spec) == 200
    assert engine_model_len(tmp_path, 250, spec) == 250  # preflight refuses need > context
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    assert engine_model_len(tmp_path, 192, spec) == 192 + 17


def test_the_models_context_is_read_from_its_config(tmp_path: Path):
    from pipeline.errors import UsageError
    from pipeline.policy.checks import model_context

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    assert model_context(tmp_path) == 512
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": "512"}))
    assert model_context(tmp_path) is None  # not a count: unknown
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="config.json cannot be read"):
        model_context(tmp_path)
    spec = SpecConfig(method="suffix", num_speculative_tokens=4)
    assert engine_model_len(tmp_path, 100, spec) == 109  # vLLM's load reports the file
