"""Drafting with a `pipeline.drafting.draft_model.DraftModel`.

- `propose(model, contexts, k)`: k greedy draft tokens per context in one batched loop
  with a KV cache, and the model's probability of each drafted token (what a rule that
  chooses between draft sources needs to estimate acceptance).
- `propose_cached` with a `DraftCache`: the same drafts, each request's keys and values
  kept from one pass to the next as far as its context still agrees.
- `sample_cached`: those drafts drawn from the model's distribution instead of taken at
  its argmax, seeded per request and position, with the distributions drawn from (what
  vLLM's rejection sampler verifies them with: `pipeline.drafting.draft_sample`).
- `expected_accepted`: a draft's expected accepted tokens from those probabilities.

Where the model has a draft vocabulary (`DraftModel.use_draft_vocab`), drafts are its
tokens only, and a token's probability is the softmax over that vocabulary: an estimate
that leaves out the other tokens' mass (the choice rule calibrates each source's
estimates against what was accepted). Verification keeps the output the target's either
way.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import numpy as np
import torch

from pipeline.drafting.draft_model import DraftModel, KVCache
from pipeline.drafting.draft_sample import sample_columns, uniforms

PREFILL_TOKENS = 16384  # new tokens one forward of a draft's batch runs at most (`_prefill`)

# -- drafting -----------------------------------------------------------------------------
@torch.inference_mode()
def propose(model: DraftModel, contexts: Sequence[Sequence[int]], k: int,
            temperature: float = 1.0) -> tuple[list[list[int]], list[list[float]]]:
    """k greedy draft tokens for each context (token ids: prompt and output so far), in one
    batched loop (one prefill of the left-padded contexts, then k - 1 one-token steps on a
    KV cache), and the model's probability of each drafted token at `temperature` (its
    estimate of the one-hot acceptance of that token where the model matches the
    policy). A context longer than the model's positions allow keeps its last tokens.
    Runs where the model's weights are (`DraftModel.device`)."""
    if k <= 0 or not contexts:
        return [[] for _ in contexts], [[] for _ in contexts]
    keep = max(1, model.shape.max_positions - k)
    ctx = [list(c)[-keep:] for c in contexts]
    if any(not c for c in ctx):
        raise ValueError("every context needs at least one token")
    dev = model.device
    b, width = len(ctx), max(map(len, ctx))
    # left padding: every row's next token is at `width`
    ids = torch.tensor([[0] * (width - len(c)) + c for c in ctx], dtype=torch.long, device=dev)
    lengths = torch.tensor([len(c) for c in ctx], dtype=torch.long, device=dev)
    valid = torch.arange(width, device=dev)[None] >= (width - lengths)[:, None]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    # a padded query row attends to nothing real; let it see itself so softmax stays finite
    causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
    itself = torch.eye(width, dtype=torch.bool, device=dev)[None, None]

    def mask(rows: slice) -> torch.Tensor:  # [rows, 1, t, keys]
        return (causal[None] & valid[rows, None, :])[:, None] | itself

    caches = model.new_caches(b, width + k)
    logits = _prefill(model, ids, positions, mask, caches)
    toks, probs, _, _ = _draft_steps(model, logits, positions[:, -1] + 1, valid, caches, k,
                                     temperature)
    return toks, probs


