"""Chunked log-probs of the sampled tokens: the same values and gradients as a full fp32
log-softmax, in the logits' dtype, for any chunk size; prompt columns skipped."""

from __future__ import annotations

import pytest
import torch

from pipeline.train import grpo
from pipeline.train.logprobs import selected_logprobs, shifted_logprobs


def reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / temperature, -1).gather(
        -1, targets.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_bytes", [4 * 11, 4 * 11 * 5, 1 << 20])  # 1 row, 5 rows, all
def test_values_and_gradients_equal_a_full_fp32_log_softmax(temperature, chunk_bytes):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 11, generator=gen) * 3).requires_grad_(True)
    targets = torch.randint(0, 11, (3, 7), generator=gen)
    upstream = torch.randn(3, 7, generator=gen)
    got = selected_logprobs(logits, targets, temperature, chunk_bytes=chunk_bytes)
    (got * upstream).sum().backward()
    grad_got, logits.grad = logits.grad.clone(), None
    want = reference(logits, targets, temperature)
    (want * upstream).sum().backward()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_got, logits.grad, rtol=1e-5, atol=1e-6)


def test_low_precision_logits_get_a_gradient_in_their_own_dtype():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 5, 13, generator=gen)).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, 13, (2, 5), generator=gen)
    got = selected_logprobs(logits, targets, chunk_bytes=4 * 13 * 2)
    got.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    want = reference(logits.detach(), targets, 1.0)  # fp32 maths on the bf16 values
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_shifted_logprobs_match_token_logprobs_on_the_columns_after_first():
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 9, (4, 8), generator=gen)
    logits = torch.randn(4, 8, 9, generator=gen)
    full = grpo.token_logprobs(logits, ids, 0.9)
    torch.testing.assert_close(shifted_logprobs(logits, ids, 0, 0.9), full)
    part = shifted_logprobs(logits[:, 3:].contiguous(), ids, 3, 0.9)
    assert part.shape == full.shape
    torch.testing.assert_close(part[:, 3:], full[:, 3:])
    assert torch.all(part[:, :3] == 0)


def test_shapes_that_disagree_are_refused():
    with pytest.raises(ValueError, match="disagree"):
        selected_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="T - first"):
        shifted_logprobs(torch.zeros(2, 5, 5), torch.zeros(2, 8, dtype=torch.long), 2)
