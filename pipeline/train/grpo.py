"""GRPO maths as pure torch functions: advantages, masks, log-probs, clipped loss, KL.

Shapes: N sequences in the batch (B prompts x G samples), T padded token positions,
L = T - 1 next-token positions, V vocabulary. Masks are bool (float 0/1 is accepted).

Masked positions never reach the result: inputs are replaced with zeros by `torch.where`
*before* any arithmetic, so NaN/inf garbage in padding cannot leak into the loss or,
through a 0 * NaN product in the backward pass, into the gradients.

Pluggable parts sit behind two small registries (after veRL's core_algos):
advantage estimators (`grpo`, `grpo_no_std`) and loss aggregation modes.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch

from pipeline.errors import UsageError

Tensor = torch.Tensor
# veRL clamps log-ratios before exp() so one wild token cannot overflow the loss.
_LOG_RATIO_CLAMP = 20.0
_LOW_VAR_KL_CLAMP = 10.0


def _lookup(registry: dict, name: str, what: str):
    if name not in registry:
        raise UsageError(f"unknown {what} {name!r}: choose one of {', '.join(sorted(registry))}")
    return registry[name]


# ---------------------------------------------------------------- advantages

def group_advantages(rewards: Tensor | Sequence[float], group_ids: Sequence[Hashable] | Tensor,
                     eps: float = 1e-6, norm_by_std: bool = True) -> Tensor:
    """Group-relative advantages: (r - mean_group) / (std_group + eps).

    rewards: [N] scalar reward per response. group_ids: [N] any hashable per response
    (responses to the same prompt share one id); groups may differ in size.
    std is the unbiased (Bessel) sample std, as in veRL and TRL. A group whose rewards are
    all equal (including a group of one) gets exactly 0: it carries no learning signal.
    With norm_by_std=False this is Dr.GRPO (r - mean_group).
    Returns [N], float dtype of `rewards` (float32 for a list), no grad.
    """
    r = torch.as_tensor(rewards)
    out_dtype = r.dtype if r.is_floating_point() else torch.float32
    r = r.detach().to(torch.float64).reshape(-1)
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != r.numel():
        raise ValueError(f"group_ids has {len(ids)} entries but rewards has {r.numel()}")
    dense: dict[Hashable, int] = {}
    idx = torch.tensor([dense.setdefault(g, len(dense)) for g in ids],
                       dtype=torch.long, device=r.device)
    per_group = torch.zeros(len(dense), dtype=torch.float64, device=r.device)
    count = per_group.index_add(0, idx, torch.ones_like(r))
    mean = per_group.index_add(0, idx, r) / count
    centred = r - mean[idx]
    if norm_by_std:
        std = (per_group.index_add(0, idx, centred**2) / (count - 1).clamp(min=1)).sqrt()
        centred = centred / (std[idx] + eps)
    hi = per_group.scatter_reduce(0, idx, r, "amax", include_self=False)
    lo = per_group.scatter_reduce(0, idx, r, "amin", include_self=False)
    flat = (hi == lo)[idx]
    return torch.where(flat, torch.zeros_like(centred), centred).to(out_dtype)


def _grpo(rewards, group_ids, eps: float = 1e-6) -> Tensor:
    return group_advantages(rewards, group_ids, eps=eps, norm_by_std=True)


def _grpo_no_std(rewards, group_ids, eps: float = 1e-6) -> Tensor:
    return group_advantages(rewards, group_ids, eps=eps, norm_by_std=False)


AdvantageEstimator = Callable[..., Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {"grpo": _grpo, "grpo_no_std": _grpo_no_std}


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    return _lookup(ADVANTAGE_ESTIMATORS, name, "advantage estimator")


# ---------------------------------------------------------------- masks and log-probs

def response_mask(prompt_lens: Tensor | Sequence[int], total_lens: Tensor | Sequence[int],
                  seq_len: int) -> Tensor:
    """Bool [N, T]: True on response tokens of a right-padded batch.

    Row i holds prompt tokens at [0, prompt_lens[i]), response tokens at
    [prompt_lens[i], total_lens[i]) and padding after that; T = seq_len.
    """
    p = torch.as_tensor(prompt_lens, dtype=torch.long).reshape(-1, 1)
    t = torch.as_tensor(total_lens, dtype=torch.long).reshape(-1, 1)
    if p.shape != t.shape:
        raise ValueError(f"prompt_lens has {p.shape[0]} rows but total_lens has {t.shape[0]}")
    if bool((p < 0).any() | (t < p).any() | (t > seq_len).any()):
        raise ValueError(f"need 0 <= prompt_len <= total_len <= seq_len={seq_len} in every row")
    pos = torch.arange(seq_len).reshape(1, -1)
    return (pos >= p) & (pos < t)


def next_token_mask(prompt_lens, total_lens, seq_len: int) -> Tensor:
    """Bool [N, T-1] aligned with `token_logprobs`: column j scores token j+1."""
    return response_mask(prompt_lens, total_lens, seq_len)[:, 1:]


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log p(input_ids[:, j+1] | input_ids[:, :j+1]) -> float32 [N, T-1].

    logits: [N, T, V] from the causal LM over input_ids [N, T]. `temperature` must be the
    sampling temperature so the trainer scores the distribution vLLM sampled from.
    Memory: gathers the chosen logit and subtracts a per-row logsumexp, so no full
    [N, T, V] log-softmax is kept; low-precision logits are upcast one row at a time.
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(f"need logits [N,T,V] and input_ids [N,T], got "
                         f"{tuple(logits.shape)} and {tuple(input_ids.shape)}")
    logits = logits[:, :-1]
    targets = input_ids[:, 1:].long().unsqueeze(-1)
    rows = []
    for row, tgt in zip(logits, targets):
        row = row.float()
        if temperature != 1.0:
            row = row / temperature
        rows.append(row.gather(-1, tgt).squeeze(-1) - torch.logsumexp(row, dim=-1))
    return torch.stack(rows)


# ---------------------------------------------------------------- aggregation

def _token_mean(values: Tensor, mask: Tensor) -> Tensor:
    return values.sum() / mask.sum().clamp(min=1)


def _seq_mean_token_mean(values: Tensor, mask: Tensor) -> Tensor:
    per_seq_count = mask.sum(-1)
    per_seq = values.sum(-1) / per_seq_count.clamp(min=1)
    has_tokens = per_seq_count > 0
    return per_seq[has_tokens].sum() / has_tokens.sum().clamp(min=1)


Aggregator = Callable[[Tensor, Tensor], Tensor]
LOSS_AGGREGATIONS: dict[str, Aggregator] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
}


def aggregate(values: Tensor, mask: Tensor, agg: str = "token-mean") -> Tensor:
    """Reduce per-token values [N, L] under mask [N, L] to a scalar.

    token-mean: sum over unmasked tokens / their count (DAPO, token-level).
    seq-mean-token-mean: mean per sequence, then mean over sequences with tokens (GRPO).
    """
    fn = _lookup(LOSS_AGGREGATIONS, agg, "loss aggregation mode")
    mask = mask.bool()
    return fn(torch.where(mask, values, torch.zeros_like(values)), mask)


def _clean(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, torch.zeros_like(x))


# ---------------------------------------------------------------- KL

def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp).square()


def _low_var_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    log_r = (ref_logp - logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (log_r.exp() - log_r - 1).clamp(-_LOW_VAR_KL_CLAMP, _LOW_VAR_KL_CLAMP)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": _k1, "k2": _k2, "low_var_kl": _low_var_kl, "k3": _low_var_kl,
}


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs, [N, L].

    k1 = logp - ref_logp; k2 = (logp - ref_logp)^2 / 2;
    low_var_kl (k3, Schulman) = exp(ref - logp) - (ref - logp) - 1, log-ratio clamped to
    [-20, 20] and the result to [-10, 10] as in veRL.
    """
    return _lookup(KL_ESTIMATORS, kind, "KL estimator")(logp, ref_logp)


