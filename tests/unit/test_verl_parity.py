"""rhymectl's GRPO maths equal veRL's on random inputs (CPU, well under a second).

The oracle below is transcribed from volcengine/verl at commit
b178a3cd56f58b2d502255daba591e92833930a7 (Apache-2.0):
`verl/trainer/ppo/core_algos.py` (compute_grpo_outcome_advantage, agg_loss,
compute_policy_loss - the same maths as the registered "vanilla" loss without its config
plumbing - and kl_penalty_forward) and `verl/utils/torch_functional.py` (masked_sum,
masked_mean). Only unused modes, decorators and docstrings were left out; veRL itself is
not a dependency.

Where the two legitimately differ, the tests compare what is equal and pin the difference:

- A group of one response: veRL uses mean 0 and std 1, so A = r / (1 + eps) (A = r without
  std normalisation); rhymectl gives 0, since a lone response has no baseline and so no
  learning signal. Random groups here have 2 to 9 responses;
  `test_group_of_one_is_the_known_difference` pins the difference.
- A group whose rewards are all equal: veRL gives (r - mean) / (0 + eps), which is 0 only
  when the group mean is exact; rhymectl gives exactly 0. Binary 0/1 rewards (exact means)
  are compared, all-equal groups included.
- Epsilon placement: veRL's seq-mean-token-mean and masked_mean divide by count + 1e-8,
  rhymectl by max(count, 1); the relative difference is below 1e-8. A batch with no
  response token gives NaN in veRL's token-mean (0 / 0) and 0 in rhymectl.
- Dual-clip: veRL's vanilla loss always applies it (clip_ratio_c defaults to 3.0); in
  rhymectl it is off unless train.clip_ratio_c is set. Off is compared with veRL at
  clip_ratio_c = inf (its bound never binds), on with veRL at the same value.
- Dtype: rhymectl computes advantages in float64 and casts back; veRL computes in the
  rewards' dtype. Both dtypes agree to 1e-6 on these inputs.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from pipeline.train import grpo

TOL = dict(atol=1e-6, rtol=0.0)
SEEDS = [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- veRL oracle (transcribed)

def verl_masked_sum(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_masked_mean(values, mask, axis=None):
    s = verl_masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def verl_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                norm_adv_by_std_in_grpo=True):
    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None,
                  global_batch_size=None):
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        loss = verl_masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss


def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=None,
                     cliprange_low=None, cliprange_high=None, clip_ratio_c=3.0,
                     loss_agg_mode="token-mean"):
    assert clip_ratio_c > 1.0
    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = verl_masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = verl_agg_loss(loss_mat=pg_losses, loss_mask=response_mask,
                            loss_agg_mode=loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


# ---------------------------------------------------------------- random inputs

def _groups(gen: torch.Generator) -> list[str]:
    """Prompt ids for 3-6 groups of 2-9 responses each, interleaved as in a real batch."""
    sizes = torch.randint(2, 10, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen)
    ids = [f"prompt-{g}" for g, size in enumerate(sizes.tolist()) for _ in range(size)]
    order = torch.randperm(len(ids), generator=gen).tolist()
    return [ids[i] for i in order]


def _mask(gen: torch.Generator, n: int, length: int, min_len: int) -> torch.Tensor:
    """Right-padded float 0/1 response mask [n, length] with row lengths in [min_len, length]."""
    lens = torch.randint(min_len, length + 1, (n, 1), generator=gen)
    return (torch.arange(length).reshape(1, -1) < lens).float()


def _rewards(gen: torch.Generator, n: int, kind: str, dtype) -> torch.Tensor:
    if kind == "binary":  # exact group means, all-equal groups included
        return torch.randint(0, 2, (n,), generator=gen).to(dtype)
    return (torch.randn(n, generator=gen, dtype=torch.float64) * 2 + 0.5).to(dtype)


def _token_level(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """veRL's input: the scalar reward on each row's last response token, zeros elsewhere."""
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    out[torch.arange(len(rewards)), last] = rewards
    return out


def _loss_inputs(seed: int, dtype=torch.float64):
    """logp_old/logp_new/ref [N, L], per-sequence advantages [N] (+, -, 0, then alternating
    signs), mask [N, L].

    Ratios are log-uniform over [0.2, 8] so they fall below, inside and above [1-lo, 1+hi]
    and beyond the dual-clip bound; some rows have no response token; the reference
    log-probs reach beyond the low-var KL clamps (|ref - logp| up to 25).
    """
    gen = torch.Generator().manual_seed(seed)
    n, length = int(torch.randint(4, 12, (1,), generator=gen)), 7
    mask = _mask(gen, n, length, min_len=0)
    mask[:2] = 1.0  # full rows of each sign (below)
    old = -3 * torch.rand(n, length, generator=gen, dtype=torch.float64)
    log_ratio = math.log(0.2) + (math.log(8.0) - math.log(0.2)) * torch.rand(
        n, length, generator=gen, dtype=torch.float64)
    # row 1 (A < 0) spans the whole range, so every clip and bound is crossed in each batch
    log_ratio[1] = torch.linspace(math.log(0.2), math.log(8.0), length, dtype=torch.float64)
    new = old + log_ratio
    ref = new + torch.empty(n, length, dtype=torch.float64).uniform_(-25, 25, generator=gen)
    signs = torch.tensor([1.0, -1.0, 0.0] + [(-1.0) ** i for i in range(n - 3)])
    adv = 1.5 * torch.randn(n, generator=gen, dtype=torch.float64).abs() * signs
    return tuple(t.to(dtype) for t in (new, old, ref, adv)) + (mask,)


# ---------------------------------------------------------------- advantages

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["normal", "binary"])
@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grpo_advantages_equal_verl(seed, kind, norm_by_std, dtype):
    gen = torch.Generator().manual_seed(seed)
    ids = _groups(gen)
    mask = _mask(gen, len(ids), 6, min_len=1).to(dtype)
    rewards = _rewards(gen, len(ids), kind, dtype)
    want, _ = verl_grpo_outcome_advantage(_token_level(rewards, mask), mask, np.array(ids),
                                          norm_adv_by_std_in_grpo=norm_by_std)
    got = grpo.group_advantages(rewards, ids, norm_by_std=norm_by_std)
    assert got.dtype == dtype
    torch.testing.assert_close(got.reshape(-1, 1) * mask, want, **TOL)
    assert got.abs().max() > 0.1  # the comparison is not of zeros


def test_group_of_one_is_the_known_difference():
    rewards = torch.tensor([1.0, 0.0, 2.5], dtype=torch.float64)
    ids = ["a", "a", "lone"]
    mask = torch.ones(3, 1, dtype=torch.float64)
    want, _ = verl_grpo_outcome_advantage(rewards.reshape(-1, 1), mask, np.array(ids))
    got = grpo.group_advantages(rewards, ids)
    torch.testing.assert_close(got[:2], want[:2, 0], **TOL)
    assert want[2, 0].item() == pytest.approx(2.5 / (1 + 1e-6))
    assert got[2].item() == 0.0


# ---------------------------------------------------------------- policy loss and KL

def _rhyme_and_verl(seed, agg, clip_ratio_c, dtype=torch.float64, lo=0.2, hi=0.28):
    new, old, _, adv, mask = _loss_inputs(seed, dtype)
    new_r, new_v = new.clone().requires_grad_(), new.clone().requires_grad_()
    loss, m = grpo.policy_loss(new_r, old, adv, mask, lo, hi, agg=agg, clip_ratio_c=clip_ratio_c)
    verl_c = math.inf if clip_ratio_c is None else clip_ratio_c
    token_adv = adv.reshape(-1, 1) * mask  # veRL's advantages are [N, L], zero on padding
    want = verl_policy_loss(old, new_v, token_adv, mask, cliprange_low=lo, cliprange_high=hi,
                            clip_ratio_c=verl_c, loss_agg_mode=agg)
    loss.backward()
    want[0].backward()
    return (loss, m, new_r.grad), (want, new_v.grad)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("clip_ratio_c", [None, 1.5, 3.0, 5.0])
def test_policy_loss_equals_verl(seed, agg, clip_ratio_c):
    (loss, m, grad), ((pg_loss, clipfrac, ppo_kl, clipfrac_lower), grad_v) = _rhyme_and_verl(
        seed, agg, clip_ratio_c)
    torch.testing.assert_close(loss, pg_loss, **TOL)
    torch.testing.assert_close(grad, grad_v, **TOL)
    torch.testing.assert_close(m["clipfrac"], clipfrac, **TOL)
    torch.testing.assert_close(m["approx_kl"], ppo_kl, **TOL)
    torch.testing.assert_close(m["clipfrac_lower"], clipfrac_lower, **TOL)
    assert 0 < m["clipfrac"] < 1  # ratios lie on both sides of the clip range
    assert (m["clipfrac_lower"] > 0) == (clip_ratio_c is not None)  # the bound is exercised


@pytest.mark.parametrize("seed", SEEDS)
def test_policy_loss_float32_equals_verl(seed):
    (loss, m, grad), ((pg_loss, *_), grad_v) = _rhyme_and_verl(
        seed, "token-mean", 3.0, dtype=torch.float32)
    torch.testing.assert_close(loss, pg_loss, **TOL)
    torch.testing.assert_close(grad, grad_v, **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_dual_clip_binds_on_these_inputs(seed):
    # With it on, some tokens are bounded, so "off" differs from veRL's default 3.0:
    # a migrating user sets train.clip_ratio_c: 3.0 to keep veRL's loss.
    (on, m, _), _ = _rhyme_and_verl(seed, "token-mean", 3.0)
    assert m["clipfrac_lower"] > 0
    (off, _, _), _ = _rhyme_and_verl(seed, "token-mean", None)
    assert off.item() - on.item() > 1e-3  # the bound only ever lowers a token's loss


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_low_var_kl_and_kl_loss_equal_verl(seed, agg):
    new, old, ref, adv, mask = _loss_inputs(seed)
    want_kl = verl_kl_penalty_forward(new, ref, "low_var_kl")
    got_kl = grpo.kl_penalty(new, ref, "low_var_kl")
    torch.testing.assert_close(got_kl * mask, want_kl * mask, **TOL)
    assert (want_kl * mask == 10).any()  # the clamp is exercised
    for kind in ("k1", "k2"):
        torch.testing.assert_close(grpo.kl_penalty(new, ref, kind),
                                   verl_kl_penalty_forward(new, ref, kind), **TOL)
    # the actor's loss: pg_loss + kl_coef * agg(kl), as veRL's dp_actor with use_kl_loss
    coef = 0.05
    total, m = grpo.policy_loss(new, old, adv, mask, agg=agg, ref_logp=ref, kl_coef=coef,
                                clip_ratio_c=3.0)
    pg_loss, *_ = verl_policy_loss(old, new, adv.reshape(-1, 1) * mask, mask, cliprange=0.2,
                                   clip_ratio_c=3.0, loss_agg_mode=agg)
    kl_loss = verl_agg_loss(want_kl, mask, agg)
    torch.testing.assert_close(m["kl"], kl_loss, **TOL)
    torch.testing.assert_close(total, pg_loss + kl_loss * coef, **TOL)
