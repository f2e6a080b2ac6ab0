"""Sampled model drafts: which token the draft model proposes, drawn from its own
distribution q with randomness that is a function of the request and the position alone.

Why sample. A draft verified as a point mass (no draft probabilities) is accepted with the
policy's probability p(d) of the drafted token d, so a deterministic drafter does best with
its argmax and still loses every position where the policy spreads its mass. vLLM's
rejection sampler also takes the draft's probabilities q: it accepts a token d drawn from q
with probability min(1, p(d) / q(d)) and otherwise samples from max(p - q, 0), normalised,
which keeps the output distributed as p (Leviathan et al. 2023, Chen et al. 2023) and
accepts with probability sum_x min(p(x), q(x)): 1 where q matches p. That rule is lossless
only if d really is drawn from q, independently of the verification's own random numbers.

Why not torch's generator. A draft must be the same on a rerun and after `--resume`
whatever the batching, the thread timing or the device: the uniform that picks row r's
token at position t is `uniforms(seed_r, t)`, a SplitMix64 hash of the request's seed
(the one vLLM samples it with, `RequestId.seed`) and the token's absolute position; the
token is the first column whose cumulative probability reaches u (inverse CDF, one sort-
free pass over the row). vLLM's verification draws from the request's torch generator: a
different stream, so the two are independent.
"""

from __future__ import annotations

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SALT = np.uint64(0x5DEECE66D)  # drafts' stream, apart from any other use of the seed


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def uniforms(seeds, positions) -> np.ndarray:
    """One uniform in (0, 1) per (seed, position) pair (broadcast), float64: the same
    numbers for the same pairs on any machine. seeds: integers (a request's sampling seed,
    any Python int: reduced mod 2**64); positions: absolute token positions."""
    s = np.asarray([int(v) & 0xFFFFFFFFFFFFFFFF for v in np.ravel(seeds)], dtype=np.uint64)
    s = s.reshape(np.shape(seeds))
    p = np.asarray(positions, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = _splitmix64(_splitmix64(s ^ _SALT) + p * _GOLDEN)
    # 53 random bits, centred in their cell: never 0 and never 1
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def sample_columns(prob: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column index per row of prob [b, V] (rows of non-negative weights, summing to
    about 1), drawn by inverse CDF with u [b] in (0, 1): the first column whose cumulative
    weight reaches u times the row's total. A column of weight 0 is never drawn."""
    cdf = prob.double().cumsum(-1)
    target = (u.to(cdf.device, torch.float64) * cdf[:, -1])[:, None]
    col = torch.searchsorted(cdf, target)[:, 0]
    return col.clamp_(max=prob.shape[1] - 1)


__all__ = ["sample_columns", "uniforms"]
