"""GRPO maths against hand-computed numbers (CPU, milliseconds)."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.errors import UsageError
from pipeline.train import grpo


# ---------------------------------------------------------------- advantages

def test_group_of_four_matches_hand_computation():
    # mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866
    adv = grpo.group_advantages([1.0, 0.0, 0.0, 1.0], [7, 7, 7, 7])
    want = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([want, -want, -want, want]))
    assert adv.dtype == torch.float32


def test_all_equal_group_gives_exactly_zero():
    assert torch.equal(grpo.group_advantages([0.0, 0.0, 0.0], ["g"] * 3), torch.zeros(3))
    # 0.1 is not exact in binary: the mean could differ from each reward by one ulp
    same = torch.full((3,), 0.1, dtype=torch.float64)  # float64 mean is 0.1 + 1.4e-17
    assert torch.equal(grpo.group_advantages(same, [0] * 3), torch.zeros(3, dtype=torch.float64))
    assert torch.equal(grpo.group_advantages(same, [0] * 3, norm_by_std=False),
                       torch.zeros(3, dtype=torch.float64))


def test_mixed_group_sizes_and_interleaved_hashable_ids():
    rewards = [1.0, 3.0, 0.5, 0.0, 2.0, 0.5, 0.0, 1.0, 1.0, 0.5]
    ids = ["a", ("d", 1), "b", "a", "c", "b", "a", ("d", 1), "a", "b"]
    adv = grpo.group_advantages(rewards, ids)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)   # group a: [1, 0, 0, 1]
    d = 1.0 / (math.sqrt(2.0) + 1e-6)     # group d: [3, 1], mean 2, unbiased std sqrt(2)
    want = [a, d, 0.0, -a, 0.0, 0.0, -a, -d, a, 0.0]  # b all equal, c a singleton
    torch.testing.assert_close(adv, torch.tensor(want))


def test_grpo_no_std_is_mean_centred_only():
    fn = grpo.get_advantage_estimator("grpo_no_std")
    adv = fn(torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0]), torch.tensor([0, 0, 0, 0, 1, 1]))
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, -1.0, 1.0]))
    torch.testing.assert_close(grpo.get_advantage_estimator("grpo")([0.0, 2.0], [1, 1]),
                               grpo.group_advantages([0.0, 2.0], [1, 1]))


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(UsageError, match="advantage estimator 'ppo'.*grpo, grpo_no_std"):
        grpo.get_advantage_estimator("ppo")
    with pytest.raises(UsageError, match="loss aggregation mode 'sum'.*token-mean"):
        grpo.aggregate(torch.zeros(1, 1), torch.ones(1, 1), "sum")
    with pytest.raises(UsageError, match="KL estimator 'k9'.*low_var_kl"):
        grpo.kl_penalty(torch.zeros(1), torch.zeros(1), "k9")


# ---------------------------------------------------------------- masks and log-probs

def test_response_mask_excludes_prompt_and_padding():
    mask = grpo.response_mask([2, 3, 1], [5, 4, 1], seq_len=6)
    want = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]]).bool()
    assert torch.equal(mask, want)
    assert torch.equal(grpo.next_token_mask([2, 3, 1], [5, 4, 1], 6), want[:, 1:])
    with pytest.raises(ValueError):
        grpo.response_mask([3], [2], seq_len=6)


def test_token_logprobs_matches_manual_softmax():
    torch.manual_seed(0)
    logits, ids = torch.randn(2, 4, 5), torch.randint(0, 5, (2, 4))
    got = grpo.token_logprobs(logits, ids)
    assert got.shape == (2, 3)
    for n in range(2):
        for j in range(3):
            row = logits[n, j]
            want = math.log(math.exp(row[ids[n, j + 1]]) / sum(math.exp(x) for x in row))
            assert got[n, j].item() == pytest.approx(want, abs=1e-5)
    hot = grpo.token_logprobs(logits, ids, temperature=0.5)
    torch.testing.assert_close(hot, grpo.token_logprobs(logits * 2, ids))
    low = grpo.token_logprobs(logits.bfloat16(), ids)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, got, atol=3e-2, rtol=0)


# ---------------------------------------------------------------- policy loss

def _loss_inputs(ratios, advantages):
    logp_new = torch.tensor(ratios, dtype=torch.float64).log().requires_grad_()
    return logp_new, torch.zeros_like(logp_new), torch.tensor(advantages, dtype=torch.float64)


def test_clipping_values_and_zero_gradient_where_clipped():
    # seq 0, A=+1: ratio 1.5 > 1.2 (clipped), 1.1 (inside)
    # seq 1, A=-1: ratio 0.5 < 0.8 (clipped), 0.9 (inside)
    new, old, adv = _loss_inputs([[1.5, 1.1], [0.5, 0.9]], [1.0, -1.0])
    loss, m = grpo.policy_loss(new, old, adv, torch.ones(2, 2), 0.2, 0.2, "token-mean")
    # token losses: -1.2, -1.1, 0.8, 0.9
    assert loss.item() == pytest.approx((-1.2 - 1.1 + 0.8 + 0.9) / 4)
    loss.backward()
    # d(-A r)/d logp = -A r on unclipped tokens, / 4 tokens
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -1.1 / 4], [0.0, 0.9 / 4]],
                                                      dtype=torch.float64))
    assert m["clipfrac"].item() == pytest.approx(0.5)
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 1.1 + 0.5 + 0.9) / 4)
    want_kl = -sum(math.log(r) for r in (1.5, 1.1, 0.5, 0.9)) / 4
    assert m["approx_kl"].item() == pytest.approx(want_kl)


def test_clip_is_pessimistic_only():
    # ratio above 1+eps with a negative advantage is not clipped: the loss keeps growing
    new, old, adv = _loss_inputs([[1.5], [0.5]], [-1.0, 1.0])
    loss, m = grpo.policy_loss(new, old, adv, torch.ones(2, 1), clip_ratio_low=0.2,
                               clip_ratio_high=0.28)
    assert loss.item() == pytest.approx((1.5 - 0.5) / 2)
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[0.75], [-0.25]], dtype=torch.float64))
    assert m["clipfrac"].item() == 0.0


def test_dual_clip_bounds_negative_advantage_tokens():
    # clip 0.2/0.2, clip_ratio_c = 3; per-token loss = max(-A r, -A clip(r, 0.8, 1.2)),
    # then for A < 0 at most -A * 3:
    # seq 0, A=-1: r=4   -> max(4, 1.2) = 4 > 3 -> 3   (dual clip binds, no gradient)
    #              r=2   -> max(2, 1.2) = 2            (inside, gradient -A r = 2)
    #              r=0.5 -> max(0.5, 0.8) = 0.8        (PPO clip, no gradient)
    # seq 1, A=+2: r=4   -> max(-8, -2.4) = -2.4       (A > 0: no dual clip)
    #              r=9 is padding.
    # token-mean: (3 + 2 + 0.8 - 2.4) / 4 = 0.85; without dual clip (4 + 2 + 0.8 - 2.4) / 4 = 1.1
    new, old, adv = _loss_inputs([[4.0, 2.0, 0.5], [4.0, 9.0, 9.0]], [-1.0, 2.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, m = grpo.policy_loss(new, old, adv, mask, 0.2, 0.2, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(0.85)
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 2 / 4, 0.0], [0.0, 0.0, 0.0]],
                                                      dtype=torch.float64))
    assert m["clipfrac"].item() == pytest.approx(2 / 4)  # r=0.5 (A<0) and r=4 (A>0)
    assert m["clipfrac_lower"].item() == pytest.approx(1 / 4)
    # seq-mean-token-mean: ((3 + 2 + 0.8) / 3 + (-2.4)) / 2
    seq, _ = grpo.policy_loss(new, old, adv, mask, 0.2, 0.2, "seq-mean-token-mean",
                              clip_ratio_c=3.0)
    assert seq.item() == pytest.approx((5.8 / 3 - 2.4) / 2)
    off, m_off = grpo.policy_loss(new, old, adv, mask, 0.2, 0.2)
    assert off.item() == pytest.approx(1.1)
    assert m_off["clipfrac_lower"].item() == 0.0
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        grpo.policy_loss(new, old, adv, mask, clip_ratio_c=1.0)


def test_aggregation_modes_against_hand_numbers():
    # ratio 1, so each token's loss is -A. seq 0: A=1, 3 tokens; seq 1: A=-2, 1 token.
    new = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    want = {"token-mean": (-3 + 2) / 4, "seq-mean-token-mean": (-1 + 2) / 2}
    for agg, value in want.items():
        loss, _ = grpo.policy_loss(new, new.detach(), adv, mask, agg=agg)
        assert loss.item() == pytest.approx(value), agg


def test_sequence_without_tokens_is_ignored_by_seq_mean():
    vals = torch.tensor([[2.0, 4.0], [9.0, 9.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert grpo.aggregate(vals, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert grpo.aggregate(vals, mask, "token-mean").item() == pytest.approx(3.0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_garbage_in_masked_positions_changes_nothing(agg):
    torch.manual_seed(1)
    mask = grpo.next_token_mask([2, 1, 3], [6, 3, 7], seq_len=7)  # prompt and padding off
    clean_new = -torch.rand(3, 6)
    clean_old = clean_new + 0.3 * torch.randn(3, 6)
    clean_ref = clean_new + 0.3 * torch.randn(3, 6)
    adv = torch.tensor([1.0, -0.5, 2.0])

    def run(new, old, ref):
        new = new.clone().requires_grad_()
        loss, m = grpo.policy_loss(new, old, adv, mask, agg=agg, ref_logp=ref, kl_coef=0.1)
        loss.backward()
        return loss, m, new.grad

    garbage = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30])
    noise = garbage[torch.randint(0, 5, (3, 6))]
    dirty = [torch.where(mask, t, noise) for t in (clean_new, clean_old, clean_ref)]
    loss0, m0, g0 = run(clean_new, clean_old, clean_ref)
    loss1, m1, g1 = run(*dirty)
    assert torch.isfinite(loss1) and torch.isfinite(g1).all()
    torch.testing.assert_close(loss1, loss0)
    torch.testing.assert_close(g1, g0)
    assert torch.equal(g1[~mask], torch.zeros_like(g1[~mask]))
    assert g1[mask].abs().sum() > 0
    for key in m0:
        torch.testing.assert_close(m1[key], m0[key])


# ---------------------------------------------------------------- KL

def test_kl_estimators_match_formulas():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    d = [0.5, -1.0, 0.0]  # logp - ref
    torch.testing.assert_close(grpo.kl_penalty(logp, ref, "k1"), torch.tensor(d))
    torch.testing.assert_close(grpo.kl_penalty(logp, ref, "k2"),
                               torch.tensor([0.5 * x * x for x in d]))
    k3 = [math.exp(-x) + x - 1 for x in d]  # exp(ref - logp) - (ref - logp) - 1
    torch.testing.assert_close(grpo.kl_penalty(logp, ref, "low_var_kl"), torch.tensor(k3))
    torch.testing.assert_close(grpo.kl_penalty(logp, ref), torch.tensor(k3))
    # clamped to [-10, 10]; the log-ratio clamp keeps exp() finite on the way
    far = grpo.kl_penalty(torch.zeros(3), torch.tensor([1e4, 30.0, -1e4]))
    assert torch.equal(far, torch.full((3,), 10.0))
    assert grpo.kl_penalty(torch.tensor([0.0]), torch.tensor([-5.0])).item() == pytest.approx(
        math.exp(-5.0) + 4.0)


def test_kl_term_is_added_with_its_coefficient():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    old = logp.detach() + 0.1
    ref = torch.tensor([[-1.5, -1.0], [-0.5, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -1.0])
    base, _ = grpo.policy_loss(logp, old, adv, mask)
    total, m = grpo.policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.25, kl_kind="k1")
    kl = (0.5 - 1.0 + 0.0) / 3
    assert m["kl"].item() == pytest.approx(kl)
    assert total.item() == pytest.approx(base.item() + 0.25 * kl)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo.policy_loss(logp, old, adv, mask, kl_coef=0.1)
