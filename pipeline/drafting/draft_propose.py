"""Drafting with a `pipeline.drafting.draft_model.DraftModel`.

- `propose(model, contexts, k)`: k greedy draft tokens per context in one batched loop
  with a KV cache, and the model's probability of each drafted token (what a rule that
  chooses between draft sources needs to estimate acceptance).
- `propose_cached` with a `DraftCache`: the same drafts, each request's keys and values
  kept from one pass to the next as far as its context still agrees.
- `expected_accepted`: a draft's expected accepted tokens from those probabilities.

Where the model has a draft vocabulary (`DraftModel.use_draft_vocab`), drafts are its
tokens only, and a token's probability is the softmax over that vocabulary: an estimate
that leaves out the other tokens' mass (the choice rule calibrates each source's
estimates against what was accepted). Verification keeps the output the target's either
way.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from pipeline.drafting.draft_model import DraftModel

# -- drafting -----------------------------------------------------------------------------
@torch.inference_mode()
def propose(model: DraftModel, contexts: Sequence[Sequence[int]], k: int,
            temperature: float = 1.0) -> tuple[list[list[int]], list[list[float]]]:
    """k greedy draft tokens for each context (token ids: prompt and output so far), in one
    batched loop (one prefill of the left-padded contexts, then k - 1 one-token steps on a
    KV cache), and the model's probability of each drafted token at `temperature` (its
    estimate of the one-hot acceptance of that token where the model matches the
    policy). A context longer than the model's positions allow keeps its last tokens."""
    if k <= 0 or not contexts:
        return [[] for _ in contexts], [[] for _ in contexts]
    keep = max(1, model.shape.max_positions - k)
    ctx = [list(c)[-keep:] for c in contexts]
    if any(not c for c in ctx):
        raise ValueError("every context needs at least one token")
    b, width = len(ctx), max(map(len, ctx))
    ids = torch.zeros(b, width, dtype=torch.long)
    valid = torch.zeros(b, width, dtype=torch.bool)
    for j, c in enumerate(ctx):  # left padding: every row's next token is at `width`
        ids[j, width - len(c):] = torch.tensor(c, dtype=torch.long)
        valid[j, width - len(c):] = True
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    mask = (causal[None] & valid[:, None, :])[:, None]  # [b, 1, t, keys]
    # a padded query row attends to nothing real; let it see itself so softmax stays finite
    mask = mask | torch.eye(width, dtype=torch.bool)[None, None]
    caches: list = [[] for _ in model.model.layers]
    logits = model(ids, positions, mask, caches, draft_vocab=True, last=True)[:, -1]
    toks, probs, _ = _greedy_steps(model, logits, positions[:, -1] + 1, valid, caches, k,
                                   temperature)
    return toks, probs


def _greedy_steps(model: DraftModel, logits: torch.Tensor, nxt_pos: torch.Tensor,
                  keys_valid: torch.Tensor, caches: list, k: int, temperature: float,
                  stop_below: float = 0.0):
    """Up to k greedy tokens per row from the prefill's last logits, one one-token step
    on the KV cache after each but the last: (tokens, each token's probability at
    `temperature`, the key slots' validity after the steps). Every row gets as many
    tokens; fewer than k once every row's path probability (the product of its tokens'
    probabilities) is below `stop_below`, where no row's draft would be kept further."""
    b = logits.shape[0]
    tokens, probs = [], []
    inv_t = 1.0 / max(float(temperature), 1e-6)
    vocab = model.draft_ids  # logits' column i is token vocab[i] (None: token i)
    path = torch.ones(b)
    for step in range(k):
        prob = torch.softmax(logits.float() * inv_t, dim=-1)
        col = logits.argmax(-1)
        tok = col if vocab is None else vocab[col]
        tokens.append(tok)
        probs.append(prob.gather(1, col[:, None])[:, 0])
        path = path * probs[-1]
        if step == k - 1 or bool((path < stop_below).all()):
            break
        keys_valid = torch.cat((keys_valid, torch.ones(b, 1, dtype=torch.bool)), dim=1)
        logits = model(tok[:, None], nxt_pos[:, None], keys_valid[:, None, None], caches,
                       draft_vocab=True, last=True)[:, -1]
        nxt_pos = nxt_pos + 1
    return torch.stack(tokens, 1).tolist(), torch.stack(probs, 1).tolist(), keys_valid


