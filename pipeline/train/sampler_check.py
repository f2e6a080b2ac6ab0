"""Whether vLLM sampled from the weights being trained: the sums behind the metrics
`sampler_logprob_diff` and `sampler_staleness` (`pipeline.train.actor.Actor` supplies the
log-probs; nothing here runs a model).

In bf16, vLLM's kernels and the trainer's differ by about 1e-2 in mean |log p| with the
right weights, more than one optimiser step moves them, so no threshold on the drift
tells a weight push that did not arrive from kernel noise. The previous policy's log-probs
p of the same tokens do: with vLLM's v and the current policy's f,

    staleness = sum (v - f)(p - f) / sum (p - f)^2    over response tokens

is v's share of the step from f back to p: about 0 when vLLM holds the trained weights
(kernel noise is not correlated with the step), about 1 when it holds the previous ones;
above 0.5 vLLM is closer to the previous policy than to the current one (in squared
error).

Each function takes the micro-batches (`Batch`es with `sampler_logprobs`), their log-probs
[n, L] per micro-batch, and `mask_of(b)`: (the response mask on the log-probs' device, its
token count). Sums stay on the device until one transfer.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

Tensor = torch.Tensor
MaskOf = Callable[[object], tuple[Tensor, int]]


def drift(rows: Sequence, old: Sequence[Tensor], mask_of: MaskOf) -> Tensor:
    """Mean |log p_vLLM - log p_trainer| over response tokens (a device scalar)."""
    total, count = None, 0
    for b, lp in zip(rows, old):
        mask, n = mask_of(b)
        diff = (lp - b.sampler_logprobs).abs()
        part = torch.where(mask, diff, torch.zeros_like(diff)).sum()  # no sync, unlike [mask]
        total = part if total is None else total + part
        count += n
    return total / max(1, count)


def staleness(rows: Sequence, fresh: Sequence[Tensor], stale: Sequence[Tensor],
              mask_of: MaskOf, host_floats: Callable[[dict], dict]) -> dict[str, float]:
    """`sampler_staleness` (where the policy moved at all), the mean |v - p|
    (`sampler_logprob_diff_previous`) and the mean |p - f| (`sampler_policy_step`), from
    the current policy's log-probs `fresh` and the previous one's `stale`."""
    sums = {"cross": 0.0, "step": 0.0, "far": 0.0, "moved": 0.0}
    count = 0
    for b, f, p in zip(rows, fresh, stale):
        mask, n = mask_of(b)
        v = b.sampler_logprobs
        zero = torch.zeros_like(f)
        sums["cross"] += torch.where(mask, (v - f) * (p - f), zero).sum()
        sums["step"] += torch.where(mask, (p - f) ** 2, zero).sum()
        sums["far"] += torch.where(mask, (v - p).abs(), zero).sum()
        sums["moved"] += torch.where(mask, (p - f).abs(), zero).sum()
        count += n
    got = host_floats({k: torch.as_tensor(v, dtype=torch.float64) for k, v in sums.items()})
    out = {"sampler_logprob_diff_previous": got["far"] / max(1, count),
           "sampler_policy_step": got["moved"] / max(1, count)}
    if got["step"] > 0:
        out["sampler_staleness"] = got["cross"] / got["step"]
    return out


__all__ = ["drift", "staleness"]