def _prefill(model: DraftModel, ids: torch.Tensor, positions: torch.Tensor,
             mask: Callable[[slice], torch.Tensor], caches: list[KVCache]) -> torch.Tensor:
    """The model over each row's new tokens [b, t] (positions [b, t], mask(rows): those
    rows' attention mask [rows, 1, t, keys]), their keys and values written into `caches`
    after what they hold: the last position's logits [b, vocab]. Rows go through
    PREFILL_TOKENS tokens at a time, each slice's mask made for it: 512 requests' first
    thousands of tokens in one forward would hold tens of GB of activations and masks.
    Rows are independent: the same logits, to float rounding."""
    b, t = ids.shape
    rows = max(1, PREFILL_TOKENS // t)
    if rows >= b:
        return model(ids, positions, mask(slice(None)), caches, draft_vocab=True,
                     last=True)[:, -1]
    held = caches[0].length
    out = []
    for r in range(0, b, rows):
        part = [KVCache(c.k[r:r + rows], c.v[r:r + rows], held) for c in caches]
        at = slice(r, r + rows)
        out.append(model(ids[at], positions[at], mask(at), part, draft_vocab=True,
                         last=True)[:, -1])
    for c in caches:
        c.length = held + t
    return torch.cat(out)


def _draft_steps(model: DraftModel, logits: torch.Tensor, nxt_pos: torch.Tensor,
                 keys_valid: torch.Tensor, caches: list[KVCache], k: int, temperature: float,
                 stop_below: float = 0.0, draw: Callable[[int], torch.Tensor] | None = None,
                 more: Callable[[torch.Tensor], bool] | None = None):
    """Up to k draft tokens per row from the prefill's last logits, one one-token step
    on the KV caches (room for k - 1 more slots) after each but the last: (tokens, each
    token's acceptance estimate at `temperature`, the key slots' validity after the steps,
    the distributions drawn from). Every row gets as many tokens; fewer than k once every
    row's path probability (the product of its estimates) is below `stop_below`, where no
    row's draft would be kept further, or once `more(path)` (given the rows' path
    probabilities [b]) says the next step does not pay (`choice.worth_a_step`).

    draw None: greedy (the argmax; no distributions: None). draw(step): uniforms [b] in
    (0, 1), and each token is drawn from q = softmax(logits / temperature) with them
    (`draft_sample.sample_columns`); the distributions are then a list per step of q
    [b, V] (over the draft vocabulary where the model has one), what vLLM's rejection
    sampler must be given with the tokens. The estimate is q's largest probability either
    way: the one-hot acceptance of the argmax where the model matches the policy, a lower
    estimate of what a sampled draft verified with q has accepted (sum_x min(p, q))."""
    b, dev = logits.shape[0], logits.device
    tokens, probs, dists = [], [], ([] if draw is not None else None)
    inv_t = 1.0 / max(float(temperature), 1e-6)
    vocab = model.draft_ids  # logits' column i is token vocab[i] (None: token i)
    path = torch.ones(b, device=dev)
    new_slot = torch.ones(b, 1, dtype=torch.bool, device=dev)
    for step in range(k):
        prob = torch.softmax(logits.float() * inv_t, dim=-1)
        col = logits.argmax(-1)
        top = prob.gather(1, col[:, None])[:, 0]
        if draw is not None:
            col = sample_columns(prob, draw(step))
            dists.append(prob)
        tok = col if vocab is None else vocab[col]
        tokens.append(tok)
        probs.append(top)
        path = path * top
        if step == k - 1 or bool((path < stop_below).all()) \
                or (more is not None and not more(path)):
            break
        keys_valid = torch.cat((keys_valid, new_slot), dim=1)
        logits = model(tok[:, None], nxt_pos[:, None], keys_valid[:, None, None], caches,
                       draft_vocab=True, last=True)[:, -1]
        nxt_pos = nxt_pos + 1
    return (torch.stack(tokens, 1).tolist(), torch.stack(probs, 1).tolist(), keys_valid,
            dists)


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


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share. Slices are compared whole (at C speed),
    halving the span where they differ: a request's context of thousands of tokens agrees
    with what its keys were computed for up to its last few tokens, and a token-by-token
    loop over it for every request and pass cost the host tenths of a second a pass."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; they differ before hi, or hi is the end
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


@torch.inference_mode()
def propose_cached(model: DraftModel, cache: DraftCache, req_ids: Sequence[Hashable],
                   contexts: Sequence[Sequence[int]], k: int, temperature: float = 1.0,
                   stop_below: float = 0.0, more: Callable[[torch.Tensor], bool] | None = None
                   ) -> tuple[list[list[int]], list[list[float]]]:
    """`propose` for running requests, reusing each request's keys and values from its
    last call as far as its context still agrees with what they were computed for (its
    context then, and the draft tokens after it). The drafts are `propose`'s (their first
    tokens only, fewer than k, once every row's path probability is below `stop_below` or
    `more` says no further step pays: `_draft_steps`); a context longer than the model's
    positions allow is recomputed whole (its window moved)."""
    toks, probs, _ = _cached(model, cache, req_ids, contexts, k, temperature, stop_below,
                             more=more)
    return toks, probs


@torch.inference_mode()
def sample_cached(model: DraftModel, cache: DraftCache, req_ids: Sequence[Hashable],
                  contexts: Sequence[Sequence[int]], k: int, temperature: float,
                  seeds: Sequence[int], stop_below: float = 0.0,
                  more: Callable[[torch.Tensor], bool] | None = None
                  ) -> tuple[list[list[int]], list[list[float]], list[torch.Tensor]]:
    """`propose_cached`, each token drawn from the model's distribution q at `temperature`
    instead of its argmax, row j's at absolute position t with `uniforms(seeds[j], t)`
    (`pipeline.drafting.draft_sample`): the same drafts for the same contexts, seeds and
    weights, however the rows are batched. Returns the tokens, their estimates and q per
    step ([b, V] each: row j's first len(tokens[j]) of them are its draft's)."""
    if len(seeds) != len(contexts):
        raise ValueError(f"{len(seeds)} seeds for {len(contexts)} contexts")
    return _cached(model, cache, req_ids, contexts, k, temperature, stop_below, seeds, more)


def _cached(model, cache, req_ids, contexts, k, temperature, stop_below, seeds=None,
            more=None):
    """(tokens, estimates, distributions or None) of `propose_cached` / `sample_cached`."""
    if k <= 0 or not contexts:
        return [[] for _ in contexts], [[] for _ in contexts], ([] if seeds is not None else None)
    keep = max(1, model.shape.max_positions - k)
    draw = None
    if seeds is not None:  # row j's token at step s sits at absolute position len(c_j) + s
        ends = np.asarray([len(c) for c in contexts], dtype=np.int64)
        row_seeds = list(seeds)

        def draw(step: int) -> torch.Tensor:
            return torch.from_numpy(uniforms(row_seeds, ends + step))
    past_len, pasts, news, ctxs = [], [], [], []
    for req, c in zip(req_ids, contexts):
        # (a list as it is: converting thousands of tokens per request and pass one by one
        # cost the host more than the draft's forward at hundreds of requests)
        c = c if type(c) is list else [int(t) for t in c]
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
    dev = model.device
    # key slots: [left pad | past] [left pad | new], positions explicit for RoPE (-1: a pad)
    ids = torch.tensor([[0] * (N - len(new)) + new for new in news], dtype=torch.long,
                       device=dev)
    had = torch.tensor(past_len, dtype=torch.long, device=dev)[:, None]
    gained = torch.tensor([len(new) for new in news], dtype=torch.long, device=dev)[:, None]
    past_pos = torch.arange(P, device=dev)[None] - (P - had)
    new_slot = torch.arange(N, device=dev)[None] - (N - gained)  # its index among the new
    new_pos = torch.where(new_slot >= 0, new_slot + had, -1)
    kpos = torch.cat((past_pos.clamp(min=-1), new_pos), dim=1)
    qpos = new_pos.clamp(min=0)
    valid = kpos >= 0
    itself = torch.zeros(N, P + N, dtype=torch.bool, device=dev)
    itself[:, P:] = torch.eye(N, dtype=torch.bool, device=dev)

    def mask(rows: slice) -> torch.Tensor:  # [rows, 1, N, keys]
        # a padded query slot attends to itself only, so that its softmax stays finite
        return ((valid[rows, None, :] & (kpos[rows, None, :] <= qpos[rows, :, None]))
                | itself)[:, None]

    # the past written once into buffers with room for the new tokens and the draft's
    caches = model.new_caches(b, P + N + k)
    for i, c in enumerate(caches):
        for j, (p, past) in enumerate(zip(past_len, pasts)):
            if p:
                c.k[j, :, P - p:P] = past[i][0]
                c.v[j, :, P - p:P] = past[i][1]
        c.length = P
    logits = _prefill(model, ids, qpos, mask, caches)
    toks, probs, keys_valid, dists = _draft_steps(model, logits, qpos[:, -1] + 1, valid,
                                                  caches, k, temperature, stop_below, draw,
                                                  more)
    for j, req in enumerate(req_ids):
        slots = torch.nonzero(keys_valid[j])[:, 0]  # past, new, then all drafted but the last
        cache._rows[req] = (ctxs[j] + toks[j][:len(toks[j]) - 1],
                            [(c.k[j][:, slots], c.v[j][:, slots]) for c in caches])
    return toks, probs, dists


def expected_accepted(probs: Sequence[float]) -> float:
    """Expected accepted tokens of a draft whose tokens are accepted with these
    probabilities in turn (each only if all before it were): sum of the prefix products."""
    total, run = 0.0, 1.0
    for p in probs:
        run *= float(p)
        total += run
    return total


__all__ = ["DraftCache", "expected_accepted", "propose", "propose_cached", "sample_cached"]
