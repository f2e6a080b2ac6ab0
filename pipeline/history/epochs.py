"""The history window's one rule: a prompt's responses of its last K epochs.

Drafting keeps, per prompt (keyed by `prompt_hash` of its token ids, as the store, the
index and the drafter all key it), the responses of the last K epochs the prompt was seen
in (`spec.history_epochs`). The history store's reads, the index's build and load, and the
drafter's window all cut with `last_epochs`; the placement's length predictor averages
over `newest_epochs`.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Callable, Iterable, Sequence, TypeVar

T = TypeVar("T")


def newest_epochs(epochs: Iterable[int], k: int) -> list[int]:
    """The newest `k` distinct epochs among `epochs`, oldest first. k >= 1."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return sorted(set(epochs))[-k:]


def last_epochs(rows: Sequence[T], k: int, epoch: Callable[[T], int] = attrgetter("epoch")
                ) -> list[T]:
    """The rows of the newest `k` distinct epochs among `rows` (one prompt's), in their
    order. k >= 1."""
    epochs = {epoch(r) for r in rows}
    keep = newest_epochs(epochs, k)
    if len(keep) == len(epochs):
        return list(rows)
    kept = set(keep)
    return [r for r in rows if epoch(r) in kept]


__all__ = ["last_epochs", "newest_epochs"]
