"""The targets of the draft model's training loss (`pipeline.drafting.draft_train`),
batch by batch:

- `batch_targets`: a batch's response positions as soft targets (the teacher's k tokens,
  renormalised) where an example has a `Teacher`, else as the sampled token;
- `Vocab`, `in_vocab`, `kept`: the same restricted to a draft vocabulary, the softmax the
  draft drafts from (a teacher's tokens outside it dropped and the rest renormalised, a
  position with no target inside it not trained on), as EAGLE-3 trains its draft over its
  vocabulary;
- `weight_of`: the summed weight of the positions trained on, a weighted mean's
  denominator;
- `pieces`: a minibatch cut into pieces of bounded padded size whose gradients add up.

An example is (token ids, first response position, weight, `Teacher` or None).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.train.teacher import soft_targets


@dataclass(frozen=True)
class Vocab:
    """A draft vocabulary: its token ids (ascending, where the model is) and, per token
    id, its column among them (-1: outside it), on the CPU."""

    ids: torch.Tensor
    column: torch.Tensor


def kept(example, column: torch.Tensor) -> torch.Tensor:
    """Per response position of an example: whether it has a target in the vocabulary
    (its sampled token, or with a teacher any of the teacher's k tokens)."""
    seq, start, _, teacher = example
    if teacher is None:
        return column[seq[start:].long()] >= 0
    return (column[teacher.ids[:len(seq) - start].long()] >= 0).any(-1)


def weight_of(examples, vocab: Vocab | None = None) -> float:
    """The summed weight of the examples' response tokens (each of an example's tokens
    weighs its weight; with a vocabulary, those with a target in it): the denominator of
    their weighted mean loss."""
    if vocab is None:
        return sum(float(w) * (len(seq) - start) for seq, start, w, _ in examples)
    return sum(float(e[2]) * int(kept(e, vocab.column).sum()) for e in examples)


def in_vocab(column: torch.Tensor, sampled: torch.Tensor, soft):
    """Response positions' targets restricted to a vocabulary: (which positions keep a
    target in it, the kept positions' hard targets as columns, or their soft targets as
    columns and probabilities renormalised over the teacher's tokens inside it)."""
    if soft is None:
        got = column[sampled]
        keep = got >= 0
        return keep, got[keep], None
    ids, probs = soft
    got = column[ids]
    inside = got >= 0
    keep = inside.any(-1)
    probs = probs * inside
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-30)
    return keep, None, (got.clamp(min=0)[keep], probs[keep])


def batch_targets(batch, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Soft targets (token ids [P, k] int64, probabilities [P, k]) of the batch's response
    positions in order (`sampled`: their sampled tokens, P of them): the teacher's k
    tokens renormalised where an example has one, the sampled token with probability 1
    (and k - 1 zeros) where it has none; None where no example has a teacher."""
    ks = {t.ids.shape[1] for *_, t in batch if t is not None}
    if not ks:
        return None
    if len(ks) > 1:
        raise ValueError(f"teachers of different k in one batch: {sorted(ks)}")
    k = ks.pop()
    parts_ids, parts_p, at = [], [], 0
    for seq, start, _, t in batch:
        n = len(seq) - start
        if t is None:
            ids = sampled[at:at + n, None].expand(n, k)
            p = torch.zeros(n, k)
            p[:, 0] = 1.0
        else:
            ids, p = t.ids[:n].long(), soft_targets(t.cut(n))
        parts_ids.append(ids)
        parts_p.append(p)
        at += n
    return torch.cat(parts_ids), torch.cat(parts_p)


def target_rows(targets, start: int, stop: int):
    """Rows start..stop of hard targets [P] or soft ones (ids [P, k], probabilities)."""
    if isinstance(targets, tuple):
        return tuple(x[start:stop] for x in targets)
    return targets[start:stop]


def pieces(batch: list, limit: int) -> list[list]:
    """`batch` (examples with their token ids first) in order, cut into consecutive pieces
    whose padded size (rows x the longest row) is at most `limit` tokens; a row longer
    than `limit` is a piece of its own."""
    out, width = [[]], 0
    for example in batch:
        wider = max(width, len(example[0]))
        if out[-1] and wider * (len(out[-1]) + 1) > limit:
            out.append([])
            wider = len(example[0])
        out[-1].append(example)
        width = wider
    return out if out[-1] else []


__all__ = ["Vocab", "batch_targets", "in_vocab", "kept", "pieces", "target_rows", "weight_of"]