# ---------------------------------------------------------------- policy loss

def policy_loss(logp_new: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor,
                clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                agg: str = "token-mean", ref_logp: Tensor | None = None,
                kl_coef: float = 0.0, kl_kind: str = "low_var_kl",
                clip_ratio_c: float | None = None) -> tuple[Tensor, dict]:
    """PPO clipped surrogate with group advantages, plus an optional KL term.

    logp_new [N, L] (requires grad), logp_old [N, L], advantages [N] (one per sequence,
    broadcast over its tokens), mask [N, L]; ref_logp [N, L] when kl_coef > 0.
    Per token: r = exp(logp_new - logp_old), loss = -min(r*A, clip(r, 1-lo, 1+hi)*A);
    with dual-clip (clip_ratio_c = c > 1, as veRL) a token with A < 0 has
    loss = min(that, -A*c), so a ratio far above 1 cannot blow up the loss.
    Reduced with `agg`. Total = pg_loss + kl_coef * agg(kl_penalty(logp_new, ref_logp)).
    Returns (loss scalar, metrics of detached 0-dim tensors: pg_loss, clipfrac,
    clipfrac_lower (tokens bounded by the dual clip; 0 when it is off),
    approx_kl (mean of logp_old - logp_new), ratio_mean, and kl when kl_coef > 0).
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c must be > 1 (or None for off), got {clip_ratio_c}")
    mask = mask.bool()
    if logp_new.shape != mask.shape or logp_old.shape != mask.shape:
        raise ValueError(f"logp_new {tuple(logp_new.shape)}, logp_old {tuple(logp_old.shape)} "
                         f"and mask {tuple(mask.shape)} must have the same shape")
    new, old = _clean(logp_new, mask), _clean(logp_old.detach(), mask)
    adv = _clean(advantages.detach().reshape(-1, 1).to(new.dtype).expand_as(new), mask)
    log_ratio = (new - old).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(mask)
    if clip_ratio_c is not None:
        bound = -adv * clip_ratio_c
        negative = adv < 0
        dual = negative & (per_token > bound)
        per_token = torch.where(negative, torch.minimum(per_token, bound), per_token)
    pg_loss = aggregate(per_token, mask, agg)
    with torch.no_grad():
        metrics = {
            "pg_loss": pg_loss.detach(),
            "clipfrac": _token_mean(_clean((clipped > unclipped).float(), mask), mask),
            "clipfrac_lower": _token_mean(_clean(dual.float(), mask), mask),
            "approx_kl": _token_mean(_clean(-log_ratio, mask), mask),
            "ratio_mean": _token_mean(_clean(ratio, mask), mask),
        }
    loss = pg_loss
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = aggregate(kl_penalty(new, _clean(ref_logp.detach(), mask), kl_kind), mask, agg)
        loss = loss + kl_coef * kl
        metrics["kl"] = kl.detach()
    return loss, metrics