class DraftCache:
    """The draft model's keys and values per request, kept from one pass to the next so
    that `propose_cached` runs only the tokens a request gained since its last draft
    (the accepted draft tokens and the pass's own token), not its whole context."""

    def __init__(self):
        self._rows: dict[Hashable, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def forget(self, req_id: Hashable) -> None:
        """The request stopped (or its tokens were replaced): its entry goes."""
        self._rows.pop(req_id, None)

    def clear(self) -> None:
        self._rows.clear()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@torch.inference_mode()
def propose_cached(model: DraftModel, cache: DraftCache, req_ids: Sequence[Hashable],
                   contexts: Sequence[Sequence[int]], k: int, temperature: float = 1.0,
                   stop_below: float = 0.0) -> tuple[list[list[int]], list[list[float]]]:
    """`propose` for running requests, reusing each request's keys and values from its
    last call as far as its context still agrees with what they were computed for (its
    context then, and the draft tokens after it). The drafts are `propose`'s (their first
    tokens only, fewer than k, once every row's path probability is below `stop_below`:
    `_greedy_steps`); a context longer than the model's positions allow is recomputed
    whole (its window moved)."""
    if k <= 0 or not contexts:
        return [[] for _ in contexts], [[] for _ in contexts]
    keep = max(1, model.shape.max_positions - k)
    layers = len(model.model.layers)
    past_len, pasts, news, ctxs = [], [], [], []
    for req, c in zip(req_ids, contexts):
        c = [int(t) for t in c]
        if not c:
            raise ValueError("every context needs at least one token")
        if len(c) > keep:
            cache.forget(req)
            c = c[-keep:]
        held = cache._rows.get(req)
        p = 0 if held is None else min(_common_prefix(held[0], c), len(c) - 1)
        past_len.append(p)
        pasts.append(None if held is None or p == 0 else
                     [(kk[:, :p], vv[:, :p]) for kk, vv in held[1]])
        news.append(c[p:])
        ctxs.append(c)
    b = len(ctxs)
    P, N = max(past_len), max(map(len, news))
    s = model.shape
    # key slots: [left pad | past] [left pad | new], positions explicit for RoPE
    ids = torch.zeros(b, N, dtype=torch.long)
    qpos = torch.zeros(b, N, dtype=torch.long)
    kpos = torch.full((b, P + N), -1, dtype=torch.long)
    for j, (p, new) in enumerate(zip(past_len, news)):
        n = len(new)
        ids[j, N - n:] = torch.tensor(new, dtype=torch.long)
        qpos[j, N - n:] = torch.arange(p, p + n)
        kpos[j, P - p:P] = torch.arange(p)
        kpos[j, P + N - n:] = torch.arange(p, p + n)
    valid = kpos >= 0
    mask = valid[:, None, :] & (kpos[:, None, :] <= qpos[:, :, None])
    # a padded query slot attends to itself only, so that its softmax stays finite
    mask[:, :, P:] |= torch.eye(N, dtype=torch.bool)[None]
    caches: list = [[] for _ in range(layers)]
    if P:
        for i in range(layers):
            kk = torch.zeros(b, s.kv_heads, P, s.head_dim)
            vv = torch.zeros(b, s.kv_heads, P, s.head_dim)
            for j, (p, past) in enumerate(zip(past_len, pasts)):
                if p:
                    kk[j, :, P - p:] = past[i][0]
                    vv[j, :, P - p:] = past[i][1]
            caches[i] = [kk, vv]
    logits = model(ids, qpos, mask[:, None], caches, draft_vocab=True, last=True)[:, -1]
    toks, probs, keys_valid = _greedy_steps(model, logits, qpos[:, -1] + 1, valid, caches, k,
                                            temperature, stop_below)
    for j, req in enumerate(req_ids):
        slots = torch.nonzero(keys_valid[j])[:, 0]  # past, new, then all drafted but the last
        cache._rows[req] = (ctxs[j] + toks[j][:len(toks[j]) - 1],
                            [(c[0][j][:, slots].clone(), c[1][j][:, slots].clone())
                             for c in caches])
    return toks, probs


def expected_accepted(probs: Sequence[float]) -> float:
    """Expected accepted tokens of a draft whose tokens are accepted with these
    probabilities in turn (each only if all before it were): sum of the prefix products."""
    total, run = 0.0, 1.0
    for p in probs:
        run *= float(p)
        total += run
    return total


__all__ = ["DraftCache", "expected_accepted", "propose", "propose_cached"]
