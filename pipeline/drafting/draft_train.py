"""Training a `pipeline.drafting.draft_model.DraftModel` online, and its state.

- `DraftTrainer`: one call takes one step's rollouts (prompt ids, response ids and,
  where the trainer computed it, the policy's `Teacher`: its k most likely tokens at each
  response position) and runs a fixed number of AdamW updates on the response tokens of
  the last `window` steps' rollouts (this one and those kept from earlier calls), each
  token weighted by its response's length relative to its step's mean, since the longest
  responses set the step's critical path. A token with a teacher is learnt by
  cross-entropy against the teacher's k tokens, their probabilities renormalised
  (distillation: the draft learns the policy's distribution, not one sample of it); one
  without, against the sampled token. With a draft vocabulary (`TrainSettings.draft_vocab`)
  the softmax is over its tokens only, the distribution the draft then drafts from: the
  teacher's tokens outside it are dropped and the rest renormalised, a position with no
  target inside it is not trained on, and the LM head is computed for its rows alone (over
  a real vocabulary the head is most of an update's work), as EAGLE-3 trains its draft
  (`pipeline.drafting.draft_targets`). A fixed number of updates, not a time budget, so
  that the same seed and rollouts give the same weights.
- Its state for checkpoints: `pipeline.drafting.draft_state`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from pipeline import draft_shape
from pipeline.draft_shape import DRAFT_BATCH
from pipeline.drafting.draft_model import DraftModel
from pipeline.drafting.draft_targets import (Vocab, batch_targets, in_vocab, pieces,
                                              target_rows, weight_of)
from pipeline.train.teacher import Teacher

WARM_UP_SEED = 7_777  # the warm-up's batch order: apart from every step's (seed, calls)


def _ids(tokens) -> torch.Tensor:
    """Token ids (a sequence or tensor) as a compact 1-D int32 tensor."""
    if isinstance(tokens, torch.Tensor):
        return tokens.reshape(-1).to(torch.int32)
    return torch.tensor([int(t) for t in tokens], dtype=torch.int32, device="cpu")


# -- online training ----------------------------------------------------------------------
@dataclass(frozen=True)
class TrainReport:
    """One `DraftTrainer.train` call: weighted loss on its rollouts before and after;
    updates, tokens trained on, seconds, and the call's response tokens with a teacher."""

    loss_before: float
    loss_after: float
    updates: int
    tokens: int
    seconds: float
    taught: int = 0


@dataclass(frozen=True)
class TrainSettings:
    """updates: AdamW steps per call; batch: responses per step; window: the updates draw
    from the rollouts of this many steps (the call's and the window - 1 before it: the
    next rollout's prompts are rarely this one's, and a few steps' responses teach the
    policy's habits rather than one step's text); length_power: each response token
    weighs (length / its step's mean length) ** length_power; draft_vocab: the model
    trains and drafts over at most draft_vocab tokens, the most frequent of those in the
    responses it has trained on so far (0, or a vocabulary no larger: every token)."""

    updates: int = 20
    batch: int = DRAFT_BATCH
    window: int = 3
    lr: float = 3e-4
    weight_decay: float = 0.0
    length_power: float = 1.0
    max_grad_norm: float = 1.0
    draft_vocab: int = 0


