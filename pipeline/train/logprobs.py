"""Log-probabilities of the sampled tokens from a causal LM's logits, without an fp32 copy
of the [N, T, V] logits.

With a 152k vocabulary a micro-batch of 8 x 5k tokens has 6.2e9 logits: 12 GB in bf16, 25 GB
in fp32. Upcasting them for a log-softmax (and keeping the upcast copy for the backward pass,
as autograd would) is what runs a 7B GRPO step out of memory. `selected_logprobs` works
chunk by chunk: the forward pass keeps the model's own logits and one log-sum-exp per
position; the backward pass recomputes each chunk's softmax in fp32 and writes the gradient
in the logits' dtype. The result equals `log_softmax(logits.float() / T).gather(targets)`.

`positions_from` lets the model skip the prompt: only the logits of positions the loss can
read are computed (transformers' `logits_to_keep`).
"""

from __future__ import annotations

import torch

# one chunk's fp32 working set, the same for the teacher's top-k over the same logits
from pipeline.train.teacher import CHUNK_BYTES

Tensor = torch.Tensor


class _SelectedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, rows: int) -> Tensor:
        flat = logits.reshape(-1, logits.shape[-1])  # a view: logits are contiguous
        tgt = targets.reshape(-1, 1)
        out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for i in range(0, flat.shape[0], rows):
            x = flat[i: i + rows].float()
            if temperature != 1.0:
                x = x / temperature
            lse[i: i + rows] = torch.logsumexp(x, dim=-1)
            out[i: i + rows] = x.gather(-1, tgt[i: i + rows]).squeeze(-1) - lse[i: i + rows]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        return out.view(targets.shape)

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, targets, lse = ctx.saved_tensors
        temperature, rows = ctx.temperature, ctx.rows
        flat = logits.reshape(-1, logits.shape[-1])
        tgt = targets.reshape(-1, 1)
        g = grad.reshape(-1, 1).float()
        out = torch.empty_like(flat)
        for i in range(0, flat.shape[0], rows):
            x = flat[i: i + rows].float()
            if temperature != 1.0:
                x = x / temperature
            # d(x_t - lse)/dx = onehot(t) - softmax(x), times the upstream gradient
            d = torch.exp(x - lse[i: i + rows, None]).mul_(-g[i: i + rows])
            d.scatter_add_(-1, tgt[i: i + rows], g[i: i + rows])
            if temperature != 1.0:
                d.div_(temperature)
            out[i: i + rows] = d.to(out.dtype)
        return out.view_as(logits), None, None, None


def selected_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0,
                      chunk_bytes: int = CHUNK_BYTES) -> Tensor:
    """log softmax(logits / temperature)[..., targets] -> float32 with targets' shape.

    logits: [..., V] in any float dtype, contiguous; targets: [...] int64 ids.
    Memory beyond the logits: one fp32 value per position, plus one fp32 chunk of
    `chunk_bytes` while it runs (forward and backward)."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} "
                         f"disagree")
    rows = max(1, chunk_bytes // (4 * logits.shape[-1]))
    return _SelectedLogProbs.apply(logits.contiguous(), targets.long(), float(temperature), rows)


def shifted_logprobs(logits: Tensor, input_ids: Tensor, first: int = 0,
                     temperature: float = 1.0) -> Tensor:
    """log p(input_ids[:, j+1] | input_ids[:, :j+1]) -> float32 [N, T-1], as
    `pipeline.train.grpo.token_logprobs`, from logits of positions first..T-1 only
    ([N, T - first, V]); columns before `first` are 0 (the caller masks them: prompt)."""
    n, t = input_ids.shape
    if logits.shape[:2] != (n, t - first):
        raise ValueError(f"need logits [N, T - first, V] = [{n}, {t - first}, V], got "
                         f"{tuple(logits.shape)}")
    # The target of position j is token j + 1; the last position has none (a dummy 0 whose
    # column is dropped), which keeps the logits one contiguous block.
    targets = torch.zeros((n, t - first), dtype=torch.long, device=input_ids.device)
    targets[:, :-1] = input_ids[:, first + 1:]
    lp = selected_logprobs(logits, targets, temperature)[:, :-1]
    if first == 0:
        return lp
    return torch.cat([lp.new_zeros((n, first)), lp], dim=1)


__all__ = ["selected_logprobs", "shifted_logprobs"]
