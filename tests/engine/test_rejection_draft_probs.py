"""vLLM's rejection sampler (the installed one, its CPU kernels registered as the engine
registers them; no engine started) verifying drafts drawn from a draft distribution q with
q handed over, as `spec.draft_probs` hands the draft model's: the output is distributed as
the target p (the rule min(1, p/q), corrections from max(p - q, 0)), position by position,
and accepted sum_x min(p, q) of the time. The same drafts verified as point masses are
lossless too (any draft independent of the verifier's random numbers is) but accepted only
sum_x q p of the time: what handing q over buys. A draft that is not drawn from the q
handed over (its argmax) is not lossless: the check can fail."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.drafting.draft_sample import sample_columns, uniforms

N = 40_000  # requests, each with a two-token draft
P = torch.tensor([[0.50, 0.20, 0.15, 0.10, 0.05, 0.00],
                  [0.05, 0.05, 0.10, 0.60, 0.10, 0.10]])  # the target at positions 0, 1
Q = torch.tensor([[0.10, 0.40, 0.10, 0.10, 0.10, 0.20],
                  [0.30, 0.05, 0.05, 0.40, 0.20, 0.00]])  # the draft's


def _metadata(n: int):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.ones(n), all_greedy=False, all_random=True, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(n), presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n), output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def _verify(rejection_sampler, with_probs: bool, argmax: bool = False) -> np.ndarray:
    """[N, 3] output tokens (-1: none) of N requests drafting two tokens from Q (argmax:
    Q's most likely tokens instead)."""
    torch.manual_seed(0)
    k = P.shape[0]
    seeds = np.arange(N)
    drafts = torch.stack([Q[t].argmax().expand(N) if argmax else
                          sample_columns(Q[t].expand(N, -1),
                                         torch.from_numpy(uniforms(seeds, np.full(N, t))))
                          for t in range(k)], 1)  # [N, k]
    q = Q[None].expand(N, -1, -1).reshape(N * k, -1).contiguous()
    target_logits = P.clamp(min=1e-30).log()[None].expand(N, -1, -1).reshape(N * k, -1)
    out = rejection_sampler.rejection_sample(
        drafts.reshape(-1).to(torch.int32).contiguous(), [k] * N, k,
        torch.arange(1, N + 1, dtype=torch.int32) * k, q if with_probs else None,
        target_logits.contiguous(), torch.full((N, 1), 5, dtype=torch.int64).contiguous(),
        _metadata(N))
    return out.numpy()


def _fits(counts: np.ndarray, p: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value of token counts against p (its support)."""
    from scipy.stats import chisquare

    support = p > 0
    assert counts[~support.numpy()].sum() == 0, "a token the target never samples"
    expected = p[support].double().numpy()
    expected = expected / expected.sum() * counts.sum()
    return float(chisquare(counts[support.numpy()], expected).pvalue)


def _check_lossless(out: np.ndarray) -> float:
    """Both positions' outputs follow P; returns the share of first draft tokens accepted."""
    assert _fits(np.bincount(out[:, 0], minlength=6), P[0]) > 1e-3
    # the second position, among the requests whose first draft token was accepted (its
    # output then follows p at position 1 whatever happened before)
    accepted = out[:, 1] >= 0
    assert accepted.sum() > 2_000
    assert _fits(np.bincount(out[accepted, 1], minlength=6), P[1]) > 1e-3
    return float(accepted.mean())


def test_drafts_from_q_verified_with_q_keep_the_target_distribution(rejection_sampler):
    rate = _check_lossless(_verify(rejection_sampler, with_probs=True))
    assert abs(rate - float(torch.minimum(P[0], Q[0]).sum())) < 0.01  # 0.55


def test_point_masses_are_lossless_too_and_accepted_less(rejection_sampler):
    rate = _check_lossless(_verify(rejection_sampler, with_probs=False))
    assert abs(rate - float((P[0] * Q[0]).sum())) < 0.01  # 0.16


def test_a_draft_not_drawn_from_the_q_handed_over_is_not_lossless(rejection_sampler):
    """The planted error: q handed over with the argmax drafted."""
    out = _verify(rejection_sampler, with_probs=True, argmax=True)
    assert _fits(np.bincount(out[:, 0], minlength=6), P[0]) < 1e-6