class DraftTrainer:
    """Trains a `DraftModel` on each step's rollouts, where the model's weights are (the
    rollouts and the batch order stay on the CPU); deterministic given the seed on a CPU
    (a GPU's kernels need not repeat bit for bit)."""

    def __init__(self, model: DraftModel, settings: TrainSettings = TrainSettings(),
                 seed: int = 0):
        self.model = model
        self.settings = settings
        self.seed = int(seed)
        self.calls = 0  # train calls so far: the batch order's seed moves with it
        self.opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.99),
                                     weight_decay=settings.weight_decay)
        # response tokens trained on so far, per token id: what the draft vocabulary keeps
        self.counts = torch.zeros(model.shape.vocab_size, dtype=torch.long, device="cpu")
        # the last `settings.window` calls' rollouts, oldest first: (prompt, response)
        # int32 tensors per rollout (compact: a GPU run's step holds millions of tokens)
        # and its `Teacher` (None: learnt from the sampled tokens)
        self.window: list[list[tuple[torch.Tensor, torch.Tensor, Teacher | None]]] = []

    def draft_vocab(self) -> torch.Tensor | None:
        """The draft vocabulary: of the token ids counted at least once in `counts`, the
        settings.draft_vocab most frequent (ties: the lower id), ascending; None (every
        token) where the setting is 0 or no smaller than the vocabulary, or nothing was
        counted."""
        if not 0 < self.settings.draft_vocab < self.counts.numel():
            return None
        size = min(self.settings.draft_vocab, int((self.counts > 0).sum()))
        if size <= 0:
            return None
        order = torch.argsort(-self.counts, stable=True)
        return order[:size].sort().values

    def _vocab(self) -> Vocab | None:
        """The draft vocabulary's ids and the lookup from a token id to its column."""
        ids = self.draft_vocab()
        if ids is None:
            return None
        column = torch.full((self.counts.numel(),), -1, dtype=torch.long, device="cpu")
        column[ids] = torch.arange(len(ids), device="cpu")
        return Vocab(ids.to(self.model.device), column)

    def _count(self, rollouts: Sequence[tuple]) -> None:
        ids = [_ids(r).long() for _, r, *_ in rollouts if len(r)]
        if ids:
            ids = torch.cat(ids)
            ids = ids[(ids >= 0) & (ids < self.counts.numel())]
            self.counts += torch.bincount(ids, minlength=self.counts.numel())

    def _examples(self, rollouts: Sequence[tuple]):
        """(ids, first response position, weight, teacher or None) per rollout with a
        response; each sequence (and its teacher) cut to the model's positions."""
        limit = self.model.shape.max_positions
        kept = [_rollout(x) for x in rollouts if len(x[1]) and len(x[0])]
        if not kept:
            return []
        mean = sum(len(r) for _, r, _ in kept) / len(kept)
        power = self.settings.length_power
        return [(torch.cat((p, r))[:limit], len(p), (len(r) / mean) ** power,
                 None if t is None else t.cut(limit - len(p)))
                for p, r, t in kept if len(p) < limit]

    def _loss(self, batch, vocab: Vocab | None) -> tuple[torch.Tensor, int]:
        """Weighted mean next-token cross-entropy over the response tokens of `batch`."""
        total, weights, count = self._loss_sum(batch, vocab)
        return total / weights.clamp(min=1e-9), count

    def _loss_sum(self, batch, vocab: Vocab | None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The weighted next-token cross-entropy summed over the response tokens of
        `batch` (over `vocab`'s tokens, where there is one), the sum of their weights, and
        their count."""
        width = max(len(ids) for ids, *_ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long, device="cpu")
        weight = torch.zeros(len(batch), width - 1, device="cpu")
        for j, (seq, start, w, _) in enumerate(batch):
            ids[j, :len(seq)] = seq
            weight[j, start - 1:len(seq) - 1] = w  # positions that predict response tokens
        # right padding: the causal mask suffices; the LM head (the vocabulary-wide matmul,
        # most of the cost for a real vocabulary) only where a response token is predicted
        where = weight > 0
        targets = ids[:, 1:][where]  # the sampled tokens, in `where`'s row-major order
        soft = batch_targets(batch, targets)
        if vocab is not None:
            keep, targets, soft = in_vocab(vocab.column, targets, soft)
            where[where.clone()] = keep
        ids, weight = ids.to(self.model.device), weight.to(self.model.device)
        hidden = self.model.hidden(ids[:, :-1])
        where = where.to(self.model.device)
        h, w = hidden[where], weight[where]
        targets = targets.to(self.model.device) if soft is None else \
            tuple(x.to(self.model.device) for x in soft)
        loss = self._weighted_ce if soft is None else self._weighted_soft_ce
        rows = None if vocab is None else vocab.ids
        columns = self.model.shape.vocab_size if rows is None else len(rows)
        chunk = max(1, draft_shape.LOSS_CHUNK_BYTES // (4 * columns))
        if len(h) <= chunk:
            total = loss(h, targets, w, rows)
        else:  # each chunk's logits recomputed in the backward pass, never all kept
            total = sum(checkpoint(loss, h[i:i + chunk], target_rows(targets, i, i + chunk),
                                   w[i:i + chunk], rows, use_reentrant=False)
                        for i in range(0, len(h), chunk))
        return total, w.sum(), int(where.sum())

    def _backward(self, batch, vocab: Vocab | None) -> int:
        """The gradient of `batch`'s weighted mean loss, in pieces of at most
        `MICRO_TOKENS` padded tokens (`pieces`) whose gradients add up to the whole's;
        the tokens trained on."""
        parts = pieces(batch, draft_shape.MICRO_TOKENS)
        if len(parts) == 1:  # one forward and backward, as a minibatch that fits always ran
            value, n = self._loss(batch, vocab)
            value.backward()
            return n
        weights, n = max(weight_of(batch, vocab), 1e-9), 0
        for part in parts:
            total, _, count = self._loss_sum(part, vocab)
            (total / weights).backward()
            n += count
        return n

    def _weighted_ce(self, hidden: torch.Tensor, targets: torch.Tensor,
                     weight: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """Sum of the weighted next-token cross-entropies of final-norm hidden states
        (targets: columns of `rows`, or token ids where it is None)."""
        ce = F.cross_entropy(self.model.logits(hidden, rows), targets, reduction="none")
        return (ce * weight).sum()

    def _weighted_soft_ce(self, hidden: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor],
                          weight: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """Sum of the weighted cross-entropies against soft targets (columns [P, k] and
        their probabilities [P, k]) of final-norm hidden states."""
        ids, probs = targets
        logq = torch.log_softmax(self.model.logits(hidden, rows).float(), dim=-1)
        ce = -(logq.gather(-1, ids) * probs).sum(-1)
        return (ce * weight).sum()

    def loss(self, rollouts: Sequence[tuple]) -> float:
        """The weighted loss on `rollouts` (no update)."""
        examples = self._examples(rollouts)
        if not examples:
            return float("nan")
        vocab = self._vocab()
        with torch.no_grad():
            total, weights = 0.0, 0.0
            for i in range(0, len(examples), self.settings.batch):
                for part in pieces(examples[i:i + self.settings.batch], draft_shape.MICRO_TOKENS):
                    value, _ = self._loss(part, vocab)
                    w = weight_of(part, vocab)
                    total, weights = total + float(value) * w, weights + w
        return total / weights if weights else float("nan")

    def warm_up(self, rollouts: Sequence[tuple], updates: int) -> TrainReport:
        """Before the first step (`pipeline.loop.warmup`): `updates` AdamW steps on
        `rollouts` with an optimizer and a batch order of their own, outside the window (the
        per-step training then goes on from these weights with its own moments, its window
        the run's rollouts only); their tokens count toward the draft vocabulary."""
        warm = DraftTrainer(self.model, replace(self.settings, updates=int(updates), window=1),
                            self.seed + WARM_UP_SEED)
        warm.counts = self.counts  # shared: `_count` adds in place
        return warm.train(rollouts)

    def train(self, rollouts: Sequence[tuple]) -> TrainReport:
        """`settings.updates` AdamW steps on minibatches of `rollouts` (prompt ids,
        response ids[, its `Teacher` or None]) and the window's earlier steps',
        reshuffled each pass over them from (seed, calls)."""
        start = time.perf_counter()
        step = [_rollout(x) for x in rollouts]
        taught = sum(len(t) for *_, t in step if t is not None)
        self._count(rollouts)
        self.window = (self.window + [step])[-max(1, self.settings.window):]
        examples = [e for kept in self.window for e in self._examples(kept)]
        if not examples:
            self.model.use_draft_vocab(self.draft_vocab())
            return TrainReport(float("nan"), float("nan"), 0, 0, 0.0, taught)
        before = self.loss(rollouts)
        vocab = self._vocab()
        gen = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + self.calls)
        s = self.settings
        order: list[int] = []
        tokens = 0
        self.model.train()
        for _ in range(s.updates):
            if len(order) < min(s.batch, len(examples)):
                order += torch.randperm(len(examples), generator=gen, device="cpu").tolist()
            picked, order = order[:s.batch], order[s.batch:]
            self.opt.zero_grad(set_to_none=True)
            n = self._backward([examples[i] for i in picked], vocab)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.max_grad_norm)
            self.opt.step()
            tokens += n
        self.model.eval()
        self.model.use_draft_vocab(self.draft_vocab())  # the head's rows as trained
        self.calls += 1
        return TrainReport(before, self.loss(rollouts), s.updates, tokens,
                           time.perf_counter() - start, taught)


def _rollout(x: tuple) -> tuple[torch.Tensor, torch.Tensor, Teacher | None]:
    """(prompt, response[, teacher]) as int32 tensors and the teacher (None where there is
    none); ValueError where the teacher does not cover the response token for token."""
    prompt, response, teacher = (*x, None)[:3]
    response = _ids(response)
    if teacher is not None and len(teacher) != len(response):
        raise ValueError(f"a teacher of {len(teacher)} positions for a response of "
                         f"{len(response)} tokens")
    return _ids(prompt), response, teacher


__all__ = ["DraftTrainer", "TrainReport", "TrainSettings"]
