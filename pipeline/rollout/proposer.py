"""rhymectl's drafter behind vLLM's custom proposer hook (part of the vLLM adapter).

vLLM builds the class named in the speculative config,

    speculative_config = {"method": "custom_class",
                          "model": "pipeline.rollout.proposer.RhymeProposer",
                          "num_speculative_tokens": 16}

as `RhymeProposer(vllm_config)` inside the model runner (`runner.drafter`), and after every
forward pass calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings=...)` (`vllm/v1/worker/gpu_model_runner.py`, `propose_draft_token_ids`).
Row i of those arguments is request `input_batch.req_ids[i]`; `sampled_token_ids[i]` holds
the tokens the pass emitted for it (accepted drafts plus one), empty for a partial
prefill. The return value is one list of draft ids per row; lengths may differ and an
empty list drafts nothing. vLLM verifies the drafts with its rejection sampler, so what
is drafted changes speed, never the output distribution.

The hook hands over no request ids or prompt lengths, and vLLM marks it experimental, so
every touch of it is here: with the engine in-process, `attach(runner, drafter, budget)`
gives the proposer vLLM built a reference to its model runner (whose `input_batch` it
reads: `req_ids`, `num_prompt_tokens`) and the drafting state, which lives across RL
steps. Until attached it drafts nothing. vLLM types are never imported: the proposer reads
`vllm_config` and the input batch by attribute only. Every `spec.budget` rule is driven
through the `Budget` protocol (`pipeline.drafting.budget_api`): ask, draft, grant, observe.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable, Sequence

import numpy as np
import torch

from pipeline.drafting.budget_api import Budget
from pipeline.drafting.choice import MODEL, TREE
from pipeline.drafting.drafter import GroupDrafter
from pipeline.drafting.suffix_tree import EMPTY_DRAFT
from pipeline.drafting.pass_caps import PassCaps
from pipeline.rollout.draft_probs import dense_rows, hand_over, request_seed
from pipeline.rollout.request_id import caller_id

if TYPE_CHECKING:
    from pipeline.drafting.model_source import ModelSource

CLASS_PATH = "pipeline.rollout.proposer.RhymeProposer"


def speculative_config(num_speculative_tokens: int) -> dict:
    """The `speculative_config` argument of `vllm.LLM` that installs `RhymeProposer`.

    num_speculative_tokens: the most draft tokens any request may get in one pass.
    """
    return {"method": "custom_class", "model": CLASS_PATH,
            "num_speculative_tokens": int(num_speculative_tokens)}


@dataclass
class ProposerStats:
    """Counters since the last `reset_stats`.

    seq_passes: (request, pass) pairs that emitted tokens after prefill; emitted: their
    tokens (`pipeline.costs.tau` of the two: tokens per target forward pass and sequence);
    drafted / accepted: draft tokens proposed / accepted. Pass times and scheduled tokens
    are counted by the engine's `PassMeter`, for every method.
    """

    passes: int = 0
    seq_passes: int = 0
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    propose_seconds: float = 0.0  # in `propose`, the parts below and the Python around them
    wait_seconds: float = 0.0  # waiting for the last pass's background work
    update_seconds: float = 0.0  # the pass's tokens recorded, requests started
    budget_seconds: float = 0.0  # draft lengths asked and granted
    resynced: int = 0  # rows whose tokens were taken again from vLLM's (`_resync`)
    longest: int = 0  # the longest draft proposed
    draft_seconds: float = 0.0  # drafts asked of the trees (with any feeding they need)
    model_seconds: float = 0.0  # the draft model's drafts and the choice (`ModelSource`)
    sampled: int = 0  # rows whose draft was sampled and verified with its probabilities


class RhymeProposer:
    """vLLM custom proposer drafting from `GroupDrafter`, sized by a `Budget`.

    `propose` runs after every target pass with a row per running request, so its
    per-row work is kept to C-level bulk operations wherever no request starts, stops
    or drafts; requests are stopped in the order they started.
    """

    def __init__(self, vllm_config: Any):
        self.max_spec_tokens = int(vllm_config.speculative_config.num_speculative_tokens)
        self.caps = PassCaps(self.max_spec_tokens)  # per-pass caps, from `bind`
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self._runner: Any = None
        self._prompt_lens: dict[str, int] = {}  # continued requests: original prompt length
        self.drafter: GroupDrafter | None = None
        self.budget: Budget | None = None
        self._active: dict[Hashable, None] = {}  # running requests, in start order
        self._proposed: dict[Hashable, int] = {}  # req -> draft tokens handed out last pass
        self._from_model: set[Hashable] = set()  # requests whose last draft was the model's
        self.model: ModelSource | None = None  # the draft model beside the trees, if any
        vocab = getattr(vllm_config.model_config, "get_vocab_size", None)
        self.vocab_size = int(vocab()) if callable(vocab) else None  # the target's logits' width
        self.stats = ProposerStats()

    def bind(self, runner: Any, drafter: GroupDrafter, budget: Budget,
             caps: PassCaps | None = None, model: ModelSource | None = None) -> None:
        """caps: draft tokens per request by pass size (never above the engine's
        num_speculative_tokens); None: that many in every pass. model: the draft model,
        offered each pass beside the trees' granted drafts (`ModelSource.choose`)."""
        self._runner, self.drafter, self.budget, self.model = runner, drafter, budget, model
        if model is not None and model.sample and self.vocab_size not in (None, model.vocab_size):
            raise ValueError(f"the draft model's vocabulary ({model.vocab_size} tokens) is not "
                             f"the policy's ({self.vocab_size}): its probabilities cannot be "
                             "verified against the policy's")
        if caps is not None:
            if caps.most > self.max_spec_tokens:
                raise ValueError(f"draft caps up to {caps.most} tokens, but the engine was "
                                 f"built for {self.max_spec_tokens}")
            self.caps = caps

    def continues(self, request_id: str, prompt_len: int) -> None:
        """The request `request_id` (as given to vLLM) continues a response: only its first
        `prompt_len` tokens are the prompt, the rest is output so far (a chunk placed on
        this engine by the scheduler). Drafting then keys it by the original prompt, so
        history and siblings still apply."""
        self._prompt_lens[request_id] = int(prompt_len)

    def _original_prompt_len(self, req_id: str, n_prompt: int) -> int:
        if not self._prompt_lens:
            return n_prompt
        external = caller_id(req_id) if isinstance(req_id, str) else req_id
        return min(n_prompt, self._prompt_lens.pop(external, n_prompt))

    def load_model(self, *args, **kwargs) -> None:
        """No draft model (vLLM may call this on every proposer)."""

    # -- the hook ---------------------------------------------------------------------
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec,
                token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        """Draft ids per row. num_tokens_no_spec[i]: tokens of row i so far (prompt +
        output, this pass's included); token_ids_cpu[i, :that]: those tokens."""
        rows = len(sampled_token_ids)
        if self._runner is None or not rows:
            return [[] for _ in range(rows)]
        start = time.perf_counter()
        stats = self.stats
        drafter, budget, active = self.drafter, self.budget, self._active
        waited = drafter.settle()  # the last pass's background work
        settled = time.perf_counter()
        req_ids = self._runner.input_batch.req_ids
        if len(req_ids) != rows:
            req_ids = req_ids[:rows]
        lens = list(map(len, sampled_token_ids))
        self._resync(req_ids, lens, num_tokens_no_spec, token_ids_cpu)
        room = self.max_model_len - 1 - np.asarray(num_tokens_no_spec[:rows])
        room = np.maximum(np.minimum(room, self.caps.cap(rows)), 0).tolist()
        if 0 not in lens and all(map(active.__contains__, req_ids)):
            # A decode pass: every row is a running request that emitted tokens.
            cand_rows, cand_ids, available = None, req_ids, room
            self._observe(req_ids, lens)
            drafter.append_many(req_ids, sampled_token_ids)
        else:
            cand_rows, cand_ids, available = self._admit(
                req_ids, lens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, room)
        updated = time.perf_counter()
        out: list[list[int]] = [[] for _ in range(rows)]
        drafted = 0
        # Budget first: in a full batch most requests get no draft tokens, and asking the
        # trees only for the tokens asked keeps the drafter's cost where it pays.
        asked = budget.ask(cand_ids, available, rows, drafter.remaining)
        allocated = drafts_done = time.perf_counter()
        choice_s = 0.0
        model = self.model
        if any(asked) or (model is not None and cand_ids):
            drafts = drafter.draft_many(cand_ids, asked) if any(asked) else \
                [EMPTY_DRAFT] * len(cand_ids)
            drafts_done = time.perf_counter()
            kept = budget.grant(drafts) if any(asked) else [0] * len(cand_ids)
            picked = time.perf_counter()
            if model is None:
                picks = [(TREE, d.token_ids[:k]) for d, k in zip(drafts, kept)]
            else:
                def context(j: int) -> list[int]:
                    i = j if cand_rows is None else cand_rows[j]
                    return token_ids_cpu[i, :int(num_tokens_no_spec[i])].tolist()

                picks = model.choose(cand_ids, [(d.token_ids[:k], d.probs[:k])
                                                for d, k in zip(drafts, kept)],
                                     available, context, drafter.remaining,
                                     lambda j: request_seed(self._runner, cand_ids[j]))
            choice_s = time.perf_counter() - picked
            proposed = self._proposed
            for j, (source, tokens) in enumerate(picks):
                from_tree = len(tokens) if source == TREE else 0
                if from_tree < len(drafts[j].token_ids):
                    drafter.cut(cand_ids[j], from_tree)  # judged on what was proposed
                k = len(tokens)
                if k:
                    i = j if cand_rows is None else cand_rows[j]
                    out[i] = tokens
                    proposed[req_ids[i]] = k
                    if source == MODEL:
                        self._from_model.add(req_ids[i])
                    drafted += k
                    if k > stats.longest:
                        stats.longest = k
        if model is not None and model.sampling:  # (the model's time, as the choice's)
            handing = time.perf_counter()
            sampled, q = model.take_probs()
            if sampled:  # q and one-hot rows for vLLM's rejection sampler
                drafting, dense = dense_rows(
                    out, {j if cand_rows is None else cand_rows[j]: n for j, n in sampled.items()},
                    q, self.vocab_size or model.vocab_size, model.vocab_ids,
                    getattr(self._runner, "device", None) or "cpu")
                hand_over(self._runner, req_ids, drafting, dense)
                stats.sampled += len(sampled)
            choice_s += time.perf_counter() - handing
        granted = time.perf_counter()
        if len(active) > rows or cand_rows is not None:
            seen = set(req_ids)
            for req_id in [r for r in active if r not in seen]:
                self._stop(req_id)
        # this pass's tokens into the trees while the GPU runs the next pass, and (caps that
        # do not move) the next drafts worked out for the outcome the trees expect
        drafter.after_pass(presume=budget.fixed_caps)
        stats.passes += 1
        stats.drafted += drafted
        end = time.perf_counter()
        stats.propose_seconds += end - start
        stats.wait_seconds += waited
        stats.update_seconds += updated - settled
        stats.budget_seconds += (allocated - updated) + (granted - drafts_done) - choice_s
        stats.model_seconds += choice_s
        stats.draft_seconds += drafts_done - allocated
        return out

    # -- lifecycle --------------------------------------------------------------------
    def end_step(self) -> None:
        """Call after each `generate`: requests of its last pass are never seen missing."""
        for req_id in list(self._active):
            self._stop(req_id)
        if self.drafter is not None:
            self.drafter.end_step()
        if self.model is not None:
            self.model.end_step()

    def reset_stats(self) -> ProposerStats:
        """Return the counters so far and start new ones."""
        stats, self.stats = self.stats, ProposerStats()
        return stats

    def _admit(self, req_ids, lens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
               room) -> tuple[list[int], list[Hashable], list[int]]:
        """A pass with starting or prefilling rows, row by row: start new requests, feed
        running ones. Returns the rows that may draft, their requests and room."""
        batch = self._runner.input_batch
        drafter, active = self.drafter, self._active
        cand_rows, cand_ids, available = [], [], []
        for i, req_id in enumerate(req_ids):
            if not lens[i]:  # partial prefill
                continue
            if req_id not in active:
                num_tokens = int(num_tokens_no_spec[i])
                n_prompt = int(batch.num_prompt_tokens[batch.req_id_to_index[req_id]])
                n_prompt = self._original_prompt_len(req_id, n_prompt)
                drafter.start(req_id, token_ids_cpu[i, :n_prompt].tolist(),
                              token_ids_cpu[i, n_prompt:num_tokens].tolist())
                active[req_id] = None
            else:
                self._observe((req_id,), (lens[i],))
                drafter.append(req_id, sampled_token_ids[i])
            cand_rows.append(i)
            cand_ids.append(req_id)
            available.append(room[i])
        return cand_rows, cand_ids, available

    def _resync(self, req_ids, lens, num_tokens_no_spec, token_ids_cpu) -> None:
        """Running requests whose tokens before this pass are not what the drafter holds
        get vLLM's. vLLM calls the proposer after a pass only while every sequence fits in
        the drafter (`_input_fits_in_drafter`): a pass without a call would leave the
        drafter behind, its drafts rejected at the first token from then on. The draft
        such a request had out is not observed (its outcome was never reported)."""
        rows = len(req_ids)
        ends = np.fromiter(self.drafter.ends(req_ids), dtype=np.int64, count=rows)
        new = np.fromiter(lens, dtype=np.int64, count=rows)
        bad = np.flatnonzero((ends + new != np.asarray(num_tokens_no_spec[:rows]))
                             & (ends >= 0) & (new > 0))
        for i in bad.tolist():
            before = int(num_tokens_no_spec[i]) - lens[i]
            self.drafter.resync(req_ids[i], token_ids_cpu[i, :before].tolist())
            self._proposed.pop(req_ids[i], None)
        self.stats.resynced += len(bad)

    def _observe(self, req_ids: Sequence[Hashable], lens: Sequence[int]) -> None:
        """Rows of running requests that emitted `lens` tokens: count them, and tell the
        budget how much of each request's last draft was accepted (in row order)."""
        stats = self.stats
        stats.seq_passes += len(lens)
        stats.emitted += sum(lens)
        proposed = self._proposed
        if not proposed:
            return
        if len(req_ids) == 1:
            hits = [(0, req_ids[0])] if req_ids[0] in proposed else []
        else:
            row = dict(zip(req_ids, range(len(req_ids))))
            hits = sorted((row[r], r) for r in proposed if r in row)
        for i, req_id in hits:
            k = proposed.pop(req_id)
            accepted = min(lens[i] - 1, k)
            stats.accepted += accepted
            if self.model is not None:  # it weighs both sources by how they fare
                self.model.observe(req_id, k, accepted)
            if req_id in self._from_model:
                self._from_model.discard(req_id)
            else:
                self.budget.observe(req_id, k, accepted)

    def _stop(self, req_id: Hashable) -> None:
        self._active.pop(req_id, None)
        self._proposed.pop(req_id, None)
        self._from_model.discard(req_id)
        self.drafter.finish(req_id)
        self.budget.forget(req_id)
        if self.model is not None:
            self.model.forget(req_id)


def attach(runner: Any, drafter: GroupDrafter, budget: Budget,
           caps: PassCaps | None = None, model: ModelSource | None = None) -> RhymeProposer:
    """Bind the proposer vLLM built in `runner` (the in-process model runner) to the state
    (caps, model: `RhymeProposer.bind`).

    Raises TypeError when the engine was not built with `speculative_config(...)`.
    """
    proposer = getattr(runner, "drafter", None)
    if not isinstance(proposer, RhymeProposer):
        raise TypeError("the vLLM engine has no RhymeProposer; build it with "
                        "speculative_config=pipeline.rollout.proposer.speculative_config(k)")
    proposer.bind(runner, drafter, budget, caps, model)
    return proposer


__all__ = ["CLASS_PATH", "ProposerStats", "RhymeProposer", "attach", "speculative_config"]
