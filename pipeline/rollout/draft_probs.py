"""Draft probabilities for vLLM's rejection sampler (part of the vLLM adapter).

A sampled model draft (`spec.draft_probs`) is verified with the distribution q it was drawn
from: vLLM accepts a token d with min(1, p(d) / q(d)) and corrects from max(p - q, 0). The
custom proposer hook returns token ids only, and the model runner clears its draft
probabilities before it calls a custom proposer; but it reads them at the next pass from
two attributes (`vllm/v1/worker/gpu_model_runner.py`, `_get_spec_decode_draft_probs`):
`_draft_probs` [rows, k, vocab] and `_draft_prob_req_ids`, row i being request ids[i]'s.
`hand_over` sets them after the proposer has chosen. `request_seed` reads the seed a
request samples with from the runner's request states, which a sampled draft draws from.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import torch

from pipeline.rollout.request_id import caller_id


def request_seed(runner: Any, req_id: str) -> int:
    """The sampling seed of vLLM's request `req_id` (its `SamplingParams.seed`, in the
    runner's request states): a sampled model draft of it draws from it
    (`pipeline.drafting.draft_sample`), so that a seeded run drafts the same on a rerun and
    after a resume. An unseeded request's is a hash of its id without vLLM's random suffix
    (its drafts then vary with the id, as its sampling varies anyway)."""
    state = runner.requests.get(req_id)
    seed = getattr(getattr(state, "sampling_params", None), "seed", None)
    if seed is not None:
        return int(seed)
    return zlib.crc32(str(caller_id(req_id) if isinstance(req_id, str) else req_id).encode())


def dense_rows(out: Sequence[Sequence[int]], sampled: dict[int, int], q: torch.Tensor | None,
               vocab: int, cols: torch.Tensor | None, device) -> tuple[list[int], torch.Tensor]:
    """(the rows that draft, their probabilities [those rows, k, vocab] fp32 on `device`).

    out[i]: row i's draft tokens (empty: no draft); sampled: row -> its row of q
    [rows, steps, columns], the distributions its draft was drawn from (its first
    len(out[i]) steps; column c is token cols[c], or token c where cols is None). Every
    other drafted row gets a one-hot row per token: a point mass verified with its one-hot
    row is accepted and corrected exactly as without probabilities. Every drafted row needs
    one: if any lacks a row vLLM verifies the whole pass as point masses (still lossless,
    as any draft independent of the verifier's random numbers is, but accepted less).
    Entries past a row's draft are never read (vLLM reads row[:its drafts]). The sampled
    rows come first, written as one block along the vocabulary, the one-hot entries in one
    scatter: at hundreds of rows over a real vocabulary a row-by-row copy, or one scatter
    of every entry, cost the host seconds a pass."""
    # the sampled rows first, so that their block is one view written along the vocabulary
    rows = list(sampled) + [i for i, toks in enumerate(out) if len(toks) and i not in sampled]
    k = max((len(out[i]) for i in rows), default=0)
    dense = torch.zeros(len(rows), k, vocab, dtype=torch.float32, device=device)
    if sampled:
        at = list(sampled.values())
        # the proposer's q holds the sampled rows in this order already (ModelSource
        # stacked them once): read it in place rather than gather a copy of it
        src = (q[:, :k] if at == list(range(len(q)))
               else q[torch.tensor(at, device=q.device), :k]).to(device)
        block = dense[:len(sampled), :src.shape[1]]
        if cols is None:
            block.copy_(src)
        else:
            block.index_copy_(2, cols.to(device), src)
    hot = [(r, t, v) for r, i in enumerate(rows[len(sampled):], len(sampled))
           for t, v in enumerate(out[i])]
    if hot:
        r, t, v = zip(*hot)
        dense[list(r), list(t), list(v)] = 1.0
    return rows, dense


def hand_over(runner: Any, req_ids: Sequence[str], rows: list[int], dense: torch.Tensor) -> None:
    """The runner's next pass verifies rows[j]'s draft (request req_ids[rows[j]]) with
    dense[j]."""
    runner._draft_probs = dense
    runner._draft_prob_req_ids = [req_ids[i] for i in rows]


__all__ = ["dense_rows", "hand_over", "request_seed"]
