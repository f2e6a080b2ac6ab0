"""The history window's one rule: a prompt's responses of its last K epochs.

Drafting keeps, per prompt (keyed by `prompt_hash` of its token ids, as the store, the
index and the drafter all key it), the responses of the last K epochs the prompt was seen
in (`spec.history_epochs`). The history store's reads, the index's build and load, and the
drafter's window all cut with `last_epochs`.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def last_epochs(rows: Sequence[T], k: int, epoch: Callable[[T], int] = attrgetter("epoch")
                ) -> list[T]:
    """The rows of the newest `k` distinct epochs among `rows` (one prompt's), in their
    order. k >= 1."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    epochs = sorted({epoch(r) for r in rows})
    if len(epochs) <= k:
        return list(rows)
    keep = set(epochs[-k:])
    return [r for r in rows if epoch(r) in keep]


__all__ = ["last_epochs"]
